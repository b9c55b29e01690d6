//! Whether a problem fits this machine's GPU lanes: its device memory
//! (`ProblemSpec::device_memory`) against the smallest GPU that has a cuda lane. Checked
//! when a problem is registered and when a cuda candidate is submitted, so that a problem
//! too large for the GPU is refused with the numbers, never accepted and failed later.

use kiln_types::memory::{USABLE_FRACTION, gib};
use kiln_types::{BackendKind, ProblemSpec};

use super::{ApiError, AppState};

/// L2 assumed for the flush buffer when the GPU's is not known (the largest of current
/// data-centre GPUs, rounded up).
const L2_BYTES: u64 = 128 << 20;

/// The smallest memory of a GPU with a cuda lane here, if any lane's GPU is known.
fn smallest_lane_gpu(s: &AppState) -> Option<u64> {
    let backends: Vec<_> = s.sched.backends.values().cloned().collect();
    let lanes = crate::backends::lanes::lane_table(&backends, &s.facts.gpu);
    s.facts
        .gpu
        .gpus
        .iter()
        .filter(|g| {
            lanes.iter().any(|l| {
                l.backend == BackendKind::Cuda && Some(l.label.as_str()) == g.uuid.as_deref()
            })
        })
        .filter_map(|g| g.memory_total_bytes)
        .min()
}

/// The refusal of a problem whose evaluation cannot fit a GPU of `gpu_bytes`, or `None`.
pub fn refusal(spec: &ProblemSpec, gpu_bytes: u64) -> Option<String> {
    let need = spec.device_memory(L2_BYTES);
    (!need.fits(gpu_bytes)).then(|| {
        format!(
            "problem {} needs about {} of device memory on a cuda lane; the GPU here has {} \
             (at most {:.0} % of it is planned for one evaluation)",
            spec.name,
            need.describe(),
            gib(gpu_bytes),
            USABLE_FRACTION * 100.0
        )
    })
}

/// Refuses (422 `problem_too_large`) a problem that cannot fit this machine's smallest
/// lane GPU; `Ok` when it fits or when there is no cuda lane.
pub fn check(s: &AppState, spec: &ProblemSpec) -> Result<(), ApiError> {
    if !spec.backends().contains(&BackendKind::Cuda) {
        return Ok(());
    }
    match smallest_lane_gpu(s).and_then(|gpu| refusal(spec, gpu)) {
        Some(message) => Err(ApiError::new(
            axum::http::StatusCode::UNPROCESSABLE_ENTITY,
            "problem_too_large",
            message,
        )),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A problem of 2 × 6 GiB with a torch reference fits an H200 and is refused on a
    /// 24 GiB GPU, with its parts and the GPU's size in the message.
    #[test]
    fn the_refusal_names_the_parts_and_the_gpu() {
        let mut spec = crate::store::sample_spec("big");
        for t in &mut spec.tensors {
            t.shape = vec![4096, 393216];
        }
        assert_eq!(refusal(&spec, 141 << 30), None);
        let msg = refusal(&spec, 24 << 30).expect("refused");
        assert!(msg.contains("problem big needs about"), "{msg}");
        assert!(msg.contains("the GPU here has 24.0 GiB"), "{msg}");
        assert!(msg.contains("kept copies of the outputs"), "{msg}");
    }
}
