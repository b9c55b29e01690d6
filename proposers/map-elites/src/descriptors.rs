//! Behaviour descriptors and their fixed bins.
//!
//! From the compiled kernel's resources (cuda backend): registers per thread, static
//! shared memory per block, theoretical occupancy and block size, on fixed,
//! hardware-derived bins. The host backend reports no resources; there the descriptors
//! are the knob values (one axis per `@knob`, one bin per value).

use kiln_sdk::search::moves;
use kiln_sdk::{Candidate, Evaluation};
use serde::{Deserialize, Serialize};

/// Where descriptors come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Source {
    /// Compiled kernel resources.
    Resources,
    /// Knob values.
    Knobs,
}

/// Axis names for a source.
pub fn axes(source: Source, seed: &Candidate) -> Vec<String> {
    match source {
        Source::Resources => ["registers", "shared", "occupancy", "block"]
            .map(String::from)
            .to_vec(),
        Source::Knobs => moves::values(&seed.source)
            .into_iter()
            .map(|(k, _)| k)
            .collect(),
    }
}

fn bin(x: f64, edges: &[(f64, &str)], last: &str) -> String {
    edges
        .iter()
        .find(|(e, _)| x <= *e)
        .map_or(last, |(_, n)| n)
        .to_string()
}

/// The cell of a candidate with its evaluation: one bin per axis.
pub fn cell(source: Source, c: &Candidate, e: &Evaluation) -> Vec<String> {
    match source {
        Source::Knobs => {
            let v = moves::values(&c.source);
            if v.is_empty() {
                vec!["all".into()]
            } else {
                v.into_iter().map(|(_, v)| v).collect()
            }
        }
        Source::Resources => {
            let regs = e.resources.iter().map(|r| r.registers).max().unwrap_or(0);
            let smem = e
                .resources
                .iter()
                .map(|r| r.static_shared_bytes)
                .max()
                .unwrap_or(0)
                .max(c.launches.iter().map(|l| l.shared_bytes).max().unwrap_or(0));
            let occ = e
                .resources
                .iter()
                .filter_map(|r| r.occupancy)
                .fold(f64::NAN, f64::min);
            let block = c
                .launches
                .iter()
                .map(|l| u64::from(l.block[0]) * u64::from(l.block[1]) * u64::from(l.block[2]))
                .max()
                .unwrap_or(0);
            vec![
                bin(
                    f64::from(regs),
                    &[
                        (32.0, "<=32"),
                        (64.0, "<=64"),
                        (96.0, "<=96"),
                        (128.0, "<=128"),
                    ],
                    ">128",
                ),
                bin(
                    f64::from(smem),
                    &[
                        (0.0, "0"),
                        (16384.0, "<=16K"),
                        (49152.0, "<=48K"),
                        (102400.0, "<=100K"),
                    ],
                    ">100K",
                ),
                if occ.is_nan() {
                    "-".into()
                } else {
                    bin(
                        occ,
                        &[(0.25, "<=25%"), (0.5, "<=50%"), (0.75, "<=75%")],
                        ">75%",
                    )
                },
                bin(
                    block as f64,
                    &[
                        (64.0, "<=64"),
                        (128.0, "128"),
                        (256.0, "256"),
                        (512.0, "512"),
                    ],
                    "1024",
                ),
            ]
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kiln_sdk::types::verdict::KernelResources;

    #[test]
    fn resource_bins_are_fixed() {
        let c: Candidate = serde_json::from_value(serde_json::json!({
            "problem": "p", "language": "cuda", "source": "__global__ void k() {}",
            "launches": [{"kernel": "k", "grid": [1,1,1], "block": [256,1,1], "args": []}]
        }))
        .expect("candidate");
        let e = Evaluation {
            candidate_id: "x".into(),
            verdict: None,
            message: String::new(),
            median_us: None,
            tier: None,
            resources: vec![KernelResources {
                name: "k".into(),
                registers: 40,
                static_shared_bytes: 20000,
                local_bytes: 0,
                max_threads_per_block: 1024,
                occupancy: Some(0.6),
            }],
            json: "null".into(),
        };
        assert_eq!(
            cell(Source::Resources, &c, &e),
            ["<=64", "<=48K", "<=75%", "256"]
        );
        let h = "// @knob A 1|2\n#define A 2\nvoid k(void) {}\n";
        let mut c2 = c.clone();
        c2.source = h.into();
        assert_eq!(cell(Source::Knobs, &c2, &e), ["2"]);
        assert_eq!(axes(Source::Knobs, &c2), ["A"]);
    }
}
