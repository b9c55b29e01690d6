//! Ideas: where they come from offline (the seed's `@idea` lines and its knobs, each
//! filed under one of the six families), how a round picks K of them across families,
//! and how an idea is implemented M ways from the round's parent.

use std::collections::BTreeMap;

use kiln_sdk::knobs::Annotations;
use kiln_sdk::search::families::{self, ALL, Family};
use kiln_sdk::search::moves;
use kiln_sdk::{Candidate, Rng};
use serde::{Deserialize, Serialize};

/// One idea.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Idea {
    /// Short name.
    pub name: String,
    /// The idea in words.
    pub text: String,
    /// Its family.
    pub family: Family,
    /// Offline: knobs the idea sets to one value (`KNOB=VALUE` in its text).
    pub assign: Vec<(String, String)>,
    /// Offline: knobs it names without a value (every other value is tried).
    pub free: Vec<String>,
    /// Offline: compile flags it names (`-O3`, `-march=native`...).
    pub flags: Vec<String>,
}

impl Idea {
    /// `[family] name: text`.
    pub fn label(&self) -> String {
        format!("[{}] {}: {}", self.family.name(), self.name, self.text)
    }
}

fn words(text: &str) -> impl Iterator<Item = &str> {
    text.split(|c: char| c.is_whitespace() || c == ',' || c == ';' || c == '(' || c == ')')
        .map(|w| w.trim_end_matches(['.', ':']))
        .filter(|w| !w.is_empty())
}

fn names_knob(text: &str, knob: &str) -> bool {
    let ident = |c: char| c.is_ascii_alphanumeric() || c == '_';
    text.match_indices(knob).any(|(i, _)| {
        let before = text[..i].chars().next_back().is_none_or(|c| !ident(c));
        let after = text[i + knob.len()..]
            .chars()
            .next()
            .is_none_or(|c| !ident(c));
        before && after
    })
}

/// The seed's ideas: each `@idea` (with the knobs and flags its text names) and, for
/// every knob no idea names, a "tune KNOB" idea.
pub fn offline_pool(notes: &Annotations) -> Vec<Idea> {
    let mut pool = Vec::new();
    let mut covered: Vec<String> = Vec::new();
    for i in &notes.ideas {
        let mut assign = Vec::new();
        let mut free = Vec::new();
        for k in &notes.knobs {
            let set = words(&i.text).find_map(|w| {
                let (name, v) = w.split_once('=')?;
                (name == k.name && k.values.iter().any(|x| x == v)).then(|| v.to_string())
            });
            match set {
                Some(v) => assign.push((k.name.clone(), v)),
                None if names_knob(&i.text, &k.name) => free.push(k.name.clone()),
                None => continue,
            }
            covered.push(k.name.clone());
        }
        let flags: Vec<String> = words(&i.text)
            .filter(|w| {
                w.len() > 2
                    && w.starts_with('-')
                    && w[1..].starts_with(|c: char| c.is_ascii_alphabetic())
            })
            .map(str::to_string)
            .collect();
        pool.push(Idea {
            name: i.name.clone(),
            text: i.text.clone(),
            family: families::classify(&format!("{} {}", i.name, i.text)),
            assign,
            free,
            flags,
        });
    }
    for k in &notes.knobs {
        if covered.contains(&k.name) {
            continue;
        }
        pool.push(Idea {
            name: format!("tune_{}", k.name.to_ascii_lowercase()),
            text: format!("try other values of {} ({})", k.name, k.values.join("|")),
            family: families::classify(&format!("{} {}", k.name, k.values.join(" "))),
            assign: Vec::new(),
            free: vec![k.name.clone()],
            flags: Vec::new(),
        });
    }
    pool
}

/// Every way to apply `idea` to `parent` offline that changes it, in a shuffled order.
pub fn variants(idea: &Idea, parent: &Candidate, rng: &mut Rng) -> Vec<Candidate> {
    let notes = moves::annotations(&parent.source);
    let mut choices: Vec<Vec<(String, String)>> = vec![idea.assign.clone()];
    for name in &idea.free {
        let Some(k) = notes.knob(name) else { continue };
        let others: Vec<&String> = k.values.iter().filter(|v| **v != k.current).collect();
        let mut next = Vec::new();
        for c in &choices {
            for v in &others {
                let mut c = c.clone();
                c.push((name.clone(), (*v).clone()));
                next.push(c);
            }
        }
        if !next.is_empty() {
            choices = next;
        }
    }
    let mut out: Vec<Candidate> = Vec::new();
    for a in choices {
        if let Ok(c) = moves::apply(parent, &a, &idea.flags)
            && c.content_hash() != parent.content_hash()
            && !out.iter().any(|o| o.content_hash() == c.content_hash())
        {
            let mut c = c;
            let what = [moves::describe(&a), idea.flags.join(" ")]
                .into_iter()
                .filter(|s| !s.is_empty())
                .collect::<Vec<_>>()
                .join(" ");
            c.note = Some(format!("[{}] {}: {what}", idea.family.name(), idea.name));
            out.push(c);
        }
    }
    rng.shuffle(&mut out);
    out
}

/// Up to `k` ideas from `available`, spread across families: the families in a random
/// order, one idea from each in turn, then a second from each, and so on.
pub fn pick_across_families<T: Clone>(
    available: &[(Family, T)],
    k: usize,
    rng: &mut Rng,
) -> Vec<T> {
    let mut by: BTreeMap<Family, Vec<T>> = BTreeMap::new();
    for (f, t) in available {
        by.entry(*f).or_default().push(t.clone());
    }
    let mut order: Vec<Family> = ALL.into_iter().filter(|f| by.contains_key(f)).collect();
    rng.shuffle(&mut order);
    let mut out = Vec::new();
    let mut depth = 0;
    while out.len() < k {
        let mut any = false;
        for f in &order {
            if let Some(t) = by.get(f).and_then(|v| v.get(depth)) {
                any = true;
                if out.len() < k {
                    out.push(t.clone());
                }
            }
        }
        if !any {
            break;
        }
        depth += 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEED: &str = "// @knob ACC_T double|float\n#define ACC_T double\n// @knob EXP exp|expf\n#define EXP exp\n// @knob UNROLL 1|4|8\n#define UNROLL 1\n// @knob ONLINE 0|1\n#define ONLINE 0\n// @idea float_math: ACC_T=float with EXP=expf halves the cost\n// @idea acc: UNROLL>1 keeps several partial sums so the loop is not one long dependency chain\n// @idea vectorise: add -O3 -march=native -ffast-math to flags\nvoid f(void) {}\n";

    fn parent() -> Candidate {
        serde_json::from_value(serde_json::json!({
            "problem": "p", "language": "c", "source": SEED,
            "launches": [{"kernel": "f", "args": []}]
        }))
        .expect("candidate")
    }

    #[test]
    fn pool_from_annotations() {
        let notes = kiln_sdk::knobs::parse(SEED).expect("parses");
        let pool = offline_pool(&notes);
        let names: Vec<&str> = pool.iter().map(|i| i.name.as_str()).collect();
        assert_eq!(names, ["float_math", "acc", "vectorise", "tune_online"]);
        assert_eq!(pool[0].assign.len(), 2);
        assert_eq!(pool[0].family, Family::Precision);
        assert_eq!(pool[1].free, ["UNROLL"]);
        assert_eq!(pool[2].flags, ["-O3", "-march=native", "-ffast-math"]);
        assert_eq!(pool[2].family, Family::Compute);
        let mut rng = Rng::from_state(1);
        assert_eq!(variants(&pool[1], &parent(), &mut rng).len(), 2);
        let v = variants(&pool[0], &parent(), &mut rng);
        assert_eq!(v.len(), 1);
        assert!(v[0].source.contains("#define EXP expf"));
    }

    #[test]
    fn picks_spread_over_families() {
        let avail = [
            (Family::Memory, 1),
            (Family::Memory, 2),
            (Family::Memory, 3),
            (Family::Compute, 4),
            (Family::Precision, 5),
        ];
        let mut rng = Rng::from_state(9);
        let mut got = pick_across_families(&avail, 3, &mut rng);
        got.sort_unstable();
        assert_eq!(got, [1, 4, 5]);
        assert_eq!(pick_across_families(&avail, 10, &mut rng).len(), 5);
    }
}
