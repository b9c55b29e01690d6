//! GPU classes: which lanes' times are comparable.
//!
//! A class is `backend/label`. For cuda the label is `<GPU model>/<driver>/<clock
//! policy>` (two H200s on different drivers, or one with locked clocks and one without,
//! are different classes); for the host backend it is the CPU model. `[cluster] gpu_class`
//! replaces the label (tests, or fleets whose machines differ in ways kiln cannot see).
//! A search is pinned to one class and its candidates are never timed on another.

use std::sync::Arc;

use crate::backends::Backend;
use crate::config::Config;
use crate::gpu::GpuInventory;
use crate::store::LaneClass;
use crate::store::postgres::NodeLane;
use kiln_types::BackendKind;

/// A label part without `/` (which separates the parts) or surrounding space.
fn part(s: &str) -> String {
    let t = s.trim().replace('/', "-");
    if t.is_empty() { "unknown".into() } else { t }
}

/// The CPU's model name, for the host backend's class.
fn cpu_model() -> String {
    match sysinfo::System::new() {
        Ok(mut sys) => {
            sys.refresh_cpu_list(sysinfo::CpuRefreshKind::nothing());
            sys.cpus()
                .first()
                .map(|c| c.brand().to_string())
                .unwrap_or_default()
        }
        Err(_) => String::new(),
    }
}

/// The class of `backend`'s lanes on this node.
pub fn class_of(backend: &dyn Backend, gpu: &GpuInventory, config: &Config) -> (String, String) {
    let name = backend.name();
    if !config.cluster.gpu_class.is_empty() {
        let device = if backend.kind() == BackendKind::Cuda {
            first_gpu(backend, gpu).unwrap_or_else(|| "GPU".into())
        } else {
            "host CPU".into()
        };
        return (
            format!("{name}/{}", part(&config.cluster.gpu_class)),
            device,
        );
    }
    if backend.kind() == BackendKind::Cuda {
        let model = first_gpu(backend, gpu).unwrap_or_default();
        let driver = gpu.driver_version.clone().unwrap_or_default();
        let class = format!(
            "cuda/{}/{}/{}",
            part(&model),
            part(&driver),
            part(&config.gpu.clock_policy)
        );
        return (class, model);
    }
    (format!("{name}/{}", part(&cpu_model())), "host CPU".into())
}

/// The model of the GPU behind the backend's first lane.
fn first_gpu(backend: &dyn Backend, gpu: &GpuInventory) -> Option<String> {
    let label = backend.lane_label(0);
    gpu.gpus
        .iter()
        .find(|g| g.uuid.as_deref() == Some(label.as_str()))
        .or_else(|| gpu.gpus.first())
        .map(|g| g.name.clone())
}

/// This node's lanes: one entry per usable backend, with its class. A node whose GPUs
/// differ in model takes the first GPU's class for all of them (kiln does not split
/// one backend's lanes across classes).
pub fn node_lanes(
    backends: &[Arc<dyn Backend>],
    gpu: &GpuInventory,
    config: &Config,
) -> Vec<NodeLane> {
    let mut out: Vec<NodeLane> = backends
        .iter()
        .filter(|b| b.status().usable)
        .map(|b| {
            let (class, device) = class_of(b.as_ref(), gpu, config);
            NodeLane {
                backend: b.name().to_string(),
                class,
                lanes: b.lanes(),
                device,
            }
        })
        .collect();
    out.sort_by(|a, b| a.backend.cmp(&b.backend));
    if let Some(cuda) = out.iter().find(|l| l.backend == BackendKind::Cuda) {
        let models: std::collections::BTreeSet<&str> =
            gpu.gpus.iter().map(|g| g.name.as_str()).collect();
        if models.len() > 1 {
            tracing::warn!(class = %cuda.class, ?models, "this node's GPUs differ in model; all its cuda lanes claim for the first GPU's class");
        }
    }
    out
}

/// The claim keys of `lanes`.
pub fn claim_keys(lanes: &[NodeLane]) -> Vec<LaneClass> {
    lanes
        .iter()
        .map(|l| LaneClass {
            backend: l.backend.clone(),
            class: l.class.clone(),
            lanes: u32::try_from(l.lanes).unwrap_or(u32::MAX),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_parts_cannot_add_separators() {
        assert_eq!(part(" NVIDIA H100 80GB HBM3 "), "NVIDIA H100 80GB HBM3");
        assert_eq!(part("a/b"), "a-b");
        assert_eq!(part(""), "unknown");
    }
}
