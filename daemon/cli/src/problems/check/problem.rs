//! One problem folder through every check: `ProblemSpec::load_dir` (the schema, names,
//! tensors, tolerance, references, seeds, scratch, baselines, file rules), then what
//! needs the folder or the sources: the name is the folder's, the roofline's bytes fit the
//! tensors, a torch reference is a KernelBench module, and each reference and seed kernel
//! against its plan, its annotations and its language's source rules.

use std::fmt;
use std::path::Path;

use kiln_types::{Candidate, KernelSource, ProblemError, ProblemSpec};
use serde::Serialize;

use super::{Issue, cuda_source, knobs, launches, signature, triton};

/// What is wrong, in which file of the problem folder, at which line if known.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Finding {
    /// The file, relative to the problem folder (`problem.toml`, `seed.cu`).
    pub file: String,
    /// 1-based line.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub line: Option<usize>,
    /// What is wrong.
    pub message: String,
}

impl Finding {
    fn new(file: &str, issue: Issue) -> Finding {
        Finding {
            file: file.to_string(),
            line: issue.line,
            message: issue.message,
        }
    }
}

impl fmt::Display for Finding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.line {
            Some(line) => write!(f, "{}:{line}: {}", self.file, self.message),
            None => write!(f, "{}: {}", self.file, self.message),
        }
    }
}

const SPEC_FILE: &str = "problem.toml";

/// Everything wrong with the problem in `dir` (empty: it passes).
pub fn check(dir: &Path) -> Vec<Finding> {
    let spec = match ProblemSpec::load_dir(dir) {
        Ok(spec) => spec,
        Err(e) => return vec![load_error(e)],
    };
    let spec_issue = |message: String| Finding::new(SPEC_FILE, Issue::new(message));
    let mut out = Vec::new();
    if let Some(folder) = folder_name(dir)
        && folder != spec.name
    {
        out.push(spec_issue(format!(
            "name {:?} differs from the folder's name {folder:?}",
            spec.name
        )));
    }
    if let Some(m) = roofline(&spec) {
        out.push(spec_issue(m));
    }
    if let Some(t) = &spec.reference.torch {
        for needle in ["class Model", "def forward"] {
            if !t.source.contains(needle) {
                out.push(Finding::new(
                    &t.file,
                    Issue::new(format!(
                        "[reference.torch]: no `{needle}` (KernelBench's format)"
                    )),
                ));
            }
        }
    }
    for (table, key, ks, candidate) in kernel_sources(&spec) {
        for m in launches::check(&spec, &candidate) {
            out.push(spec_issue(format!("{table} {m}")));
        }
        out.extend(kernel_source(&table, key, ks));
    }
    out
}

/// The reference and seed kernels: table name (`[seed.cuda]`), backend or language key,
/// the source, and the source as a candidate.
fn kernel_sources(spec: &ProblemSpec) -> Vec<(String, &str, &KernelSource, Candidate)> {
    let references = spec.reference.kernels().filter_map(|(b, ks)| {
        let c = spec.reference_candidate(b)?;
        Some((format!("[reference.{}]", b.as_str()), b.as_str(), ks, c))
    });
    let seeds = spec.seed.iter().filter_map(|(key, ks)| {
        let c = spec.seed_candidate(key)?;
        Some((format!("[seed.{key}]"), key.as_str(), ks, c))
    });
    references.chain(seeds).collect()
}

/// The source rules of one kernel source, by its language.
fn kernel_source(table: &str, key: &str, ks: &KernelSource) -> Vec<Finding> {
    let (file, src) = (ks.file.as_str(), ks.source.as_str());
    let mut issues = knobs::check(src, &ks.launches, key == "triton");
    let launch_issues = match key {
        "cuda" => {
            issues.extend(cuda_source::check(src));
            signature::check(src, &ks.launches, true)
        }
        "host" => signature::check(src, &ks.launches, false),
        "triton" => {
            let (funcs, module_issues) = triton::module(src);
            issues.extend(module_issues);
            // A source that does not parse has no functions to hold the launches against.
            funcs.map_or_else(Vec::new, |f| triton::check_launches(&f, &ks.launches))
        }
        _ => Vec::new(), // load_dir refuses other keys
    };
    let mut out: Vec<Finding> = issues.into_iter().map(|i| Finding::new(file, i)).collect();
    for (i, issue) in launch_issues {
        let kernel = ks.launches.get(i).map_or("", |l| l.kernel.as_str());
        let message = format!("{table} launches[{i}] ({kernel}): {}", issue.message);
        out.push(Finding::new(
            file,
            Issue {
                line: issue.line,
                message,
            },
        ));
    }
    out
}

/// `load_dir`'s refusal as a finding in the file it concerns.
fn load_error(e: ProblemError) -> Finding {
    match e {
        ProblemError::Read { path, source } => {
            let file = Path::new(&path)
                .file_name()
                .map_or(path.clone(), |f| f.to_string_lossy().into_owned());
            Finding::new(&file, Issue::new(format!("cannot read: {source}")))
        }
        ProblemError::Parse(text) => Finding::new(SPEC_FILE, toml_error(&text)),
        ProblemError::Invalid { message, .. } => Finding::new(SPEC_FILE, Issue::new(message)),
    }
}

/// A toml error's text on one line: `TOML parse error at line L, column C`, a snippet,
/// then the message.
fn toml_error(text: &str) -> Issue {
    let mut lines = text.lines();
    let first = lines.next().unwrap_or_default();
    let Some(at) = first.strip_prefix("TOML parse error at line ") else {
        return Issue::new(text.lines().collect::<Vec<_>>().join(" "));
    };
    let line = at.split(',').next().and_then(|n| n.trim().parse().ok());
    // The snippet: a gutter line, the line itself, the caret line.
    let message: Vec<&str> = lines.skip(3).collect();
    Issue {
        line,
        message: message.join(" "),
    }
}

/// The folder's own name (of the folder a `.` or `..` stands for, too).
pub fn folder_name(dir: &Path) -> Option<String> {
    let name = match dir.file_name() {
        Some(n) => n.to_os_string(),
        None => dir.canonicalize().ok()?.file_name()?.to_os_string(),
    };
    Some(name.to_string_lossy().into_owned())
}

/// `min_bytes` above the bytes of all tensors together would put the floor above what the
/// best kernel has to move, and refuse honest times.
fn roofline(spec: &ProblemSpec) -> Option<String> {
    let total: u128 = spec
        .tensors
        .iter()
        .map(|t| u128::from(t.elems()) * u128::from(t.dtype.size()))
        .sum();
    let min = spec.roofline.min_bytes;
    (u128::from(min) > total).then(|| {
        format!(
            "roofline.min_bytes {min} is more than all tensors together ({total} bytes): the \
             floor must never exceed what the best kernel has to move"
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn toml_errors_keep_their_line_and_message() {
        let err = ProblemSpec::from_toml("name = \"x\"\nbogus = 1\n").expect_err("unknown key");
        let ProblemError::Parse(text) = err else {
            panic!("a parse error: {err}");
        };
        let issue = toml_error(&text);
        assert_eq!(issue.line, Some(2), "{text}");
        assert!(issue.message.contains("unknown field `bogus`"), "{issue:?}");
        assert!(!issue.message.contains('|'), "{issue:?}");
        assert_eq!(toml_error("plain\nmessage").message, "plain message");
    }

    #[test]
    fn roofline_bytes_are_bounded_by_the_tensors() {
        let text = "name = \"r\"\n[[tensor]]\nname = \"y\"\ndtype = \"f16\"\nshape = [8]\nrole = \"output\"\n\
                    [tolerance]\natol = 0.0\nrtol = 0.0\n[reference.host]\nfile = \"r.c\"\n\
                    launches = [{ kernel = \"r\", args = [\"y\"] }]\n[roofline]\nmin_bytes = 16\n";
        let spec = ProblemSpec::from_toml(text).expect("parses");
        assert_eq!(roofline(&spec), None);
        let spec = ProblemSpec::from_toml(&text.replace("= 16", "= 17")).expect("parses");
        let m = roofline(&spec).expect("too many bytes");
        assert!(
            m.contains("min_bytes 17 is more than all tensors together (16 bytes)"),
            "{m}"
        );
    }

    #[test]
    fn folder_names_resolve_dots() {
        assert_eq!(
            folder_name(Path::new("problems/vecadd-4096")).as_deref(),
            Some("vecadd-4096")
        );
        let here = std::env::current_dir().expect("cwd");
        let want = here.file_name().map(|n| n.to_string_lossy().into_owned());
        assert_eq!(folder_name(Path::new(".")), want);
    }

    #[test]
    fn findings_print_file_line_and_message() {
        let f = Finding::new("seed.cu", Issue::at(3, "x".into()));
        assert_eq!(f.to_string(), "seed.cu:3: x");
        assert_eq!(
            Finding::new("problem.toml", Issue::new("y".into())).to_string(),
            "problem.toml: y"
        );
    }
}
