//! kiln's framing: how every message between kiln's processes travels on a pipe
//! (kilnd and a jailed `kiln-worker`, kilnd and the trusted torch runner, a worker and its
//! host runner).
//!
//! Everything travels as **frames**: a `u32` little-endian length, then that many bytes.
//! A frame is at most [`MAX_FRAME`] bytes; a longer length is an error, never an
//! allocation.
//!
//! A **message** is one JSON frame holding an [`Envelope`] (`{"blobs": N, "body": …}`),
//! followed by exactly `N` raw frames (artifacts, tensors). Raw bytes never go through
//! JSON. A blob longer than a frame (a torch reference's 1 GiB tensor) travels as
//! consecutive frames of at most [`MAX_FRAME`] bytes each: the envelope then says how many
//! frames each blob spans (`"frames": [k₀, k₁, …]`, at most [`MAX_FRAMES_PER_BLOB`] each),
//! and the reader joins them. Without `frames` every blob is one frame.
//!
//! `sandbox/protocol/framing.json` is the framing's one spec, with vectors that this crate
//! and the torch runner's Python (`daemon/torch-runner/kiln_torch.py`) are both tested
//! against. What the messages *say* is each conversation's own business: the worker's
//! requests and responses are in `kiln_sandbox::protocol`, the torch runner's calls in
//! `kiln_torch_runner`.

pub mod fds;

use std::io::{Read, Write};

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use thiserror::Error;

/// Largest frame accepted, in bytes (512 MiB: the largest artifact plus headroom).
pub const MAX_FRAME: u32 = 512 << 20;

/// Most blobs after one JSON frame.
pub const MAX_BLOBS: u32 = 8;

/// Most frames one blob may span (a blob of up to 256 GiB: more than a GPU holds).
pub const MAX_FRAMES_PER_BLOB: u32 = 512;

/// Most blob bytes [`read_message`] accepts in one message: what [`MAX_BLOBS`] one-frame
/// blobs hold. A reader expecting more (a torch reference's tensors) says how much with
/// [`read_message_within`].
pub const MAX_MESSAGE_BYTES: u64 = MAX_BLOBS as u64 * MAX_FRAME as u64;

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
    /// A message whose blobs hold more bytes than its reader accepts.
    #[error("message of more than {0} bytes of blobs; the reader accepts at most {0}")]
    MessageTooLarge(u64),
    /// An envelope's `frames` that does not describe its blobs.
    #[error(
        "bad frame counts {0:?} for the blobs (one count per blob, each 1 to {MAX_FRAMES_PER_BLOB})"
    )]
    BadFrameCounts(Vec<u32>),
    /// The JSON did not parse as the expected message.
    #[error("malformed message: {0}")]
    Json(#[from] serde_json::Error),
}

/// The JSON frame of a message.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Envelope<T> {
    /// Blobs that follow.
    pub blobs: u32,
    /// How many consecutive frames each blob spans; empty: one frame each.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub frames: Vec<u32>,
    /// The message itself.
    pub body: T,
}

/// How many frames a blob of `len` bytes spans when written in frames of at most
/// `max_frame` bytes (at least one).
fn frames_of(len: usize, max_frame: u32) -> u32 {
    u32::try_from(len.div_ceil(max_frame as usize).max(1)).unwrap_or(u32::MAX)
}

/// Writes one frame.
pub fn write_frame(w: &mut impl Write, bytes: &[u8]) -> Result<(), ProtocolError> {
    write_frame_within(w, bytes, MAX_FRAME)
}

fn write_frame_within(
    w: &mut impl Write,
    bytes: &[u8],
    max_frame: u32,
) -> Result<(), ProtocolError> {
    let len = u32::try_from(bytes.len())
        .ok()
        .filter(|&n| n <= max_frame)
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
    write_message_framed(w, body, blobs, MAX_FRAME)
}

/// [`write_message`] in frames of at most `max_frame` bytes (the shared framing spec's
/// vectors use small frames, so that a blob spanning frames fits in a test).
pub fn write_message_framed<T: Serialize>(
    w: &mut impl Write,
    body: &T,
    blobs: &[&[u8]],
    max_frame: u32,
) -> Result<(), ProtocolError> {
    let frames: Vec<u32> = blobs
        .iter()
        .map(|b| frames_of(b.len(), max_frame))
        .collect();
    if let Some(&n) = frames.iter().find(|&&n| n > MAX_FRAMES_PER_BLOB) {
        return Err(ProtocolError::FrameTooLarge(
            u64::from(n).saturating_mul(u64::from(max_frame)),
        ));
    }
    let env = Envelope {
        blobs: u32::try_from(blobs.len()).unwrap_or(u32::MAX),
        frames: if frames.iter().all(|&n| n == 1) {
            Vec::new()
        } else {
            frames
        },
        body,
    };
    write_frame_within(w, &serde_json::to_vec(&env)?, MAX_FRAME)?;
    for b in blobs {
        if b.is_empty() {
            write_frame_within(w, b, max_frame)?;
        }
        for piece in b.chunks(max_frame as usize) {
            write_frame_within(w, piece, max_frame)?;
        }
    }
    w.flush()?;
    Ok(())
}

/// Reads a message and its blobs (at most [`MAX_MESSAGE_BYTES`] of them).
pub fn read_message<T: DeserializeOwned>(
    r: &mut impl Read,
) -> Result<(T, Vec<Vec<u8>>), ProtocolError> {
    read_message_within(r, MAX_MESSAGE_BYTES)
}

/// Reads a message and its blobs, refusing it once its blobs pass `max_bytes` in all
/// (checked frame by frame, before each frame is read).
pub fn read_message_within<T: DeserializeOwned>(
    r: &mut impl Read,
    max_bytes: u64,
) -> Result<(T, Vec<Vec<u8>>), ProtocolError> {
    read_message_framed(r, max_bytes, MAX_FRAME)
}

/// [`read_message_within`] for blob frames of at most `max_frame` bytes (see
/// [`write_message_framed`]).
pub fn read_message_framed<T: DeserializeOwned>(
    r: &mut impl Read,
    max_bytes: u64,
    max_frame: u32,
) -> Result<(T, Vec<Vec<u8>>), ProtocolError> {
    let head = read_frame(r, 64 << 20)?;
    let env: Envelope<T> = serde_json::from_slice(&head)?;
    if env.blobs > MAX_BLOBS {
        return Err(ProtocolError::TooManyBlobs(env.blobs));
    }
    let frames = if env.frames.is_empty() {
        vec![1; env.blobs as usize]
    } else {
        env.frames
    };
    if frames.len() != env.blobs as usize
        || frames.iter().any(|&n| n == 0 || n > MAX_FRAMES_PER_BLOB)
    {
        return Err(ProtocolError::BadFrameCounts(frames));
    }
    let mut blobs = Vec::with_capacity(env.blobs as usize);
    let mut total = 0u64;
    let mut frame = |r: &mut _| -> Result<Vec<u8>, ProtocolError> {
        let left = max_bytes.saturating_sub(total);
        let cap = u32::try_from(left).unwrap_or(u32::MAX).min(max_frame);
        let f = read_frame(r, cap).map_err(|e| match e {
            ProtocolError::FrameTooLarge(_) if left < u64::from(max_frame) => {
                ProtocolError::MessageTooLarge(max_bytes)
            }
            e => e,
        })?;
        total += f.len() as u64;
        Ok(f)
    };
    for n in frames {
        let mut blob = frame(r)?;
        for _ in 1..n {
            blob.extend_from_slice(&frame(r)?);
        }
        blobs.push(blob);
    }
    Ok((env.body, blobs))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(s: &str) -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex"))
            .collect()
    }

    /// The shared framing spec (`sandbox/protocol/framing.json`, which kiln_torch.py's
    /// tests read too): the same limits, every vector written to the byte and read back,
    /// every refused stream refused.
    #[test]
    fn framing_matches_the_shared_spec() {
        let spec: serde_json::Value =
            serde_json::from_str(include_str!("../framing.json")).expect("spec");
        assert_eq!(spec["max_frame"], MAX_FRAME);
        assert_eq!(spec["max_frames_per_blob"], MAX_FRAMES_PER_BLOB);
        assert_eq!(spec["max_blobs"], MAX_BLOBS);
        let messages = spec["messages"].as_array().expect("messages");
        assert!(!messages.is_empty());
        for v in messages {
            let name = v["name"].as_str().expect("name");
            let max_frame = v["max_frame"].as_u64().expect("max_frame") as u32;
            let blobs: Vec<Vec<u8>> = v["blobs_hex"]
                .as_array()
                .expect("blobs")
                .iter()
                .map(|b| hex(b.as_str().expect("hex")))
                .collect();
            let refs: Vec<&[u8]> = blobs.iter().map(Vec::as_slice).collect();
            let stream = hex(v["stream_hex"].as_str().expect("stream"));
            let mut written = Vec::new();
            write_message_framed(&mut written, &v["body"], &refs, max_frame).expect(name);
            assert_eq!(written, stream, "{name}: written");
            let (body, got): (serde_json::Value, _) =
                read_message_framed(&mut stream.as_slice(), MAX_MESSAGE_BYTES, max_frame)
                    .expect(name);
            assert_eq!(body, v["body"], "{name}: body");
            assert_eq!(got, blobs, "{name}: blobs");
        }
        let refused = spec["refused"].as_array().expect("refused");
        assert!(!refused.is_empty());
        for v in refused {
            let name = v["name"].as_str().expect("name");
            let max_frame = v["max_frame"].as_u64().expect("max_frame") as u32;
            let stream = hex(v["stream_hex"].as_str().expect("stream"));
            let got = read_message_framed::<serde_json::Value>(
                &mut stream.as_slice(),
                MAX_MESSAGE_BYTES,
                max_frame,
            );
            assert!(got.is_err(), "{name}: accepted {got:?}");
        }
    }

    #[test]
    fn message_round_trips_with_blobs() {
        let mut buf = Vec::new();
        let body = serde_json::json!({"failed": {"message": "x"}});
        write_message(&mut buf, &body, &[b"abc", b""]).expect("write");
        let (got, blobs): (serde_json::Value, _) = read_message(&mut buf.as_slice()).expect("read");
        assert_eq!(got, body);
        assert_eq!(blobs, vec![b"abc".to_vec(), Vec::new()]);
    }

    /// A blob longer than a frame travels as several frames and comes back whole, beside
    /// one-frame blobs in the same message.
    #[test]
    fn blob_over_a_frame_spans_frames_and_joins() {
        let big: Vec<u8> = (0..MAX_FRAME as usize + 3)
            .map(|i| (i % 251) as u8)
            .collect();
        let mut buf = Vec::new();
        write_message(
            &mut buf,
            &serde_json::json!("reference"),
            &[b"ab", &big, b""],
        )
        .expect("write");
        let bytes = big.len() as u64 + 2;
        let err = read_message_within::<serde_json::Value>(&mut buf.as_slice(), bytes - 1)
            .expect_err("one byte over");
        assert!(matches!(err, ProtocolError::MessageTooLarge(_)), "{err}");
        let (got, blobs): (serde_json::Value, _) =
            read_message_within(&mut buf.as_slice(), bytes).expect("read");
        assert_eq!(got, "reference");
        assert_eq!(blobs.len(), 3);
        assert_eq!(blobs[0], b"ab");
        assert!(blobs[1] == big, "the long blob joins back byte for byte");
        assert!(blobs[2].is_empty());
    }

    /// An envelope whose frame counts do not describe its blobs is refused.
    #[test]
    fn bad_frame_counts_are_refused() {
        for frames in [vec![1], vec![1, 0], vec![1, MAX_FRAMES_PER_BLOB + 1]] {
            let env = Envelope {
                blobs: 2,
                frames: frames.clone(),
                body: serde_json::json!("reference"),
            };
            let mut buf = Vec::new();
            write_frame(&mut buf, &serde_json::to_vec(&env).expect("json")).expect("write");
            let err = read_message::<serde_json::Value>(&mut buf.as_slice()).expect_err("refused");
            assert!(
                matches!(&err, ProtocolError::BadFrameCounts(f) if *f == frames),
                "{err}"
            );
        }
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
