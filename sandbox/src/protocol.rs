//! The framed protocol between the caller (kilnd, through this crate's API) and
//! `kiln-worker`, and between a jailed process and whoever spawned it.
//!
//! # Protocol
//!
//! Everything travels as **frames**: a `u32` little-endian length, then that many bytes.
//! A frame is at most [`MAX_FRAME`] bytes; a longer length is a protocol error, never an
//! allocation.
//!
//! A **message** is one JSON frame holding an [`Envelope`] (`{"blobs": N, "body": …}`),
//! followed by exactly `N` raw frames (artifacts: shared objects, CUBIN/PTX images). Raw bytes
//! never go through JSON.
//!
//! The conversation on a jailed worker's stdin (requests) and stdout (responses):
//!
//! ```text
//! jail helper  -> caller : JailReport          (first frame on stdout, always; see jail)
//! caller       -> worker : Request::Compile    (0 blobs)
//! worker       -> caller : Response::Compiled  (1 blob: the artifact, when ok; else 0)
//!   or
//! caller       -> worker : Request::Evaluate   (2 blobs: reference artifact, candidate artifact)
//! worker       -> caller : Response::Evaluated (0 blobs)
//!   or
//! caller       -> worker : Request::Baselines  (1 blob: reference artifact)
//! worker       -> caller : Response::Baselines (0 blobs)
//!   at any point
//! worker       -> caller : Response::Failed    (infrastructure failure inside the worker)
//! ```
//!
//! A compile, a host evaluation and a baselines request each get a fresh jail and one
//! request; a baselines worker then exits, the others exit when the caller closes stdin.
//! A GPU worker is warm ([`crate::WarmWorker`]): it answers one evaluate request after
//! another until stdin closes, or until it answers `retire: true` (a fault or timeout
//! poisoned its CUDA context) and exits. The worker's stderr carries its tracing log and
//! is not part of the protocol. Every backend (host and cuda) speaks these same messages;
//! the candidate's `language` picks the backend inside the worker.
//!
//! Candidate code never writes to these pipes. Host candidates run in a separate runner
//! process (see `backends::host::runner`), whose own pipes carry single bytes (`G`o /
//! `D`one) plus one JSON setup frame and one JSON ready frame, in the same framing. A GPU
//! worker's device `printf` lands on its fd 1, so the protocol moves to a duplicate
//! descriptor first (see `backends::cuda::printf`).

use std::io::{Read, Write};
use std::path::PathBuf;

use kiln_types::{Candidate, CompileInfo, EvalPlan, Evaluation, ProblemSpec};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use thiserror::Error;

/// Version of the worker protocol; the worker refuses a request for another version.
pub const PROTOCOL_VERSION: u32 = 1;

/// Largest frame accepted, in bytes (512 MiB: the largest artifact plus headroom).
pub const MAX_FRAME: u32 = 512 << 20;

/// Most raw frames after one JSON frame.
pub const MAX_BLOBS: u32 = 8;

/// Why a frame or message could not be read or written.
#[derive(Debug, Error)]
pub enum ProtocolError {
    /// The pipe failed or closed early.
    #[error("pipe i/o: {0}")]
    Io(#[from] std::io::Error),
    /// A length prefix above [`MAX_FRAME`].
    #[error("frame of {0} bytes exceeds the limit of {MAX_FRAME}")]
    FrameTooLarge(u64),
    /// More raw frames announced than allowed.
    #[error("{0} blobs announced; at most {MAX_BLOBS} are allowed")]
    TooManyBlobs(u32),
    /// The JSON did not parse as the expected message.
    #[error("malformed message: {0}")]
    Json(#[from] serde_json::Error),
}

/// The JSON frame of a message.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Envelope<T> {
    /// Raw frames that follow.
    pub blobs: u32,
    /// The message itself.
    pub body: T,
}

/// Writes one frame.
pub fn write_frame(w: &mut impl Write, bytes: &[u8]) -> Result<(), ProtocolError> {
    let len = u32::try_from(bytes.len())
        .ok()
        .filter(|&n| n <= MAX_FRAME)
        .ok_or(ProtocolError::FrameTooLarge(bytes.len() as u64))?;
    w.write_all(&len.to_le_bytes())?;
    w.write_all(bytes)?;
    Ok(())
}

/// Reads one frame, refusing lengths above `max`.
pub fn read_frame(r: &mut impl Read, max: u32) -> Result<Vec<u8>, ProtocolError> {
    let mut len = [0u8; 4];
    r.read_exact(&mut len)?;
    let len = u32::from_le_bytes(len);
    if len > max.min(MAX_FRAME) {
        return Err(ProtocolError::FrameTooLarge(u64::from(len)));
    }
    let mut buf = Vec::new();
    // `take` + `read_to_end` grows the buffer as bytes arrive, so a lying length prefix
    // cannot make us allocate memory that never gets filled.
    r.take(u64::from(len)).read_to_end(&mut buf)?;
    if buf.len() != len as usize {
        return Err(ProtocolError::Io(std::io::ErrorKind::UnexpectedEof.into()));
    }
    Ok(buf)
}

/// Writes a message: its JSON frame, then its blobs, then flushes.
pub fn write_message<T: Serialize>(
    w: &mut impl Write,
    body: &T,
    blobs: &[&[u8]],
) -> Result<(), ProtocolError> {
    let env = Envelope {
        blobs: u32::try_from(blobs.len()).unwrap_or(u32::MAX),
        body,
    };
    write_frame(w, &serde_json::to_vec(&env)?)?;
    for b in blobs {
        write_frame(w, b)?;
    }
    w.flush()?;
    Ok(())
}

/// Reads a message and its blobs.
pub fn read_message<T: DeserializeOwned>(
    r: &mut impl Read,
) -> Result<(T, Vec<Vec<u8>>), ProtocolError> {
    let head = read_frame(r, 64 << 20)?;
    let env: Envelope<T> = serde_json::from_slice(&head)?;
    if env.blobs > MAX_BLOBS {
        return Err(ProtocolError::TooManyBlobs(env.blobs));
    }
    let mut blobs = Vec::with_capacity(env.blobs as usize);
    for _ in 0..env.blobs {
        blobs.push(read_frame(r, MAX_FRAME)?);
    }
    Ok((env.body, blobs))
}

/// Limits a run of candidate code is held to, chosen by the caller.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunLimits {
    /// Address-space limit of a runner, bytes.
    pub memory_limit_bytes: u64,
    /// Bytes a runner may print (stdout + stderr) in one evaluation before it is stopped.
    pub output_limit_bytes: u64,
    /// CPU seconds a runner may use in its whole life.
    pub cpu_limit_s: u64,
}

/// A request from the caller to the worker.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum Request {
    /// Compile a candidate; no blobs.
    Compile {
        /// Protocol version the caller speaks.
        version: u32,
        /// The candidate.
        candidate: Candidate,
        /// The C compiler, as a path valid inside the jail.
        cc: PathBuf,
        /// Wall-clock limit for the compiler, milliseconds.
        timeout_ms: u64,
        /// GPU architecture for cuda compiles (`sm_90`); ignored by the host backend.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        arch: Option<String>,
        /// For a Triton candidate: the python, Triton version and compile plan.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        triton: Option<crate::backends::triton::compile::TritonJob>,
    },
    /// Evaluate a compiled candidate; blobs: reference artifact, candidate artifact.
    Evaluate {
        /// Protocol version the caller speaks.
        version: u32,
        /// The problem.
        problem: Box<ProblemSpec>,
        /// The candidate.
        candidate: Candidate,
        /// How to evaluate.
        plan: EvalPlan,
        /// Limits for the runners.
        limits: RunLimits,
    },
    /// Time the problem's baselines on the worker's GPU (cuda only); blob: the compiled
    /// reference. See `backends::cuda::baseline`.
    Baselines {
        /// Protocol version the caller speaks.
        version: u32,
        /// The problem.
        problem: Box<ProblemSpec>,
        /// Seed, run timeout and the stop rule (the candidates' own).
        plan: EvalPlan,
        /// Libraries to time besides the reference (`cublas`, `cudnn`).
        libraries: Vec<String>,
    },
}

/// A response from the worker.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum Response {
    /// The compile finished; one blob (the artifact) when `ok`.
    Compiled {
        /// True if and only if an artifact follows.
        ok: bool,
        /// Duration and log.
        info: CompileInfo,
        /// Why it failed, for people (empty when ok).
        message: String,
        /// The failure's verdict when it is not `compile_error` (a Triton launch plan that
        /// does not fit its jit function: `invalid_launch`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        verdict: Option<kiln_types::Verdict>,
    },
    /// The evaluation finished with a verdict.
    Evaluated {
        /// The evaluation.
        evaluation: Box<Evaluation>,
        /// True when the worker exits after this answer (its GPU context was poisoned by a
        /// fault or timeout): the caller must start a fresh worker for the next request.
        #[serde(default)]
        retire: bool,
    },
    /// The worker could not do its job for a reason that is not the candidate's fault.
    Failed {
        /// What went wrong.
        message: String,
    },
    /// The baselines were timed (each says whether it was measured).
    Baselines {
        /// One entry per baseline, the reference first.
        results: Vec<kiln_types::BaselineResult>,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn message_round_trips_with_blobs() {
        let mut buf = Vec::new();
        let body = Response::Failed {
            message: "x".into(),
        };
        write_message(&mut buf, &body, &[b"abc", b""]).expect("write");
        let (got, blobs): (Response, _) = read_message(&mut buf.as_slice()).expect("read");
        assert!(matches!(got, Response::Failed { message } if message == "x"));
        assert_eq!(blobs, vec![b"abc".to_vec(), Vec::new()]);
    }

    #[test]
    fn lying_length_is_refused_without_allocating() {
        let mut buf = Vec::new();
        buf.extend_from_slice(&u32::MAX.to_le_bytes());
        let err = read_frame(&mut buf.as_slice(), MAX_FRAME).expect_err("too large");
        assert!(matches!(err, ProtocolError::FrameTooLarge(_)));
        let mut short = Vec::new();
        short.extend_from_slice(&100u32.to_le_bytes());
        short.extend_from_slice(b"abc");
        assert!(read_frame(&mut short.as_slice(), MAX_FRAME).is_err());
    }
}
