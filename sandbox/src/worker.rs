//! `kiln-worker serve`: the trusted process inside the jail. Reads requests from stdin
//! until it is closed, dispatches each on the candidate's language to a backend, writes
//! one response per request to stdout.
//!
//! Host candidates never run in this process: compiles run the system compiler as a
//! child, evaluations run candidate code in runner children (see `engine::host::runner`).
//! Cuda candidates compile in-process (NVRTC) and run on the GPU this worker holds; Triton
//! candidates compile in a python child (Triton's own compiler, see `engine::triton`)
//! and run on the GPU as CUDA launches of their CUBINs. A GPU worker is warm: it keeps its
//! CUDA context ([`cuda::context::GpuContext`]) from one evaluation to the next. A fault or timeout poisons the context; the worker then answers with
//! `retire: true` and exits, and the caller starts a fresh one.

use std::io::{Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::path::PathBuf;
use std::time::Duration;

use kiln_types::Language;

use crate::engine::{cuda, host, triton};
use crate::protocol::{self, PROTOCOL_VERSION, ProtocolError, Request, Response};

/// The exit status of a worker that reached its CPU-time limit: 128 + SIGXCPU, as a shell
/// reports death by that signal (what the compile's caller reads it as).
pub const CPU_LIMIT_EXIT: i32 = 128 + libc::SIGXCPU;

extern "C" fn on_sigxcpu(_: libc::c_int) {
    // SAFETY: _exit is async-signal-safe; nothing else runs here.
    unsafe { libc::_exit(CPU_LIMIT_EXIT) }
}

/// A jailed worker is PID 1 of its PID namespace, where the kernel drops signals that have
/// no handler: SIGXCPU at the soft CPU-time limit would be lost and the hard limit's
/// SIGKILL would end the worker (e.g. NVRTC expanding a macro bomb) without saying why.
/// With this handler it exits with [`CPU_LIMIT_EXIT`] instead.
fn exit_on_cpu_limit() {
    // SAFETY: a zeroed sigaction is valid; the handler only calls _exit.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_sigxcpu as *const () as usize;
        libc::sigemptyset(&mut sa.sa_mask);
        if libc::sigaction(libc::SIGXCPU, &sa, std::ptr::null_mut()) != 0 {
            tracing::warn!(
                "kiln-worker: no SIGXCPU handler: {}",
                std::io::Error::last_os_error()
            );
        }
    }
}

/// Serves requests on stdin/stdout until stdin closes or the GPU context is poisoned;
/// returns the exit status. With `pch_heap` (`serve --pch-heap`: a cuda compile that
/// builds or uses a precompiled header, in a jail without address-space randomization),
/// NVRTC's PCH heap is mapped first, before the request is read, so that it lies at the
/// same address in every such worker (see `kiln_gpu::cxx::pch::reserve_heap`).
pub fn serve(tag: &str, pch_heap: bool) -> i32 {
    if pch_heap {
        let here = std::env::current_dir().unwrap_or_else(|_| PathBuf::from("."));
        // NVRTC writes a temporary file while it makes a PCH, in $TMPDIR (else /tmp, which
        // a jail does not have): the scratch directory.
        // SAFETY: nothing else runs yet: the worker has started no thread, and the
        // environment is read by no one concurrently.
        unsafe { std::env::set_var("TMPDIR", &here) };
        if let Err(e) = kiln_gpu::cxx::pch::reserve_heap(&here) {
            tracing::warn!("kiln-worker: the PCH heap could not be mapped early: {e}");
        }
    }
    exit_on_cpu_limit();
    // Not dumpable: a process of the same user (a hosted runner's python above all) can
    // then neither open this process's /proc files (mem, fd, environ) nor trace it.
    // SAFETY: prctl(PR_SET_DUMPABLE, 0) has no pointer arguments.
    if unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) } != 0 {
        tracing::warn!(
            "kiln-worker: cannot make itself non-dumpable: {}",
            std::io::Error::last_os_error()
        );
    }
    let mut input = std::io::stdin().lock();
    // A GPU worker's fd 1 receives device printf: the protocol moves to a duplicate.
    let mut output: std::fs::File = if std::env::var_os(CAPTURE_ENV).is_some() {
        match cuda::printf::install() {
            Ok(f) => f,
            Err(e) => {
                tracing::error!("kiln-worker: cannot capture device printf: {e}");
                return 1;
            }
        }
    } else {
        match std::io::stdout().as_fd().try_clone_to_owned() {
            Ok(fd) => std::fs::File::from(fd),
            Err(e) => {
                tracing::error!("kiln-worker: cannot duplicate stdout: {e}");
                return 1;
            }
        }
    };
    let mut context: Option<cuda::context::GpuContext> = None;
    loop {
        match serve_on(&mut input, &mut output, tag, &mut context) {
            Ok(Next::More) => {}
            Ok(Next::Exit) => return 0,
            Err(e) => {
                tracing::error!("kiln-worker: {e}");
                return 1;
            }
        }
    }
}

/// Builds a precompiled header for `Request::BuildPch` at `out`, which must be a PCH file
/// name ([`kiln_gpu::cxx::pch::file_name`]) in this worker's working directory (its
/// scratch).
fn build_pch(
    prefix: &kiln_gpu::cxx::pch::Prefix,
    arch: &str,
    flags: &[String],
    include_dirs: &[PathBuf],
    implied: &[String],
    out: &std::path::Path,
) -> Result<kiln_gpu::cxx::pch::Built, String> {
    use kiln_gpu::cxx::pch;
    let here = std::env::current_dir().map_err(|e| format!("no working directory: {e}"))?;
    let named = out
        .file_name()
        .and_then(|n| n.to_str())
        .and_then(pch::key_of)
        .is_some();
    if !named || out.parent() != Some(here.as_path()) {
        return Err(format!(
            "{} is not a precompiled header's name in the scratch directory",
            out.display()
        ));
    }
    pch::build(&pch::Build {
        prefix,
        arch,
        flags,
        include_dirs,
        implied,
        out,
    })
    .map_err(|e| e.to_string())
}

/// Set (by the caller, in a GPU worker's environment) to capture fd 1 for device printf.
pub const CAPTURE_ENV: &str = "KILN_CAPTURE_STDOUT";

/// What the serve loop does after a request.
enum Next {
    More,
    Exit,
}

fn serve_on(
    input: &mut impl Read,
    output: &mut (impl Write + AsFd),
    tag: &str,
    context: &mut Option<cuda::context::GpuContext>,
) -> Result<Next, ProtocolError> {
    let (request, blobs): (Request, Vec<Vec<u8>>) = match protocol::read_message(input) {
        Ok(m) => m,
        Err(ProtocolError::Io(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
            return Ok(Next::Exit);
        }
        Err(e) => return Err(e),
    };
    let mut retire = false;
    let failed = |message: String| Response::Failed { message };
    match request {
        Request::Compile { version, .. }
        | Request::Evaluate { version, .. }
        | Request::BuildPch { version, .. }
            if version != PROTOCOL_VERSION =>
        {
            {
                let r = failed(format!(
                    "protocol version {version} requested; this worker speaks {PROTOCOL_VERSION}"
                ));
                protocol::write_message(output, &r, &[])
            }
            .map(|()| Next::More)
        }
        // Only ever an answer to the worker's own `Response::Reference`.
        Request::ReferenceOutputs { .. } => {
            let r = failed("reference outputs arrived with no evaluation asking for them".into());
            protocol::write_message(output, &r, &[]).map(|()| Next::More)
        }
        // Baselines: one request, then the worker exits (see cuda::baseline).
        Request::Baselines {
            version,
            problem,
            plan,
            kinds,
        } => {
            let r = match blobs.as_slice() {
                _ if version != PROTOCOL_VERSION => failed(format!(
                    "protocol version {version} requested; this worker speaks {PROTOCOL_VERSION}"
                )),
                [reference] => cuda::baseline::run(cuda::baseline::Job {
                    problem: &problem,
                    plan: &plan,
                    kinds: &kinds,
                    reference_artifact: reference,
                })
                .map_or_else(failed, |results| Response::Baselines { results }),
                _ => failed(format!("baselines need 1 blob, got {}", blobs.len())),
            };
            protocol::write_message(output, &r, &[]).map(|()| Next::Exit)
        }
        Request::BuildPch {
            prefix,
            arch,
            flags,
            include_dirs,
            implied,
            out,
            ..
        } => {
            let r = match build_pch(&prefix, &arch, &flags, &include_dirs, &implied, &out) {
                Ok(b) => Response::PchBuilt {
                    ok: true,
                    bytes: b.bytes,
                    duration_ms: b.duration_ms,
                    message: String::new(),
                },
                Err(message) => Response::PchBuilt {
                    ok: false,
                    bytes: 0,
                    duration_ms: 0.0,
                    message,
                },
            };
            protocol::write_message(output, &r, &[]).map(|()| Next::More)
        }
        Request::Compile {
            candidate,
            cc,
            timeout_ms,
            arch,
            include_dirs,
            triton,
            hosted,
            pch,
            ..
        } => {
            let timeout = Duration::from_millis(timeout_ms);
            let mut pch_outcome = None;
            let compiled = match candidate.language {
                Language::ModelNew | Language::ModelNewCpu => match &hosted {
                    Some(job) => {
                        let built =
                            crate::engine::hosted::build::build(&candidate.source, job, timeout);
                        crate::engine::hosted::gpu::kill_leftovers();
                        built.map(|b| (Some(b.artifact), b.info, String::new(), None))
                    }
                    None => Err("a hosted compile request without its python".into()),
                },
                Language::C => {
                    let c = host::compile::compile(&candidate, &cc, timeout);
                    Ok((c.artifact, c.info, c.message, None))
                }
                Language::Cuda => {
                    let arch = arch.unwrap_or_else(|| cuda::setup::DEFAULT_ARCH.to_string());
                    cuda::compile::compile(&candidate, &arch, &include_dirs, pch.as_deref()).map(
                        |c| {
                            pch_outcome = c.pch;
                            (c.artifact, c.info, c.message, None)
                        },
                    )
                }
                Language::Triton => match &triton {
                    Some(job) => triton::compile::compile(&candidate, job, timeout).map(|c| {
                        let verdict = (c.verdict != kiln_types::Verdict::CompileError
                            && c.artifact.is_none())
                        .then_some(c.verdict);
                        (c.artifact, c.info, c.message, verdict)
                    }),
                    None => Err("a triton compile request without its plan".into()),
                },
            };
            match compiled {
                Ok((artifact, info, message, verdict)) => {
                    let r = Response::Compiled {
                        ok: artifact.is_some(),
                        info,
                        message,
                        verdict,
                        pch: pch_outcome,
                    };
                    match &artifact {
                        Some(a) => protocol::write_message(output, &r, &[a]),
                        None => protocol::write_message(output, &r, &[]),
                    }
                }
                Err(e) => protocol::write_message(output, &failed(e), &[]),
            }
        }
        .map(|()| Next::More),
        Request::Evaluate {
            problem,
            candidate,
            plan,
            limits,
            hosted,
            ..
        } => {
            let [reference, artifact] = blobs.as_slice() else {
                let r = failed(format!("evaluate needs 2 blobs, got {}", blobs.len()));
                return protocol::write_message(output, &r, &[]).map(|()| Next::More);
            };
            // A torch reference is computed by the caller's trusted runner, asked between
            // candidate runs.
            // On a GPU, when the protocol stream is a socket (a warm worker's), the tensors
            // are shared with that runner instead: no tensor crosses host memory.
            let answer_bytes = protocol::reference_bound(&problem, kiln_types::Role::Output);
            let share_memory = is_socket(&*output);
            let io = std::cell::RefCell::new((&mut *input, &mut *output));
            let mut ask = |inputs: &host::evaluate::Inputs| {
                let mut io = io.borrow_mut();
                let (i, o) = &mut *io;
                ask_reference(&mut **i, &mut **o, inputs, answer_bytes)
            };
            let mut share = |call: cuda::workspace::SharedCall,
                             tensors: &[protocol::SharedTensor],
                             fds: Vec<OwnedFd>| {
                let mut io = io.borrow_mut();
                let (i, o) = &mut *io;
                share_reference(&mut **i, &mut **o, call, tensors, fds)
            };
            let torch_only = problem
                .reference
                .kernel(candidate.language.backend())
                .is_none()
                && problem.reference.torch.is_some();

            let hosted_job = hosted.as_ref().map(|h| crate::engine::hosted::Hosted {
                setup: &h.setup,
                load_timeout: Duration::from_millis(h.load_timeout_ms),
            });
            let r = match candidate.language {
                Language::ModelNewCpu | Language::C
                    if candidate.language.is_hosted() && hosted_job.is_none() =>
                {
                    failed("a hosted candidate's request carries no python with torch".into())
                }
                Language::C | Language::ModelNewCpu => {
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
                        torch: torch_only.then_some(&mut ask as &mut host::evaluate::TorchAsk),
                    };
                    let evaluated = match &hosted_job {
                        Some(h) if candidate.language.is_hosted() => {
                            crate::engine::hosted::cpu::evaluate(job, h)
                        }
                        _ => host::evaluate::evaluate(job),
                    };
                    match evaluated {
                        Ok(evaluation) => Response::Evaluated {
                            evaluation: Box::new(evaluation),
                            retire: false,
                        },
                        Err(message) => failed(message),
                    }
                }
                Language::Cuda => {
                    let job = cuda::workspace::Job {
                        problem: &problem,
                        candidate: &candidate,
                        plan: &plan,
                        reference_artifact: reference,
                        output_limit_bytes: limits.output_limit_bytes,
                        torch: gpu_torch(torch_only, share_memory, &mut ask, &mut share),
                    };
                    on_gpu(
                        context,
                        job,
                        cuda::context::Candidate::Launches(cuda::target::Code::Artifact(artifact)),
                        &mut retire,
                    )
                }
                Language::ModelNew => match &hosted_job {
                    Some(h) => {
                        let exe = std::env::args_os()
                            .next()
                            .map(PathBuf::from)
                            .unwrap_or_default();
                        // A folder of the evaluation's own (a warm worker serves many):
                        // no build cache of an earlier file is ever this file's.
                        let dir = match hosted_dir() {
                            Ok(d) => d,
                            Err(e) => {
                                let r = failed(e);
                                return protocol::write_message(output, &r, &[])
                                    .map(|()| Next::More);
                            }
                        };
                        let dir = RemovedOnDrop(dir);
                        let code = crate::engine::hosted::gpu_target::HostedCode {
                            artifact,
                            hosted: *h,
                            runner: host::runner_ctl::RunnerConfig {
                                exe: &exe,
                                tag,
                                artifact: &dir.0,
                                as_bytes: limits.memory_limit_bytes,
                                cpu_s: limits.cpu_limit_s,
                                output_limit: limits.output_limit_bytes,
                                load_timeout: h.load_timeout,
                            },
                            dir: &dir.0,
                        };
                        let job = cuda::workspace::Job {
                            problem: &problem,
                            candidate: &candidate,
                            plan: &plan,
                            reference_artifact: reference,
                            output_limit_bytes: limits.output_limit_bytes,
                            torch: gpu_torch(torch_only, share_memory, &mut ask, &mut share),
                        };
                        let r = on_gpu(
                            context,
                            job,
                            cuda::context::Candidate::Hosted(&code),
                            &mut retire,
                        );
                        crate::engine::hosted::gpu::kill_leftovers();
                        r
                    }
                    None => {
                        failed("a hosted candidate's request carries no python with torch".into())
                    }
                },
                Language::Triton => {
                    let lowered = triton::artifact::Artifact::decode(artifact)
                        .and_then(|a| triton::lower::lower(&candidate, &a));
                    match lowered {
                        Ok(l) => {
                            let job = cuda::workspace::Job {
                                problem: &problem,
                                candidate: &l.candidate,
                                plan: &plan,
                                reference_artifact: reference,
                                output_limit_bytes: limits.output_limit_bytes,
                                torch: gpu_torch(torch_only, share_memory, &mut ask, &mut share),
                            };
                            on_gpu(
                                context,
                                job,
                                cuda::context::Candidate::Launches(cuda::target::Code::Parts(
                                    &l.parts,
                                )),
                                &mut retire,
                            )
                        }
                        Err(message) => failed(message),
                    }
                }
            };
            let r = match r {
                Response::Evaluated { evaluation, .. } => {
                    Response::Evaluated { evaluation, retire }
                }
                other => other,
            };
            protocol::write_message(output, &r, &[])?;
            Ok(if retire { Next::Exit } else { Next::More })
        }
    }
}

/// A fresh folder for one hosted evaluation in the worker's scratch: a name no earlier
/// file could guess, created new (an earlier file can write the scratch, so a folder that
/// already exists is never taken over).
fn hosted_dir() -> Result<PathBuf, String> {
    let dir = std::env::current_dir()
        .map_err(|e| format!("scratch: {e}"))?
        .join(format!("hosted-{:016x}", rand::random::<u64>()));
    std::fs::create_dir(&dir).map_err(|e| format!("create {}: {e}", dir.display()))?;
    Ok(dir)
}

/// A folder removed (best effort) when dropped.
struct RemovedOnDrop(PathBuf);

impl Drop for RemovedOnDrop {
    fn drop(&mut self) {
        if let Err(e) = std::fs::remove_dir_all(&self.0) {
            tracing::debug!(dir = %self.0.display(), "cannot remove a hosted folder: {e}");
        }
    }
}

/// How a GPU evaluation reaches the torch reference: shared memory when the protocol
/// stream can carry descriptors, else the input set's bytes; `None` for a problem with a
/// cuda reference kernel.
fn gpu_torch<'a, 'b>(
    torch_only: bool,
    share_memory: bool,
    ask: &'a mut host::evaluate::TorchAsk<'b>,
    share: &'a mut cuda::workspace::TorchShare<'b>,
) -> Option<cuda::workspace::TorchReference<'a, 'b>> {
    match (torch_only, share_memory) {
        (false, _) => None,
        (true, true) => Some(cuda::workspace::TorchReference::Shared(share)),
        (true, false) => Some(cuda::workspace::TorchReference::Bytes(ask)),
    }
}

/// Whether `fd` is a socket (a warm GPU worker's protocol stream is; descriptors can then
/// travel on it).
fn is_socket(fd: &impl AsFd) -> bool {
    nix::sys::stat::fstat(fd.as_fd()).is_ok_and(|st| (st.st_mode & libc::S_IFMT) == libc::S_IFSOCK)
}

/// Asks the caller's torch runner to work in place in the shared `tensors`: compute the
/// reference, or make the problem's own inputs (`Response::ReferenceShared`, then the
/// descriptors); reads its answer (`Request::ReferenceOutputs` with no blobs): the
/// precision it reported.
fn share_reference(
    input: &mut impl Read,
    output: &mut (impl Write + AsFd),
    call: cuda::workspace::SharedCall,
    tensors: &[protocol::SharedTensor],
    fds: Vec<OwnedFd>,
) -> Result<String, String> {
    let msg = Response::ReferenceShared {
        tensors: tensors.to_vec(),
        inputs_seed: match call {
            cuda::workspace::SharedCall::Reference => None,
            cuda::workspace::SharedCall::Inputs { seed } => Some(seed),
        },
    };
    protocol::write_message(output, &msg, &[])
        .map_err(|e| format!("asking for the torch reference: {e}"))?;
    let borrowed: Vec<_> = fds.iter().map(AsFd::as_fd).collect();
    kiln_protocol::fds::send_fds(&*output, &borrowed)
        .map_err(|e| format!("sharing the tensors with the torch reference: {e}"))?;
    // Our descriptors close now; the runner holds its own until it has unmapped.
    drop(borrowed);
    drop(fds);
    let (req, blobs): (Request, _) = protocol::read_message(input)
        .map_err(|e| format!("reading the torch reference's answer: {e}"))?;
    match req {
        Request::ReferenceOutputs {
            error: None,
            precision,
            ..
        } if blobs.is_empty() => Ok(precision),
        Request::ReferenceOutputs { error: None, .. } => Err(format!(
            "the torch reference answered {} blobs for outputs it should have written in place",
            blobs.len()
        )),
        Request::ReferenceOutputs { error: Some(e), .. } => Err(e),
        other => Err(format!(
            "expected the torch reference's answer, got {other:?}"
        )),
    }
}

/// Sends an input set to the caller (`Response::Reference`) and reads the torch
/// reference's outputs back (`Request::ReferenceOutputs`).
fn ask_reference(
    input: &mut impl Read,
    output: &mut impl Write,
    inputs: &host::evaluate::Inputs,
    max_bytes: u64,
) -> Result<(Vec<Vec<u8>>, String), String> {
    let blobs: Vec<&[u8]> = inputs.iter().map(|(_, b)| b.as_slice()).collect();
    protocol::write_message(output, &Response::Reference, &blobs)
        .map_err(|e| format!("asking for the torch reference: {e}"))?;
    let (req, outputs): (Request, _) = protocol::read_message_within(input, max_bytes)
        .map_err(|e| format!("reading the torch reference's outputs: {e}"))?;
    match req {
        Request::ReferenceOutputs {
            error: None,
            precision,
            ..
        } => Ok((outputs, precision)),
        Request::ReferenceOutputs { error: Some(e), .. } => Err(e),
        other => Err(format!(
            "expected the torch reference's outputs, got {other:?}"
        )),
    }
}

/// Evaluates `job` on the warm GPU context (opened on first use). A context poisoned by
/// a fault or timeout is leaked and `retire` set: the worker exits after answering.
fn on_gpu(
    context: &mut Option<cuda::context::GpuContext>,
    job: cuda::workspace::Job,
    code: cuda::context::Candidate,
    retire: &mut bool,
) -> Response {
    let opened = match context.take() {
        Some(l) => Ok(l),
        None => cuda::context::GpuContext::open(),
    };
    match opened {
        Ok(mut l) => {
            let r = match l.evaluate(job, code) {
                Ok(evaluation) => Response::Evaluated {
                    evaluation: Box::new(evaluation),
                    retire: false,
                },
                Err(message) => Response::Failed { message },
            };
            match l.poisoned() {
                Some(why) => {
                    tracing::warn!(reason = %why, served = l.served(), "GPU context poisoned; this worker retires");
                    *retire = true;
                    // Leaked on purpose (see kiln_gpu::device): the process exits.
                    std::mem::forget(l);
                }
                None => *context = Some(l),
            }
            r
        }
        Err(message) => Response::Failed { message },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixStream;

    /// A socket can carry descriptors; a file or pipe cannot.
    #[test]
    fn only_a_socket_shares_memory() {
        let (a, _b) = UnixStream::pair().expect("pair");
        assert!(is_socket(&a));
        let f = tempfile::tempfile().expect("file");
        assert!(!is_socket(&f));
        let (r, _w) = std::io::pipe().expect("pipe");
        assert!(!is_socket(&r));
    }

    /// A GPU evaluation of a torch-only problem shares its tensors when the stream is a
    /// socket, sends bytes otherwise; a problem with a cuda reference kernel needs neither.
    #[test]
    fn the_torch_reference_is_reached_the_way_the_stream_allows() {
        let mut ask = |_: &host::evaluate::Inputs| -> Result<(Vec<Vec<u8>>, String), String> {
            Err("unused".into())
        };
        let mut share = |_: cuda::workspace::SharedCall,
                         _: &[protocol::SharedTensor],
                         _: Vec<OwnedFd>|
         -> Result<String, String> { Err("unused".into()) };
        let kind = |torch_only,
                    socket,
                    ask: &mut host::evaluate::TorchAsk,
                    share: &mut cuda::workspace::TorchShare| {
            match gpu_torch(torch_only, socket, ask, share) {
                None => "none",
                Some(cuda::workspace::TorchReference::Shared(_)) => "shared",
                Some(cuda::workspace::TorchReference::Bytes(_)) => "bytes",
            }
        };
        assert_eq!(kind(true, true, &mut ask, &mut share), "shared");
        assert_eq!(kind(true, false, &mut ask, &mut share), "bytes");
        assert_eq!(kind(false, true, &mut ask, &mut share), "none");
        assert_eq!(kind(false, false, &mut ask, &mut share), "none");
    }
}
