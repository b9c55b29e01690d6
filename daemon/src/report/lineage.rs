//! The lineage of a kernel: its parents followed back through the search, oldest first,
//! with each step's note (the proposer's idea or move) and speedups.

use kiln_types::Verdict;

use crate::store::TimelineEntry;

/// Longest chain followed (a proposer could make cycles or very long chains).
pub const MAX_STEPS: usize = 200;

/// One step of a lineage.
#[derive(Debug, Clone, PartialEq)]
pub struct Step {
    /// Candidate id.
    pub id: String,
    /// The proposer's note, if any.
    pub note: Option<String>,
    /// Its median when `ok` (raced-out and plain timings included: they are still correct).
    pub median_us: Option<f64>,
    /// Its verdict, once evaluated.
    pub verdict: Option<Verdict>,
    /// Parent's median / this median.
    pub vs_parent: Option<f64>,
    /// First step's median / this median.
    pub vs_first: Option<f64>,
    /// False for a parent that this search did not submit (the chain stops there).
    pub in_search: bool,
}

/// The chain ending at `id`, oldest first. It stops at a candidate without a parent, at
/// one outside the search, at a repeat, or after [`MAX_STEPS`].
pub fn chain(id: &str, timeline: &[TimelineEntry]) -> Vec<Step> {
    let mut rev: Vec<Step> = Vec::new();
    let mut cur = Some(id.to_string());
    while let Some(cid) = cur.take() {
        if rev.len() >= MAX_STEPS || rev.iter().any(|s| s.id == cid) {
            break;
        }
        let Some(e) = timeline.iter().find(|e| e.candidate_id == cid) else {
            rev.push(Step {
                id: cid,
                note: None,
                median_us: None,
                verdict: None,
                vs_parent: None,
                vs_first: None,
                in_search: false,
            });
            break;
        };
        let ev = e.evaluation.as_ref();
        rev.push(Step {
            id: cid,
            note: e.note.clone(),
            median_us: ev
                .filter(|e| e.verdict == Verdict::Ok)
                .and_then(|e| e.timing.as_ref())
                .map(|t| t.median_us)
                .filter(|m| *m > 0.0),
            verdict: ev.map(|e| e.verdict),
            vs_parent: None,
            vs_first: None,
            in_search: true,
        });
        cur = e.parent.clone();
    }
    rev.reverse();
    let first = rev.first().and_then(|s| s.median_us);
    let mut prev: Option<f64> = None;
    for s in &mut rev {
        if let Some(m) = s.median_us {
            s.vs_parent = prev.map(|p| p / m);
            s.vs_first = first.map(|f| f / m);
        }
        prev = s.median_us;
    }
    rev
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::fixtures::entry;

    fn linked(seq: u64, us: f64, parent: Option<u64>) -> TimelineEntry {
        let mut e = entry(seq, 2000 + seq as i64, Some(Verdict::Ok), us);
        e.parent = parent.map(|p| format!("c{p}"));
        e.note = Some(format!("step {seq}"));
        e
    }

    #[test]
    fn follows_parents_oldest_first_with_speedups() {
        let t = vec![
            linked(1, 20.0, None),
            linked(2, 10.0, Some(1)),
            linked(3, 30.0, Some(1)),
            linked(4, 5.0, Some(2)),
        ];
        let c = chain("c4", &t);
        let ids: Vec<&str> = c.iter().map(|s| s.id.as_str()).collect();
        assert_eq!(ids, ["c1", "c2", "c4"]);
        assert_eq!(c[0].vs_parent, None);
        assert_eq!(c[1].vs_parent, Some(2.0));
        assert_eq!(c[2].vs_first, Some(4.0));
        assert_eq!(c[2].note.as_deref(), Some("step 4"));
    }

    #[test]
    fn stops_outside_the_search_and_at_cycles() {
        let t = vec![linked(1, 20.0, Some(9)), linked(2, 10.0, Some(1))];
        let c = chain("c2", &t);
        assert_eq!(c.len(), 3);
        assert!(!c[0].in_search && c[0].id == "c9");
        let cyc = vec![linked(1, 20.0, Some(2)), linked(2, 10.0, Some(1))];
        assert_eq!(chain("c2", &cyc).len(), 2);
        assert_eq!(chain("missing", &cyc).len(), 1);
    }
}
