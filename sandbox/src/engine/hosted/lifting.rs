//! What lifting came to, after a hosted file's evaluation on the GPU (issue 29): the two
//! forwards its runner recorded ([`super::gpu::HostedGpu::run_untimed`]) and the device
//! sources its compile step read from its text ([`super::build`]) go through
//! [`super::lift::lift`]; the outcome goes into the evaluation's telemetry
//! ([`kiln_types::lift::LiftOutcome`]), where kilnd finds the candidate to queue.

use kiln_types::lift::LiftOutcome;
use kiln_types::{ProblemSpec, Verdict};

use super::artifact;
use super::lift::{self, DeviceSources, Recording};

/// The outcome for a file whose hosted evaluation ended in `verdict`, from its artifact
/// and its runner's recordings (`None`: fewer than two were taken).
pub fn outcome(
    problem: &ProblemSpec,
    artifact: &[u8],
    recordings: Option<(&serde_json::Value, &serde_json::Value)>,
    verdict: Verdict,
) -> LiftOutcome {
    let not = |code: &str, reason: String| LiftOutcome::NotLifted {
        code: code.into(),
        reason,
    };
    if verdict != Verdict::Ok {
        return not(
            "not_ok",
            format!("the hosted verdict is {verdict}: only a correct file is lifted"),
        );
    }
    let Some((first, second)) = recordings else {
        return not(
            "not_recorded",
            "the runner did not record two forwards (too few correctness runs)".into(),
        );
    };
    let device = match artifact::unpack(artifact) {
        Ok(u) => u.device,
        Err(e) => return not("no_device_sources", e),
    };
    if device.is_empty() {
        return not(
            "no_device_sources",
            "the compile step read no load_inline CUDA source from the file (see its compile \
             log): only a file's own load_inline kernels are lifted so far"
                .into(),
        );
    }
    let parsed = DeviceSources::parse(device).and_then(|s| {
        let a = Recording::parse(&first.to_string())?;
        let b = Recording::parse(&second.to_string())?;
        Ok((s, a, b))
    });
    let (sources, a, b) = match parsed {
        Ok(p) => p,
        Err(r) => return not(r.code(), r.to_string()),
    };
    if let Some(e) = &sources.error {
        return not(
            "no_device_sources",
            format!("the file's device sources could not be read: {e}"),
        );
    }
    match lift::lift(problem, &sources.sources, &a, &b) {
        Ok(l) => {
            let candidate = l.candidate(&problem.name, "");
            if let Err(e) = candidate.validate() {
                return not(
                    "invalid_plan",
                    format!("the lifted candidate is not a valid contract candidate: {e}"),
                );
            }
            LiftOutcome::Lifted {
                candidate_id: candidate.content_hash(),
                candidate: Box::new(candidate),
                notes: l.notes,
            }
        }
        Err(r) => not(r.code(), r.to_string()),
    }
}
