//! Which GPUs get a lane: `[gpu] devices` resolved against the GPUs CUDA lists
//! (`kiln_gpu::DeviceFacts`, the ones a worker can use) and NVML's inventory (which numbers
//! GPUs as `nvidia-smi` and `kiln devices` do; CUDA's own ordinals may differ).
//!
//! An empty list selects every GPU CUDA lists. Otherwise each entry is an NVML index or a
//! UUID, and must name exactly one GPU that CUDA lists; an entry naming none, or two
//! entries naming the same GPU, is a [`SelectionError`] (kilnd refuses to start, saying
//! which GPUs there are). Lanes follow NVML's order, so on a host where kiln has every
//! GPU, lane N is `nvidia-smi`'s GPU N.

use kiln_sandbox::kiln_gpu::DeviceFacts;
use thiserror::Error;

use super::GpuInventory;

/// Why `[gpu] devices` cannot be honoured.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum SelectionError {
    /// The entry names no GPU of this host.
    #[error(
        "[gpu] devices names {name:?}, which is not a GPU of this host (GPUs by NVML index and UUID: {found})"
    )]
    Unknown {
        /// The entry.
        name: String,
        /// The GPUs there are.
        found: String,
    },
    /// An index, but NVML (which numbers the GPUs) cannot be read.
    #[error(
        "[gpu] devices names GPU {name} by index, but NVML, which numbers GPUs as nvidia-smi does, cannot be read ({why}): name GPUs by UUID"
    )]
    NoIndex {
        /// The entry.
        name: String,
        /// Why NVML cannot be read.
        why: String,
    },
    /// NVML lists the GPU but CUDA does not (so no worker could use it).
    #[error(
        "[gpu] devices names {name:?} ({uuid}): NVML lists it but CUDA does not (is CUDA_VISIBLE_DEVICES set in kilnd's environment?)"
    )]
    NotVisible {
        /// The entry.
        name: String,
        /// The GPU's UUID.
        uuid: String,
    },
    /// Two entries name one GPU.
    #[error("[gpu] devices names the GPU {uuid} twice ({first:?} and {second:?})")]
    Twice {
        /// The GPU's UUID.
        uuid: String,
        /// The first entry naming it.
        first: String,
        /// The second.
        second: String,
    },
}

/// The GPUs that get a lane, in lane order (see the module docs).
pub fn select<'a>(
    found: &'a [DeviceFacts],
    inventory: &GpuInventory,
    wanted: &[String],
) -> Result<Vec<&'a DeviceFacts>, SelectionError> {
    let nvml_index = |d: &DeviceFacts| {
        inventory
            .gpus
            .iter()
            .find(|g| g.uuid.as_deref() == Some(d.uuid.as_str()))
            .map(|g| g.index)
    };
    let mut chosen: Vec<(&'a DeviceFacts, &str)> = Vec::new();
    if wanted.is_empty() {
        chosen = found.iter().map(|d| (d, "")).collect();
    }
    for name in wanted {
        let name = name.trim();
        let uuid = if name.parse::<u32>().is_ok() {
            if inventory.gpus.is_empty() {
                return Err(SelectionError::NoIndex {
                    name: name.into(),
                    why: inventory
                        .error
                        .clone()
                        .unwrap_or_else(|| "it lists no GPU".into()),
                });
            }
            inventory.find(name).and_then(|g| g.uuid.clone())
        } else {
            Some(name.to_string())
        };
        let device = uuid
            .as_deref()
            .and_then(|u| found.iter().find(|d| d.uuid == u));
        let Some(device) = device else {
            return Err(match uuid.filter(|u| inventory.find(u).is_some()) {
                Some(uuid) => SelectionError::NotVisible {
                    name: name.into(),
                    uuid,
                },
                None => SelectionError::Unknown {
                    name: name.into(),
                    found: known(found, inventory),
                },
            });
        };
        if let Some((_, first)) = chosen.iter().find(|(d, _)| d.uuid == device.uuid) {
            return Err(SelectionError::Twice {
                uuid: device.uuid.clone(),
                first: (*first).to_string(),
                second: name.into(),
            });
        }
        chosen.push((device, name));
    }
    // NVML's order; GPUs NVML does not list (no NVML) after, in CUDA's order.
    chosen.sort_by_key(|(d, _)| (nvml_index(d).unwrap_or(u32::MAX), d.ordinal));
    Ok(chosen.into_iter().map(|(d, _)| d).collect())
}

/// The GPUs of this host for a message: NVML's list, else CUDA's UUIDs.
fn known(found: &[DeviceFacts], inventory: &GpuInventory) -> String {
    if !inventory.gpus.is_empty() {
        return inventory.describe();
    }
    if found.is_empty() {
        return "none".into();
    }
    found
        .iter()
        .map(|d| d.uuid.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::fake_inventory;
    use kiln_sandbox::kiln_gpu::facts::DeviceLimits;

    /// What CUDA lists for the fake inventory's GPUs, in CUDA's order `order` (NVML
    /// indices), which need not be NVML's.
    fn cuda_sees(order: &[usize]) -> Vec<DeviceFacts> {
        order
            .iter()
            .enumerate()
            .map(|(ordinal, nvml)| DeviceFacts {
                ordinal: ordinal as u32,
                name: "NVIDIA H200".into(),
                uuid: format!("GPU-fake-{nvml}"),
                compute_capability: (9, 0),
                arch: "sm_90".into(),
                total_mem_bytes: 141 << 30,
                limits: DeviceLimits::sm90_example(),
            })
            .collect()
    }

    fn uuids(v: &[&DeviceFacts]) -> Vec<String> {
        v.iter().map(|d| d.uuid.clone()).collect()
    }

    fn names(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| (*s).to_string()).collect()
    }

    #[test]
    fn every_gpu_by_default_in_nvml_order() {
        let inv = fake_inventory(&["NVIDIA H200"; 4]);
        // CUDA enumerates fastest first: its ordinals are not nvidia-smi's indices.
        let found = cuda_sees(&[2, 0, 3, 1]);
        let lanes = select(&found, &inv, &[]).expect("all");
        assert_eq!(
            uuids(&lanes),
            ["GPU-fake-0", "GPU-fake-1", "GPU-fake-2", "GPU-fake-3"]
        );
    }

    #[test]
    fn a_subset_by_nvml_index_and_by_uuid() {
        let inv = fake_inventory(&["NVIDIA H200"; 4]);
        let found = cuda_sees(&[2, 0, 3, 1]);
        // "2" is NVML's GPU 2 (CUDA's ordinal 0), not CUDA's ordinal 2.
        let lanes = select(&found, &inv, &names(&["GPU-fake-3", "2"])).expect("subset");
        assert_eq!(uuids(&lanes), ["GPU-fake-2", "GPU-fake-3"]);
        let one = select(&found, &inv, &names(&[" 1 "])).expect("one");
        assert_eq!(uuids(&one), ["GPU-fake-1"]);
    }

    #[test]
    fn unknown_or_repeated_names_are_errors_that_say_what_there_is() {
        let inv = fake_inventory(&["NVIDIA H200"; 2]);
        let found = cuda_sees(&[0, 1]);
        let err = select(&found, &inv, &names(&["0", "4"])).expect_err("no GPU 4");
        assert_eq!(
            err,
            SelectionError::Unknown {
                name: "4".into(),
                found: "0 GPU-fake-0, 1 GPU-fake-1".into()
            }
        );
        assert!(err.to_string().contains("GPU-fake-1"), "{err}");
        assert!(matches!(
            select(&found, &inv, &names(&["GPU-nope"])),
            Err(SelectionError::Unknown { .. })
        ));
        assert_eq!(
            select(&found, &inv, &names(&["1", "GPU-fake-1"])),
            Err(SelectionError::Twice {
                uuid: "GPU-fake-1".into(),
                first: "1".into(),
                second: "GPU-fake-1".into()
            })
        );
    }

    #[test]
    fn a_gpu_cuda_cannot_see_or_an_index_without_nvml() {
        let inv = fake_inventory(&["NVIDIA H200"; 2]);
        let found = cuda_sees(&[1]);
        let err = select(&found, &inv, &names(&["0"])).expect_err("hidden from CUDA");
        assert!(matches!(&err, SelectionError::NotVisible { uuid, .. } if uuid == "GPU-fake-0"));
        assert!(err.to_string().contains("CUDA_VISIBLE_DEVICES"), "{err}");

        let mut no_nvml = fake_inventory(&[]);
        no_nvml.error = Some("NVML is not available".into());
        let found = cuda_sees(&[0, 1]);
        let err = select(&found, &no_nvml, &names(&["1"])).expect_err("index without NVML");
        assert!(err.to_string().contains("by UUID"), "{err}");
        // UUIDs still work, and everything is taken in CUDA's order.
        let by_uuid = select(&found, &no_nvml, &names(&["GPU-fake-1"])).expect("uuid");
        assert_eq!(uuids(&by_uuid), ["GPU-fake-1"]);
        assert_eq!(select(&found, &no_nvml, &[]).expect("all").len(), 2);
    }
}
