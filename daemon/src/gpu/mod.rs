//! GPUs as NVML sees them: the inventory shown by `/v1/info` and `kiln devices`.
//!
//! NVML is loaded at run time (nvml-wrapper); on a machine without the driver the
//! inventory is empty and says why. Nothing here changes a GPU's settings; the clock
//! policy (`observe`, or `lock` around evaluations) is in [`clocks`]; the libraries GPU
//! workers may load (cuBLAS, cuDNN) are found by [`libs`].

pub mod clocks;
pub mod libs;

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
}
