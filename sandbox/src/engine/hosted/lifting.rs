//! What lifting came to, after a hosted file's evaluation on the GPU (issue 29): the two
//! forwards its runner recorded ([`super::gpu::HostedGpu::run_untimed`]) and the device
//! sources its compile step read from its text ([`super::build`]: its load_inline CUDA and
//! its Triton jit functions) go through [`super::lift::lift_file`] (a `cuda` candidate, or
//! a `triton` one when the forward launched Triton kernels); the outcome goes into the
//! evaluation's telemetry ([`kiln_types::lift::LiftOutcome`]), where kilnd finds the
//! candidate to queue.

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
            "the compile step read no device source from the file (see its compile log): only \
             a file's own load_inline or Triton kernels are lifted"
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
    // The CUDA sources' error does not stand in the way of a forward that launched Triton
    // kernels, when the file's Triton source was read.
    let triton = !(a.triton.is_empty() && b.triton.is_empty());
    if let Some(e) = &sources.error
        && !(triton && sources.triton.is_some())
    {
        return not(
            "no_device_sources",
            format!("the file's device sources could not be read: {e}"),
        );
    }
    match lift::lift_file(problem, &sources, &a, &b) {
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

#[cfg(test)]
mod tests {
    use kiln_types::Language;
    use serde_json::{Value, json};

    use super::*;

    const TRITON_SOFTMAX: &str = include_str!("../../../tests/fixtures/lift/triton_softmax.json");

    const SOFTMAX_PROBLEM: &str = include_str!("../../../tests/fixtures/lift/softmax_problem.toml");

    fn run(device: &Value, first: &Value, second: &Value) -> LiftOutcome {
        let problem = ProblemSpec::from_toml(SOFTMAX_PROBLEM).expect("problem");
        let art = artifact::pack("import triton\n", &[], &device.to_string());
        outcome(&problem, &art, Some((first, second)), Verdict::Ok)
    }

    #[test]
    fn lifting_a_triton_forward_gives_a_triton_candidate() {
        let v: Value = serde_json::from_str(TRITON_SOFTMAX).expect("fixture");
        let LiftOutcome::Lifted { candidate, .. } =
            run(&v["device_sources"], &v["first"], &v["second"])
        else {
            panic!("lifted")
        };
        assert_eq!(candidate.language, Language::Triton);
        assert_eq!(candidate.launches[0].kernel, "softmax_kernel");
        // A CUDA source that could not be read does not stand in the way.
        let mut device = v["device_sources"].clone();
        device["error"] = json!("cuda source built at run time (Call)");
        assert!(matches!(
            run(&device, &v["first"], &v["second"]),
            LiftOutcome::Lifted { .. }
        ));
        // Without the Triton source it does, as before.
        device["triton"] = Value::Null;
        let LiftOutcome::NotLifted { code, .. } = run(&device, &v["first"], &v["second"]) else {
            panic!("not lifted")
        };
        assert_eq!(code, "no_device_sources");
    }
}
