//! The structured summary the bundled strategies return (`{best, message}` with this
//! document as `message`): the types live in `kiln_types::summary`, shared with kilnd,
//! which draws them in the search report.

pub use kiln_types::summary::{Cell, Grid, Report, Round, Tried};
