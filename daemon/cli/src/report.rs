//! `kiln search report ID` and `kiln show ID --report`: fetch a report page from kilnd and
//! write it to a file or stdout.

use std::path::Path;

use anyhow::{Context, Result};
use kiln_daemon::client::Client;

/// Fetches the page at `path` and writes it to `out` (stdout when `None`).
pub async fn fetch(client: &Client, path: &str, out: Option<&Path>) -> Result<()> {
    let page = client.get_text(path).await?;
    match out {
        Some(file) => {
            std::fs::write(file, &page)
                .with_context(|| format!("cannot write {}", file.display()))?;
            eprintln!(
                "wrote {} ({} KB); open it in a browser",
                file.display(),
                page.len().div_ceil(1024)
            );
        }
        None => print!("{page}"),
    }
    Ok(())
}
