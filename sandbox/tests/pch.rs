//! NVRTC precompiled headers through the real compile path (`kiln_sandbox::compile`, the
//! jailed `kiln-worker`), no GPU needed: the first compile of an include prefix builds its
//! header and starts from it, the next one starts from it too, and both give the artifact
//! a plain compile gives; a header that does not fit, or is damaged, costs speed only
//! and never leaks NVRTC's words into the candidate's log; the folder stays within its
//! bound. Skips, with the reason printed, without NVRTC or the toolkit's headers. Compile
//! times are printed (`--nocapture`), never asserted.

mod common;

use std::path::{Path, PathBuf};
use std::time::Instant;

use kiln_sandbox::SandboxConfig;
use kiln_sandbox::engine::cuda::pch;
use kiln_types::Candidate;

fn candidate(source: &str) -> Candidate {
    serde_json::from_value(serde_json::json!({
        "problem": "vecadd-cuda-1m", "language": "cuda", "source": source,
        "launches": [{"kernel": "k", "grid": [1, 1, 1], "block": [128, 1, 1]}],
    }))
    .expect("candidate")
}

/// A sandbox config with NVRTC and the toolkit's headers, its PCH folder in the test's
/// scratch.
fn setup() -> Option<(tempfile::TempDir, SandboxConfig)> {
    let _ = tracing_subscriber::fmt()
        .with_env_filter("debug")
        .try_init();
    if kiln_sandbox::kiln_gpu::facts::nvrtc_version().is_none() {
        println!("SKIP: NVRTC is not loadable here");
        return None;
    }
    let (dir, mut cfg) = common::setup();
    cfg.find_cuda_headers(&[]);
    if !cfg.cuda_headers.found() {
        println!(
            "SKIP: no CUDA toolkit headers: {}",
            cfg.cuda_headers.describe()
        );
        return None;
    }
    // Building a header takes about as long as a cold compile of its includes.
    cfg.compile_timeout = std::time::Duration::from_secs(30);
    assert!(cfg.pch_dir.is_some(), "on by default");
    Some((dir, cfg))
}

/// A block reduction over `T` with the includes given: each test uses its own includes,
/// so that the process-wide state of one (a key held back) never meets another's.
fn reduce(includes: &str, extra: &str) -> String {
    format!(
        "// a block reduction\n{includes}{extra}\
         __global__ void k(const float* x, float* y) {{\n\
           typedef cub::BlockReduce<float, 128> R;\n\
           __shared__ typename R::TempStorage t;\n\
           float v = R(t).Sum(x[threadIdx.x]);\n\
           if (threadIdx.x == 0) y[blockIdx.x] = v;\n\
         }}\n"
    )
}

/// The PCH files in the folder.
fn headers_in(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|d| {
            d.flatten()
                .map(|e| e.path())
                .filter(|p| {
                    p.file_name()
                        .and_then(|n| n.to_str())
                        .and_then(kiln_sandbox::kiln_gpu::cxx::pch::key_of)
                        .is_some()
                })
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// Whether the compile's jail ran with address-space randomization off.
fn aslr_off(out: &kiln_sandbox::CompileOutcome) -> bool {
    out.layers.iter().any(|l| l.name == "aslr" && !l.active)
}

/// Compiles `source`; its artifact, its log, NVRTC's and the whole compile's milliseconds
/// (panics on a compile error). A compile of a source with a toolkit include prefix runs
/// with address-space randomization off; any other with it on.
fn compile(cfg: &SandboxConfig, source: &str) -> (Vec<u8>, String, f64, f64) {
    let t0 = Instant::now();
    let out = kiln_sandbox::compile(cfg, &common::problem("vecadd-cuda-1m"), &candidate(source))
        .expect("compile runs");
    let wall = t0.elapsed().as_secs_f64() * 1e3;
    if let Some(f) = &out.failure {
        panic!("compile failed: {}\n{}", f.message, out.info.log);
    }
    let planned = cfg.pch_dir.is_some()
        && kiln_sandbox::kiln_gpu::cxx::pch::prefix(source).is_some_and(|p| p.has_toolkit_header());
    let crashed = out.info.log.ends_with("compiled again without it)") && !aslr_off(&out);
    assert!(
        aslr_off(&out) == planned || crashed,
        "randomization off only for a compile with a precompiled header: {:?}",
        out.layers
    );
    (
        out.artifact.expect("artifact"),
        out.info.log,
        out.info.duration_ms,
        wall,
    )
}

/// The two encoded artifacts hold the same manifest and machine code. A compile from a
/// PCH may list some local symbols (constexpr variable template instances) in another
/// order in the CUBIN's symbol table; every other section is byte-equal and the symbols
/// are the same set.
fn assert_same_code(a: &[u8], b: &[u8]) {
    use kiln_sandbox::kiln_gpu::artifact::Artifact;
    if a == b {
        return;
    }
    let (a, b) = (
        Artifact::decode(a).expect("artifact"),
        Artifact::decode(b).expect("artifact"),
    );
    assert_eq!(a.manifest, b.manifest);
    let (sa, sb) = (elf::sections(&a.image), elf::sections(&b.image));
    let strip = |s: &Vec<(String, Vec<u8>)>| -> Vec<(String, Vec<u8>)> {
        s.iter()
            .filter(|(n, _)| n != ".symtab" && n != ".strtab")
            .cloned()
            .collect()
    };
    assert!(
        strip(&sa) == strip(&sb),
        "a section other than the symbol table differs"
    );
    assert_eq!(elf::symbols(&a.image), elf::symbols(&b.image));
}

/// Just enough ELF64 reading to compare two CUBINs section by section.
mod elf {
    fn u16_at(d: &[u8], o: usize) -> usize {
        u16::from_le_bytes([d[o], d[o + 1]]) as usize
    }
    fn u32_at(d: &[u8], o: usize) -> usize {
        u32::from_le_bytes(d[o..o + 4].try_into().expect("4")) as usize
    }
    fn u64_at(d: &[u8], o: usize) -> usize {
        u64::from_le_bytes(d[o..o + 8].try_into().expect("8")) as usize
    }
    fn name(strtab: &[u8], at: usize) -> String {
        let end = strtab[at..].iter().position(|&b| b == 0).unwrap_or(0);
        String::from_utf8_lossy(&strtab[at..at + end]).into_owned()
    }
    /// (section name, contents), in file order.
    pub fn sections(d: &[u8]) -> Vec<(String, Vec<u8>)> {
        let (shoff, shentsize, shnum, shstrndx) = (
            u64_at(d, 0x28),
            u16_at(d, 0x3a),
            u16_at(d, 0x3c),
            u16_at(d, 0x3e),
        );
        let raw: Vec<(usize, usize, usize)> = (0..shnum)
            .map(|i| {
                let h = shoff + i * shentsize;
                (u32_at(d, h), u64_at(d, h + 0x18), u64_at(d, h + 0x20))
            })
            .collect();
        let (_, so, ss) = raw[shstrndx];
        let strtab = &d[so..so + ss];
        raw.iter()
            .map(|&(n, o, s)| {
                let body = if o + s <= d.len() {
                    d[o..o + s].to_vec()
                } else {
                    Vec::new()
                };
                (name(strtab, n), body)
            })
            .collect()
    }
    /// Every symbol's name, sorted.
    pub fn symbols(d: &[u8]) -> Vec<String> {
        let s = sections(d);
        let find = |n: &str| s.iter().find(|(name, _)| name == n).map(|x| x.1.clone());
        let (Some(symtab), Some(strtab)) = (find(".symtab"), find(".strtab")) else {
            return Vec::new();
        };
        let mut out: Vec<String> = symtab
            .chunks_exact(24)
            .map(|e| name(&strtab, u32_at(e, 0)))
            .collect();
        out.sort();
        out
    }
}

#[test]
fn a_repeated_include_prefix_compiles_from_its_precompiled_header() {
    let Some((_dir, cfg)) = setup() else {
        return;
    };
    let dir = cfg.pch_dir.clone().expect("dir");
    let includes = "#include <cuda_fp16.h>\n#include <cub/block/block_reduce.cuh>\n";
    let source = reduce(includes, "");
    let mut plain_cfg = cfg.clone();
    plain_cfg.pch_dir = None;
    let (plain, plain_log, plain_ms, plain_wall) = compile(&plain_cfg, &source);
    assert!(!plain_log.contains("precompiled"), "{plain_log}");
    assert!(headers_in(&dir).is_empty());

    let (first, log1, ms1, wall1) = compile(&cfg, &source);
    assert!(log1.ends_with("precompiled header: used"), "{log1}");
    assert_eq!(
        headers_in(&dir).len(),
        1,
        "the first compile built the header"
    );
    let (second, log2, ms2, wall2) = compile(&cfg, &source);
    assert!(log2.ends_with("precompiled header: used"), "{log2}");
    assert_eq!(
        first, second,
        "two compiles from the header: the same bytes"
    );
    assert_same_code(&first, &plain);
    // Another kernel after the same includes, with a #define after them: the same header.
    let other = reduce(includes, "#define SCALE 2.0f\n").replace("= v;", "= SCALE * v;");
    let (_, log3, ms3, wall3) = compile(&cfg, &other);
    assert!(log3.ends_with("precompiled header: used"), "{log3}");
    assert_eq!(headers_in(&dir).len(), 1);
    println!(
        "nvrtc / jailed compile: cold {plain_ms:.0} / {plain_wall:.0} ms; first (builds the \
         header) {ms1:.0} / {wall1:.0} ms; again {ms2:.0} / {wall2:.0} ms; another kernel \
         {ms3:.0} / {wall3:.0} ms; counts {:?}",
        pch::counts()
    );
}

#[test]
fn a_define_before_the_includes_compiles_as_before() {
    let Some((_dir, cfg)) = setup() else {
        return;
    };
    let source = reduce(
        "#include <cuda_bf16.h>\n#include <cub/block/block_reduce.cuh>\n",
        "",
    );
    let defined = format!("#define BLOCK 128\n{source}");
    let (_, log, _, _) = compile(&cfg, &defined);
    assert!(
        !log.contains("precompiled") && !log.contains("#630"),
        "{log}"
    );
    assert!(
        headers_in(cfg.pch_dir.as_ref().expect("dir")).is_empty(),
        "no prefix, no header"
    );
}

/// Flips a byte of `file` every `step` bytes, from byte `first` on.
fn damage(file: &Path, first: usize, step: usize) {
    let mut bytes = std::fs::read(file).expect("read");
    for i in (first..bytes.len()).step_by(step) {
        bytes[i] ^= 0xff;
    }
    let mut perms = std::fs::metadata(file).expect("meta").permissions();
    #[allow(clippy::permissions_set_readonly_false)]
    perms.set_readonly(false);
    std::fs::set_permissions(file, perms).expect("writable");
    std::fs::write(file, &bytes).expect("damage");
}

/// The key file names a candidate's header would have (with and without a private root).
fn names_for(cfg: &SandboxConfig, source: &str) -> Vec<String> {
    let c = candidate(source);
    let plan = pch::Plan::for_candidate(cfg, &c).expect("a plan");
    [true, false]
        .iter()
        .filter_map(|&root| plan.key(cfg, &c, root))
        .map(|k| kiln_sandbox::kiln_gpu::cxx::pch::file_name(&k))
        .collect()
}

#[test]
fn an_incompatible_or_damaged_header_costs_speed_only() {
    let Some((_dir, cfg)) = setup() else {
        return;
    };
    let dir = cfg.pch_dir.clone().expect("dir");
    let a = reduce(
        "#include <cuda_fp8.h>\n#include <cub/block/block_reduce.cuh>\n",
        "",
    );
    let (artifact_a, log, _, _) = compile(&cfg, &a);
    assert!(log.ends_with("precompiled header: used"), "{log}");
    let built = headers_in(&dir);
    assert_eq!(built.len(), 1);

    // Another prefix whose key names A's header: NVRTC finds its directives incompatible
    // and compiles from the headers; its warning stays out of the log.
    let b = reduce(
        "#include <cuda_fp8.h>\n#include <cub/warp/warp_reduce.cuh>\n#include <cub/block/block_reduce.cuh>\n",
        "",
    );
    let mut plain_cfg = cfg.clone();
    plain_cfg.pch_dir = None;
    let (plain_b, _, _, _) = compile(&plain_cfg, &b);
    for name in names_for(&cfg, &b) {
        std::fs::copy(&built[0], dir.join(name)).expect("copy");
    }
    let (artifact_b, log, _, _) = compile(&cfg, &b);
    assert!(
        log.ends_with(
            "precompiled header: not used (the source's leading directives differ from the header's)"
        ),
        "{log}"
    );
    assert!(!log.contains("#630") && !log.contains("Remark"), "{log}");
    assert_eq!(artifact_b, plain_b);

    // A's header with bytes flipped: whatever NVRTC makes of it, A still compiles to the
    // same code, and the file is gone afterwards.
    damage(&built[0], 4096, 4096);
    let (again, log, _, _) = compile(&cfg, &a);
    assert_same_code(&again, &artifact_a);
    assert!(
        !log.contains("Warning #") && !log.contains("Remark"),
        "{log}"
    );
    assert!(
        !built[0].exists(),
        "the corrupted header was deleted: {log:?}"
    );
    println!(
        "after the corrupted header: {log:?}; counts {:?}",
        pch::counts()
    );
}

#[test]
fn the_folder_keeps_at_most_its_bound() {
    let Some((_dir, cfg)) = setup() else {
        return;
    };
    let dir = cfg.pch_dir.clone().expect("dir");
    std::fs::create_dir_all(&dir).expect("dir");
    // The folder full of old (fake) headers.
    let old = std::time::SystemTime::now() - std::time::Duration::from_secs(3600);
    let mut fakes = Vec::new();
    for i in 0..pch::MAX_FILES {
        let p = dir.join(kiln_sandbox::kiln_gpu::cxx::pch::file_name(
            &format!("{:02x}", 0xe0 + i).repeat(32),
        ));
        std::fs::write(&p, b"not a pch").expect("fake");
        std::fs::File::options()
            .write(true)
            .open(&p)
            .and_then(|f| f.set_modified(old + std::time::Duration::from_secs(i as u64)))
            .expect("mtime");
        fakes.push(p);
    }
    let source = reduce(
        "#include <cuda_fp16.h>\n#include <cuda_bf16.h>\n#include <cub/block/block_reduce.cuh>\n",
        "",
    );
    let (_, log, _, _) = compile(&cfg, &source);
    assert!(log.ends_with("precompiled header: used"), "{log}");
    let now = headers_in(&dir);
    assert_eq!(now.len(), pch::MAX_FILES, "{now:?}");
    assert!(!fakes[0].exists(), "the least recently used went");
    assert!(fakes[1..].iter().all(|f| f.exists()));
}

/// Damaged this way, the header makes NVRTC 13 crash (SIGSEGV): the compile is done
/// again without it, and the header deleted.
#[test]
fn a_header_that_crashes_the_compiler_is_dropped_and_the_compile_done_again() {
    let Some((_dir, cfg)) = setup() else {
        return;
    };
    let dir = cfg.pch_dir.clone().expect("dir");
    let source = reduce(
        "#include <cooperative_groups.h>\n#include <cub/block/block_reduce.cuh>\n",
        "",
    );
    let (first, log, _, _) = compile(&cfg, &source);
    assert!(log.ends_with("precompiled header: used"), "{log}");
    let built = headers_in(&dir);
    assert_eq!(built.len(), 1);
    damage(&built[0], 1_000_000, 1 << 20);
    let (again, log, _, _) = compile(&cfg, &source);
    assert_same_code(&again, &first);
    assert!(!log.contains("Warning #"), "{log}");
    // Here NVRTC 13 crashes on it; another may warn instead: either way, not used.
    assert!(log.contains("precompiled header: not used ("), "{log}");
    assert!(
        !built[0].exists(),
        "the damaged header was deleted: {log:?}"
    );
    println!(
        "after the crashing header: {log:?}; counts {:?}",
        pch::counts()
    );
}
