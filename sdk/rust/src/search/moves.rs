//! Offline moves over a kernel's `@knob`s: one-knob neighbours within a radius, random
//! assignments (restarts), and applying an assignment to a candidate.

use kiln_types::Candidate;

use crate::knobs::{self, Annotations};
use crate::plugin_host::Rng;

/// `(knob, value)` pairs.
pub type Assignment = Vec<(String, String)>;

/// The knobs of `source` (empty when it has none or they do not parse).
pub fn annotations(source: &str) -> Annotations {
    knobs::parse(source).unwrap_or_default()
}

/// Every single-knob change of `source` whose value lies at most `radius` places from
/// the current one in the knob's list (any value when the current one is not listed).
pub fn neighbours(source: &str, radius: usize) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for k in annotations(source).knobs {
        for (i, v) in k.values.iter().enumerate() {
            let near = match k.current_index {
                Some(c) => i != c && i.abs_diff(c) <= radius.max(1),
                None => true,
            };
            if near {
                out.push((k.name.clone(), v.clone()));
            }
        }
    }
    out
}

/// A uniformly random value for every knob of `source`.
pub fn random_assignment(source: &str, rng: &mut Rng) -> Assignment {
    annotations(source)
        .knobs
        .iter()
        .filter_map(|k| rng.choose(&k.values).map(|v| (k.name.clone(), v.clone())))
        .collect()
}

/// The current value of every knob of `source`.
pub fn values(source: &str) -> Assignment {
    annotations(source)
        .knobs
        .into_iter()
        .map(|k| (k.name, k.current))
        .collect()
}

/// `K1=v1 K2=v2`.
pub fn describe(a: &[(String, String)]) -> String {
    a.iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// `base` with the knobs of `a` set (launch-bound knobs also set their launch fields)
/// and `flags` added (no parent or note), or why not.
pub fn apply(
    base: &Candidate,
    a: &[(String, String)],
    flags: &[String],
) -> Result<Candidate, String> {
    let pairs: Vec<(&str, &str)> = a.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let source = knobs::set_all(&base.source, &pairs).map_err(|e| e.to_string())?;
    let notes = annotations(&base.source);
    let mut c = base.clone();
    for (name, value) in a {
        if let Some(binding) = notes.knob(name).and_then(|k| k.launch.as_ref()) {
            binding.apply(&mut c.launches, value)?;
        }
    }
    c.source = source;
    c.parent = None;
    c.note = None;
    for f in flags {
        if !c.flags.contains(f) {
            c.flags.push(f.clone());
        }
    }
    Ok(c)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SRC: &str =
        "// @knob A 1|2|4|8\n#define A 2\n// @knob T double|float\n#define T double\n";

    #[test]
    fn launch_bound_knobs_move_their_launches() {
        let src = "// @knob BLOCK 128|256 launch:block.x@a\n#define BLOCK 256\n";
        let base: Candidate = serde_json::from_value(serde_json::json!({
            "problem": "p", "language": "cuda", "source": src,
            "launches": [
                {"kernel": "a", "grid": [4, 1, 1], "block": [256, 1, 1], "args": []},
                {"kernel": "b", "grid": [4, 1, 1], "block": [32, 1, 1], "args": []}
            ]
        }))
        .expect("candidate");
        let c = apply(&base, &[("BLOCK".into(), "128".into())], &[]).expect("applies");
        assert!(c.source.contains("#define BLOCK 128"));
        assert_eq!(c.launches[0].block, [128, 1, 1]);
        assert_eq!(c.launches[1].block, [32, 1, 1], "kernel b is not bound");
        let bad = "// @knob T f|d launch:block.x\n#define T f\n";
        let mut b2 = base.clone();
        b2.source = bad.into();
        assert!(apply(&b2, &[("T".into(), "d".into())], &[]).is_err());
        assert!(knobs::parse("// @knob B 1|2 launch:warp.x\n#define B 1\n").is_err());
    }

    #[test]
    fn neighbours_respect_the_radius() {
        let n = neighbours(SRC, 1);
        assert_eq!(
            n,
            [("A", "1"), ("A", "4"), ("T", "float")].map(|(a, b)| (a.to_string(), b.to_string()))
        );
        assert_eq!(neighbours(SRC, 3).len(), 4);
        let mut rng = Rng::from_state(3);
        let a = random_assignment(SRC, &mut rng);
        assert_eq!(a.len(), 2);
        assert_eq!(describe(&values(SRC)), "A=2 T=double");
    }
}
