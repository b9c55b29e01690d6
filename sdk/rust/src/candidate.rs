//! [`CandidateBuilder`]: derive candidates from a seed (or build one from scratch) and
//! validate them before they are submitted.

use kiln_types::{Candidate, CandidateError, Language, Launch, ScratchBuffer};

/// Builds a [`Candidate`], usually by changing a copy of the seed kernel.
///
/// ```
/// # use kiln_sdk::CandidateBuilder;
/// # use kiln_types::{Candidate, Language, Launch};
/// let seed = CandidateBuilder::new("vecadd", Language::C, "void add(void) {}")
///     .launch(Launch { kernel: "add".into(), ..Launch::default() })
///     .build()?;
/// let child = CandidateBuilder::from(&seed)
///     .source("void add(void) { /* faster */ }")
///     .note("unrolled")
///     .build()?;
/// assert_eq!(child.launches, seed.launches);
/// # Ok::<(), kiln_types::CandidateError>(())
/// ```
#[derive(Debug, Clone)]
pub struct CandidateBuilder {
    candidate: Candidate,
}

impl CandidateBuilder {
    /// A candidate for `problem` in `language` with `source` and no launches yet.
    pub fn new(problem: impl Into<String>, language: Language, source: impl Into<String>) -> Self {
        CandidateBuilder {
            candidate: Candidate {
                problem: problem.into(),
                language,
                source: source.into(),
                launches: Vec::new(),
                scratch: Vec::new(),
                flags: Vec::new(),
                parent: None,
                note: None,
            },
        }
    }

    /// Replaces the source.
    pub fn source(mut self, source: impl Into<String>) -> Self {
        self.candidate.source = source.into();
        self
    }

    /// Appends a launch to the plan.
    pub fn launch(mut self, launch: Launch) -> Self {
        self.candidate.launches.push(launch);
        self
    }

    /// Replaces the whole launch plan.
    pub fn launches(mut self, launches: Vec<Launch>) -> Self {
        self.candidate.launches = launches;
        self
    }

    /// Changes every launch of `kernel`'s grid and block.
    pub fn dims(mut self, kernel: &str, grid: [u32; 3], block: [u32; 3]) -> Self {
        for l in self
            .candidate
            .launches
            .iter_mut()
            .filter(|l| l.kernel == kernel)
        {
            l.grid = grid;
            l.block = block;
        }
        self
    }

    /// Appends a scratch buffer.
    pub fn scratch(mut self, buffer: ScratchBuffer) -> Self {
        self.candidate.scratch.push(buffer);
        self
    }

    /// Appends a compile flag.
    pub fn flag(mut self, flag: impl Into<String>) -> Self {
        self.candidate.flags.push(flag.into());
        self
    }

    /// Names the candidate this one derives from.
    pub fn parent(mut self, id: impl Into<String>) -> Self {
        self.candidate.parent = Some(id.into());
        self
    }

    /// Says what this candidate tries.
    pub fn note(mut self, note: impl Into<String>) -> Self {
        self.candidate.note = Some(note.into());
        self
    }

    /// Checks the candidate's structure and returns it.
    pub fn build(self) -> Result<Candidate, CandidateError> {
        self.candidate.validate()?;
        Ok(self.candidate)
    }
}

impl From<&Candidate> for CandidateBuilder {
    /// Starts from a copy of `c` with no parent and no note (set them anew).
    fn from(c: &Candidate) -> Self {
        let mut candidate = c.clone();
        candidate.parent = None;
        candidate.note = None;
        CandidateBuilder { candidate }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn build_validates() {
        let err = CandidateBuilder::new("p", Language::C, "int x;")
            .build()
            .expect_err("no launches");
        assert_eq!(err, CandidateError::LaunchCount(0));
    }
}
