//! The [`Proposer`] trait, the [`Summary`] it returns, and [`export_proposer!`], which
//! exports a proposer as the component's `run` and stamps the ABI version into the wasm.

use crate::bindings::kiln::proposer::types as wit;

/// How a search ended: the best candidate found and a line for people.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Summary {
    /// The best candidate found, if any.
    pub best: Option<String>,
    /// What was tried, what won.
    pub message: String,
}

impl Summary {
    /// A summary naming the best candidate (if any) with a message.
    pub fn new(best: Option<String>, message: impl Into<String>) -> Self {
        Summary {
            best,
            message: message.into(),
        }
    }
}

/// A search strategy. Implement [`Proposer::run`] and export the type with
/// [`export_proposer!`].
pub trait Proposer {
    /// Runs the search to its end. `config` is the search's `--config` text (JSON by
    /// convention, empty when none was given). Returning `Err` marks the search failed
    /// with that reason.
    fn run(config: &str) -> Result<Summary, String>;
}

/// Glue called by the code [`export_proposer!`] generates.
#[doc(hidden)]
pub fn __run<P: Proposer>(config: String) -> Result<wit::Summary, String> {
    P::run(&config).map(|s| wit::Summary {
        best: s.best,
        message: s.message,
    })
}

/// Exports a [`Proposer`] as the component's `run` function and writes the
/// `kiln:abi-version` custom section (the ABI this SDK speaks) into the plugin.
///
/// Use it once, in the plugin's crate root: `kiln_sdk::export_proposer!(MyStrategy);`.
/// The crate must be a `cdylib` built for `wasm32-wasip2`.
#[macro_export]
macro_rules! export_proposer {
    ($ty:ty) => {
        // The host reads this section before it compiles the plugin and refuses a
        // plugin without it or with an ABI it does not host. It lives in the plugin's
        // own crate (not the SDK's rlib) so the linker always keeps it.
        #[cfg(target_arch = "wasm32")]
        #[unsafe(link_section = "kiln:abi-version")]
        #[used]
        static __KILN_ABI_VERSION: [u8; 6] = $crate::ABI_VERSION_BYTES;

        #[doc(hidden)]
        struct __KilnProposerExport;

        impl $crate::bindings::Guest for __KilnProposerExport {
            fn run(
                config: ::std::string::String,
            ) -> ::std::result::Result<
                $crate::bindings::kiln::proposer::types::Summary,
                ::std::string::String,
            > {
                $crate::__run::<$ty>(config)
            }
        }

        $crate::bindings::__export_proposer_world!(__KilnProposerExport with_types_in $crate::bindings);
    };
}
