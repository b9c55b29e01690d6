//! The rules for what a Triton candidate's module may hold, kept as data in one file
//! (`triton_rules.json`, beside this module) so that every reader of Triton sources goes
//! by the same lists:
//!
//! - kiln's compile driver (`sandbox/src/engine/triton/driver.py`), which refuses a
//!   candidate before any of it runs;
//! - the hosted extractor (`sandbox/hosted/kiln_extract.py`), which reads a published
//!   file's `@triton.jit` functions into a candidate's source;
//! - `kiln problems check` (`daemon/cli/src/problems/check/triton.rs`), which reads a
//!   problem's Triton seed without running Python.
//!
//! The two scripts are trusted Python run in a jail: kiln-worker writes [`RULES_JSON`]
//! beside each of them as [`RULES_FILE`], the way it writes the scripts themselves, and
//! each script loads the file from its own folder. The CLI reads [`TritonRules::get`].
//!
//! The rules are names; how a name is matched (by identity against the real triton
//! package in the driver, by spelling in the extractor and the CLI) is each reader's.

use std::sync::OnceLock;

use serde::Deserialize;

/// The rules as written: what kiln-worker writes beside the scripts that read them.
pub const RULES_JSON: &str = include_str!("triton_rules.json");

/// The rules' file name beside a script that reads them.
pub const RULES_FILE: &str = "triton_rules.json";

/// The rules for a Triton candidate's module (`triton_rules.json`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TritonRules {
    /// What the file is, for its readers (JSON has no comments).
    pub about: String,
    /// Modules that may be imported by exactly this name (`import triton`).
    pub import_modules: Vec<String>,
    /// Modules that may be imported with their submodules (`triton.language`,
    /// `triton.language.extra.libdevice`); `from` them any public name may come.
    pub import_trees: Vec<String>,
    /// What `from triton import NAME` may bring in (and `triton.NAME` may reach).
    pub from_triton: Vec<String>,
    /// The keyword arguments `@triton.jit(...)` takes, each with literal values only.
    pub jit_keywords: Vec<String>,
    /// Decorators of a jit function that hold a launch configuration (the launch plan's):
    /// refused in a candidate, removed by the extractor.
    pub config_decorators: Vec<String>,
    /// Python builtins a kernel may name (Triton's code generator understands them and
    /// they reach nothing else).
    pub kernel_builtins: Vec<String>,
    /// Builtin types a jit function's parameter may be annotated with.
    pub annotation_builtins: Vec<String>,
    /// Attributes never followed inside a kernel: a JITFunction's Python-side machinery.
    pub jit_internals: Vec<String>,
    /// Python syntax (`ast` class names) not allowed inside a jit function; a name the
    /// running Python does not have (`TryStar` before 3.11) is skipped.
    pub kernel_forbidden: Vec<String>,
}

impl TritonRules {
    /// Reads a rules file's text.
    pub fn parse(json: &str) -> Result<Self, serde_json::Error> {
        serde_json::from_str(json)
    }

    /// The rules built into this kiln ([`RULES_JSON`]).
    pub fn get() -> &'static TritonRules {
        static RULES: OnceLock<TritonRules> = OnceLock::new();
        RULES.get_or_init(|| {
            // A test below reads the same text: it cannot fail in a build that passed.
            Self::parse(RULES_JSON).expect("triton_rules.json is valid")
        })
    }

    /// True if `module` may be imported: one of [`Self::import_modules`], or one of
    /// [`Self::import_trees`] or a submodule of one.
    pub fn importable(&self, module: &str) -> bool {
        self.import_modules.iter().any(|m| m == module)
            || self.import_trees.iter().any(|t| {
                module
                    .strip_prefix(t.as_str())
                    .is_some_and(|rest| rest.is_empty() || rest.starts_with('.'))
            })
    }

    /// True if `from triton import NAME` may bring in `name`.
    pub fn from_triton_allows(&self, name: &str) -> bool {
        self.from_triton.iter().any(|n| n == name)
    }

    /// True if `@triton.jit(...)` takes the keyword `name`.
    pub fn jit_keyword(&self, name: &str) -> bool {
        self.jit_keywords.iter().any(|n| n == name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_built_in_rules_parse_and_match_modules_by_tree() {
        let r = TritonRules::get();
        assert!(r.importable("triton"));
        assert!(r.importable("triton.language"));
        assert!(r.importable("triton.language.extra.libdevice"));
        for no in ["triton.runtime", "triton.languagex", "torch", "os", ""] {
            assert!(!r.importable(no), "{no}");
        }
        assert!(r.from_triton_allows("cdiv") && !r.from_triton_allows("autotune"));
        assert!(r.jit_keyword("noinline") && !r.jit_keyword("launch_hook"));
    }

    #[test]
    fn every_list_is_unique_and_unknown_fields_are_refused() {
        let r = TritonRules::get();
        for list in [
            &r.import_modules,
            &r.import_trees,
            &r.from_triton,
            &r.jit_keywords,
            &r.config_decorators,
            &r.kernel_builtins,
            &r.annotation_builtins,
            &r.jit_internals,
            &r.kernel_forbidden,
        ] {
            let mut sorted = list.clone();
            sorted.sort();
            sorted.dedup();
            assert_eq!(sorted.len(), list.len(), "{list:?}");
            assert!(!list.is_empty());
        }
        let mut v: serde_json::Value = serde_json::from_str(RULES_JSON).expect("json");
        v["typo"] = serde_json::json!([]);
        assert!(TritonRules::parse(&v.to_string()).is_err());
    }
}
