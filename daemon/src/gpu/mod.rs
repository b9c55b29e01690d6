//! GPUs as NVML sees them: the inventory shown by `/v1/info` and `kiln devices`, where a
//! GPU is named by its NVML index (as `nvidia-smi` numbers it) or its UUID.
//!
//! NVML is loaded at run time (nvml-wrapper); on a machine without the driver the
//! inventory is empty and says why. Nothing here changes a GPU's settings; the clock
//! policy (`observe`, or `lock` around evaluations) is in [`clocks`]; the libraries GPU
//! workers may load (cuBLAS, cuDNN) are found by [`libs`]; which GPUs get a lane
//! (`[gpu] devices`) is decided by [`selection`].

pub mod clocks;
pub mod libs;
pub mod selection;

use nvml_wrapper::Nvml;
use nvml_wrapper::enum_wrappers::device::Clock;
use serde::Serialize;

/// One GPU.
#[derive(Debug, Clone, Serialize)]
pub struct GpuInfo {
    /// NVML index.
    pub index: u32,
    /// Marketing name, e.g. `NVIDIA H200`.
    pub name: String,
    /// UUID.
    pub uuid: Option<String>,
    /// PCI bus id.
    pub pci_bus_id: Option<String>,
    /// Total memory, bytes.
    pub memory_total_bytes: Option<u64>,
    /// Compute capability, `major.minor`.
    pub compute_capability: Option<String>,
    /// Current SM clock, MHz.
    pub sm_clock_mhz: Option<u32>,
    /// Maximum SM clock, MHz.
    pub sm_clock_max_mhz: Option<u32>,
    /// Current memory clock, MHz.
    pub mem_clock_mhz: Option<u32>,
    /// Maximum memory clock, MHz.
    pub mem_clock_max_mhz: Option<u32>,
}

/// What NVML reported.
#[derive(Debug, Clone, Serialize)]
pub struct GpuInventory {
    /// GPUs found (empty when NVML is absent).
    pub gpus: Vec<GpuInfo>,
    /// Driver version.
    pub driver_version: Option<String>,
    /// CUDA version the driver supports, e.g. `13.0`.
    pub cuda_driver_version: Option<String>,
    /// Why the list is empty, when NVML could not be used.
    pub error: Option<String>,
}

impl GpuInventory {
    /// The GPU named `name`: its NVML index (`"1"`, as `nvidia-smi` and `kiln devices`
    /// number GPUs) or its UUID (`GPU-…`, `MIG-…`).
    pub fn find(&self, name: &str) -> Option<&GpuInfo> {
        let name = name.trim();
        self.gpus.iter().find(|g| {
            g.uuid.as_deref() == Some(name) || name.parse::<u32>().is_ok_and(|i| i == g.index)
        })
    }

    /// The GPUs as `0 GPU-…, 1 GPU-…`, for messages; why there are none otherwise.
    pub fn describe(&self) -> String {
        if self.gpus.is_empty() {
            return format!(
                "none ({})",
                self.error.as_deref().unwrap_or("NVML lists no GPU")
            );
        }
        self.gpus
            .iter()
            .map(|g| format!("{} {}", g.index, g.uuid.as_deref().unwrap_or("(no UUID)")))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// An inventory of GPUs of these models (NVML indices 0.., UUIDs `GPU-fake-0`..), driver
/// 580.159.04, for tests.
#[cfg(test)]
pub(crate) fn fake_inventory(models: &[&str]) -> GpuInventory {
    GpuInventory {
        gpus: models
            .iter()
            .enumerate()
            .map(|(i, m)| GpuInfo {
                index: i as u32,
                name: (*m).to_string(),
                uuid: Some(format!("GPU-fake-{i}")),
                pci_bus_id: Some(format!("00000000:{:02X}:00.0", 0x18 + i)),
                memory_total_bytes: Some(141 << 30),
                compute_capability: Some("9.0".into()),
                sm_clock_mhz: None,
                sm_clock_max_mhz: None,
                mem_clock_mhz: None,
                mem_clock_max_mhz: None,
            })
            .collect(),
        driver_version: Some("580.159.04".into()),
        cuda_driver_version: Some("13.0".into()),
        error: None,
    }
}

/// Reads the inventory; never fails, an absent NVML is reported in `error`.
pub fn inventory() -> GpuInventory {
    let nvml = match Nvml::init() {
        Ok(n) => n,
        Err(e) => {
            return GpuInventory {
                gpus: Vec::new(),
                driver_version: None,
                cuda_driver_version: None,
                error: Some(format!("NVML is not available: {e}")),
            };
        }
    };
    let count = match nvml.device_count() {
        Ok(n) => n,
        Err(e) => {
            return GpuInventory {
                gpus: Vec::new(),
                driver_version: nvml.sys_driver_version().ok(),
                cuda_driver_version: None,
                error: Some(format!("NVML device count failed: {e}")),
            };
        }
    };
    let mut gpus = Vec::new();
    for index in 0..count {
        let Ok(d) = nvml.device_by_index(index) else {
            continue;
        };
        gpus.push(GpuInfo {
            index,
            name: d.name().unwrap_or_else(|e| format!("unknown ({e})")),
            uuid: d.uuid().ok(),
            pci_bus_id: d.pci_info().ok().map(|p| p.bus_id),
            memory_total_bytes: d.memory_info().ok().map(|m| m.total),
            compute_capability: d
                .cuda_compute_capability()
                .ok()
                .map(|c| format!("{}.{}", c.major, c.minor)),
            sm_clock_mhz: d.clock_info(Clock::SM).ok(),
            sm_clock_max_mhz: d.max_clock_info(Clock::SM).ok(),
            mem_clock_mhz: d.clock_info(Clock::Memory).ok(),
            mem_clock_max_mhz: d.max_clock_info(Clock::Memory).ok(),
        });
    }
    GpuInventory {
        gpus,
        driver_version: nvml.sys_driver_version().ok(),
        cuda_driver_version: nvml
            .sys_cuda_driver_version()
            .ok()
            .map(|v| format!("{}.{}", v / 1000, (v % 1000) / 10)),
        error: None,
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn inventory_never_fails_and_explains_an_empty_list() {
        let inv = super::inventory();
        assert!(!inv.gpus.is_empty() || inv.error.is_some());
    }

    #[test]
    fn gpus_are_found_by_nvml_index_or_uuid() {
        let inv = super::fake_inventory(&["NVIDIA H200", "NVIDIA H100"]);
        assert_eq!(inv.find("1").map(|g| g.name.as_str()), Some("NVIDIA H100"));
        assert_eq!(inv.find(" GPU-fake-0 ").map(|g| g.index), Some(0));
        for unknown in ["2", "-1", "GPU-fake", "gpu-fake-0", ""] {
            assert!(inv.find(unknown).is_none(), "{unknown:?}");
        }
        assert_eq!(inv.describe(), "0 GPU-fake-0, 1 GPU-fake-1");
        let none = super::GpuInventory {
            gpus: Vec::new(),
            driver_version: None,
            cuda_driver_version: None,
            error: Some("NVML is not available: x".into()),
        };
        assert_eq!(none.describe(), "none (NVML is not available: x)");
    }
}
