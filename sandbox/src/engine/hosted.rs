//! Hosted candidates: a KernelBench `ModelNew` file run as written (trust mode `hosted`,
//! docs/security.md). Its python is hostile from its first import, so it runs in a
//! runner process of its own, under the worker's jail plus a filter of its own, and owns
//! nothing that decides: the worker (trusted) draws the inputs and the weights, writes
//! them where the runner reads them, takes the time on its own clock from the command to
//! the runner's answer, stops the runner, and reads and compares the outputs itself.
//!
//! - [`build`]: the compile step, which builds a file's `load_inline` libraries ahead, off
//!   the lane, and [`artifact`], the file and those libraries as one artifact;
//! - [`gch`]: torch's extension header precompiled once (GCC), shown read-only to those
//!   builds;
//! - [`setup`]: the python with torch that runs them, found once by kilnd, and the runner
//!   script (`sandbox/hosted/kiln_hosted.py`) carried inside `kiln-worker`;
//! - [`wrapper`]: `kiln-worker hosted-runner`, which loads the hosted filter and execs
//!   that python (the filter outlives the exec);
//! - [`cpu`]: `modelnew-cpu` on the host backend: the host engine's runner protocol and
//!   shared buffers, with the python runner in place of the C one;
//! - [`gpu`]: `modelnew` on the cuda backend: the runner started over the GPU workspace's
//!   shared tensors, and the time of a forward taken on the worker's clock;
//! - [`gpu_target`]: the contract's target for such a runner (the outputs hashed after
//!   each window, the kernels it claims, lifting);
//! - [`kernels`]: the kernels a forward launched (the runner's claim), sorted into the
//!   file's own and library ones.
//!
//! Here, shared by both engines: [`Hosted`] (the python and the import limit),
//! [`ready_verdict`] (a runner that loaded but cannot run the file), [`load_info`] (its
//! import as the compile step) and [`spawn_echo`] (kiln's own round trip, the overhead).

pub mod artifact;
pub mod build;
pub mod cpu;
pub mod gch;
pub mod gpu;
pub mod gpu_target;
pub mod kernels;
pub mod lift;
pub mod lifting;
pub mod setup;
pub mod wrapper;

use std::path::Path;
use std::time::Duration;

use kiln_types::Verdict;

use crate::engine::host::layout::Layout;
use crate::engine::host::runner::Ready;
use crate::engine::host::runner_ctl::{Runner, RunnerConfig};
use setup::HostedSetup;

/// What an engine (host or cuda) needs to run a hosted candidate.
#[derive(Debug, Clone, Copy)]
pub struct Hosted<'a> {
    /// The python with torch.
    pub setup: &'a HostedSetup,
    /// How long importing the file and building `ModelNew` may take (torch's import and
    /// any `load_inline` or Triton build happen then).
    pub load_timeout: Duration,
}

/// The verdict for a runner that loaded the file but said it cannot run it: `ModelNew`'s
/// parameters and buffers do not match the problem's (`invalid_launch`, naming them), or
/// the file failed to import or build (`runtime_fault`). `None`: ready to run.
pub fn ready_verdict(ready: &Ready) -> Option<(Verdict, String)> {
    if !ready.missing.is_empty() {
        return Some((
            Verdict::InvalidLaunch,
            format!(
                "ModelNew does not match the problem's parameters and buffers: {}",
                ready.missing.join("; ")
            ),
        ));
    }
    ready.error.as_ref().map(|e| {
        (
            Verdict::RuntimeFault,
            format!("the ModelNew file failed to load: {e}"),
        )
    })
}

/// The files a hosted runner starts from, written into `dir` (the evaluation's scratch):
/// kiln's runner script and its recorder beside it (`R` imports it), the candidate file and
/// the libraries its compile step built ([`artifact`]). Returns the candidate's path and
/// the `prebuilt` folder, if any.
pub fn write_files(
    dir: &Path,
    artifact: &[u8],
) -> Result<(std::path::PathBuf, Option<std::path::PathBuf>), String> {
    let unpacked = artifact::unpack(artifact)?;
    std::fs::write(dir.join(setup::SCRIPT_NAME), setup::SCRIPT)
        .map_err(|e| format!("write {}: {e}", setup::SCRIPT_NAME))?;
    // R's recorder, imported by the script from its own folder.
    std::fs::write(dir.join(setup::RECORD_NAME), setup::RECORD)
        .map_err(|e| format!("write {}: {e}", setup::RECORD_NAME))?;
    let candidate = dir.join(setup::CANDIDATE_NAME);
    std::fs::write(&candidate, unpacked.source)
        .map_err(|e| format!("write {}: {e}", setup::CANDIDATE_NAME))?;
    let prebuilt = unpacked.write_libs(dir)?;
    Ok((candidate, prebuilt))
}

/// The compile info of a hosted runner that took `load_ms` to import and build the file.
pub fn load_info(load_ms: f64) -> kiln_types::CompileInfo {
    kiln_types::CompileInfo {
        duration_ms: load_ms,
        log: "hosted: the file imported and ModelNew built by its runner (its load_inline and \
              Triton compiles at import included)"
            .into(),
        ..kiln_types::CompileInfo::default()
    }
}

/// Starts an echo runner (`kiln-worker runner` with no artifact: it answers every command
/// at once). Its round trips are the overhead subtracted from a hosted file's samples: the
/// file's own runner answers `E` too, but a file could slow its `E` to have more taken off
/// its times, so only kiln's process is asked.
pub fn spawn_echo(cfg: &RunnerConfig) -> Result<Runner, String> {
    let cfg = RunnerConfig {
        artifact: Path::new(""),
        ..*cfg
    };
    match Runner::spawn(&cfg, Layout::empty(), Vec::new())? {
        (echo, Ok(r)) if r.error.is_none() => Ok(echo),
        (_, Ok(r)) => Err(format!("the echo runner did not start: {:?}", r.error)),
        (_, Err(end)) => Err(format!("the echo runner did not start: {end:?}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::host::runner::Ready;

    /// The runner starts from its script, the recorder its `R` imports from the script's
    /// folder, and the file: all three written into the evaluation's folder.
    #[test]
    fn the_runner_its_recorder_and_the_file_are_written_side_by_side() {
        let d = tempfile::tempdir().expect("tmp");
        let (candidate, prebuilt) =
            write_files(d.path(), b"class ModelNew: pass\n").expect("written");
        assert_eq!(candidate, d.path().join(setup::CANDIDATE_NAME));
        assert_eq!(prebuilt, None);
        for (name, text) in [
            (setup::SCRIPT_NAME, setup::SCRIPT),
            (setup::RECORD_NAME, setup::RECORD),
        ] {
            let got = std::fs::read_to_string(d.path().join(name)).expect(name);
            assert_eq!(got, text, "{name}");
        }
        assert!(setup::SCRIPT.contains(setup::RECORD_NAME.trim_end_matches(".py")));
    }

    #[test]
    fn a_mismatch_names_the_parameters_and_a_failed_import_is_a_fault() {
        let ready = Ready {
            missing: vec!["no parameter or buffer 'linear.weight'".into()],
            error: Some("state mismatch".into()),
            notes: Vec::new(),
        };
        let (v, m) = ready_verdict(&ready).expect("a verdict");
        assert_eq!(v, Verdict::InvalidLaunch);
        assert!(m.contains("linear.weight"), "{m}");
        let ready = Ready {
            missing: vec![],
            error: Some("ImportError: No module named 'nope'".into()),
            notes: Vec::new(),
        };
        let (v, m) = ready_verdict(&ready).expect("a verdict");
        assert_eq!(v, Verdict::RuntimeFault);
        assert!(m.contains("nope"), "{m}");
        assert!(ready_verdict(&Ready::default()).is_none());
    }
}
