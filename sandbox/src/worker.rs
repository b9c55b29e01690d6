//! `kiln-worker serve`: the trusted process inside the jail. Reads one request from stdin,
//! dispatches on the candidate's language to a backend, writes one response to stdout.
//!
//! Host candidates never run in this process: compiles run the system compiler as a
//! child, evaluations run candidate code in runner children (see `host::runner`). Cuda
//! candidates compile in-process (NVRTC) and run on the GPU this worker holds; a GPU
//! fault or timeout poisons the context, so the worker answers and exits (one request per
//! process in any case).

use std::io::{Read, Write};
use std::path::PathBuf;
use std::time::Duration;

use kiln_types::Language;

use crate::protocol::{self, PROTOCOL_VERSION, ProtocolError, Request, Response};
use crate::{cuda, host};

/// Serves one request on stdin/stdout; returns the exit status.
pub fn serve(tag: &str) -> i32 {
    let mut input = std::io::stdin().lock();
    let mut output = std::io::stdout().lock();
    match serve_on(&mut input, &mut output, tag) {
        Ok(()) => 0,
        Err(e) => {
            tracing::error!("kiln-worker: {e}");
            1
        }
    }
}

fn serve_on(
    input: &mut impl Read,
    output: &mut impl Write,
    tag: &str,
) -> Result<(), ProtocolError> {
    let (request, blobs): (Request, Vec<Vec<u8>>) = match protocol::read_message(input) {
        Ok(m) => m,
        Err(ProtocolError::Io(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(()),
        Err(e) => return Err(e),
    };
    let failed = |message: String| Response::Failed { message };
    match request {
        Request::Compile { version, .. } | Request::Evaluate { version, .. }
            if version != PROTOCOL_VERSION =>
        {
            let r = failed(format!(
                "protocol version {version} requested; this worker speaks {PROTOCOL_VERSION}"
            ));
            protocol::write_message(output, &r, &[])
        }
        Request::Compile {
            candidate,
            cc,
            timeout_ms,
            arch,
            ..
        } => match candidate.language {
            Language::C => {
                let c = host::compile::compile(&candidate, &cc, Duration::from_millis(timeout_ms));
                let r = Response::Compiled {
                    ok: c.artifact.is_some(),
                    info: c.info,
                    message: c.message,
                };
                match &c.artifact {
                    Some(a) => protocol::write_message(output, &r, &[a]),
                    None => protocol::write_message(output, &r, &[]),
                }
            }
            Language::Cuda => {
                let arch = arch.unwrap_or_else(|| cuda::setup::DEFAULT_ARCH.to_string());
                match cuda::compile::compile(&candidate, &arch) {
                    Ok(c) => {
                        let r = Response::Compiled {
                            ok: c.artifact.is_some(),
                            info: c.info,
                            message: c.message,
                        };
                        match &c.artifact {
                            Some(a) => protocol::write_message(output, &r, &[a]),
                            None => protocol::write_message(output, &r, &[]),
                        }
                    }
                    Err(e) => protocol::write_message(output, &failed(e), &[]),
                }
            }
        },
        Request::Evaluate {
            problem,
            candidate,
            plan,
            limits,
            ..
        } => {
            let [reference, artifact] = blobs.as_slice() else {
                let r = failed(format!("evaluate needs 2 blobs, got {}", blobs.len()));
                return protocol::write_message(output, &r, &[]);
            };
            let r = match candidate.language {
                Language::C => {
                    let exe = std::env::args_os()
                        .next()
                        .map(PathBuf::from)
                        .unwrap_or_default();
                    let job = host::evaluate::Job {
                        problem: &problem,
                        candidate: &candidate,
                        plan: &plan,
                        limits: &limits,
                        reference_artifact: reference,
                        candidate_artifact: artifact,
                        exe: &exe,
                        tag,
                    };
                    match host::evaluate::evaluate(job) {
                        Ok(evaluation) => Response::Evaluated {
                            evaluation: Box::new(evaluation),
                        },
                        Err(message) => failed(message),
                    }
                }
                Language::Cuda => {
                    let job = cuda::target::Job {
                        problem: &problem,
                        candidate: &candidate,
                        plan: &plan,
                        reference_artifact: reference,
                        candidate_artifact: artifact,
                    };
                    match cuda::target::evaluate(job) {
                        Ok(evaluation) => Response::Evaluated {
                            evaluation: Box::new(evaluation),
                        },
                        Err(message) => failed(message),
                    }
                }
            };
            protocol::write_message(output, &r, &[])
        }
    }
}
