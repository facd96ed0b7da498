//! What the test suites share (a dev-dependency only, never linked into vlad): where the
//! repository is, where the QNN libraries are, and the one rule for a test that cannot
//! run on this machine. Such a test says that it skipped and why; under
//! `VLA_REQUIRE_QNN=1` (a missing QNN library) or `VLA_REQUIRE_ALL_TESTS=1` (anything
//! else: no C compiler, no `unshare`, not root), which `scripts/test.sh` sets as CI does,
//! it fails instead, so CI never passes a test that did not run. And the one bound on a
//! test's wait for an event ([`HANG_GUARD`]). And the one way a test builds a C file
//! ([`compile_c`]), or a C client of the rings against the C ring client library
//! ([`compile_ring_client_program`]). And the one writer of a test's instruction pack
//! ([`InstructionPack`]).

#![forbid(unsafe_code)]

use std::path::{Path, PathBuf};
use std::time::Duration;

/// The bound on a test's wait for something a program or thread reports (READY, a pid
/// file, a chunk, a commit, a new writer). Each such wait also ends as soon as what it
/// waits on has exited or failed, so this bound only turns a hang into a failure: it is
/// no estimate of how fast, or how loaded, this machine is. Never reached in a passing
/// run (docs/testing.md lists every wait).
pub const HANG_GUARD: Duration = Duration::from_secs(900);

/// The repository root (canonical).
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../..")
        .canonicalize()
        .expect("the repository root")
}

/// The QNN library directory (`VLA_QNN_LIB_DIR`, as `scripts/test.sh` sets it), or `None`
/// after saying the test is skipped; under `VLA_REQUIRE_QNN=1` a missing directory fails
/// the test instead.
pub fn qnn_lib_dir() -> Option<PathBuf> {
    match std::env::var_os("VLA_QNN_LIB_DIR") {
        Some(dir) if !dir.is_empty() => Some(PathBuf::from(dir)),
        _ => {
            assert!(
                std::env::var("VLA_REQUIRE_QNN").as_deref() != Ok("1"),
                "VLA_REQUIRE_QNN=1 but VLA_QNN_LIB_DIR is not set"
            );
            eprintln!("skipped: VLA_QNN_LIB_DIR is not set");
            None
        }
    }
}

/// A test that cannot run here for `reason` (e.g. "not root: cannot check the root-run
/// ownership"): says it skipped; under `VLA_REQUIRE_ALL_TESTS=1` fails instead. The
/// caller returns afterwards.
pub fn cannot_run(reason: &str) {
    assert!(
        std::env::var("VLA_REQUIRE_ALL_TESTS").as_deref() != Ok("1"),
        "VLA_REQUIRE_ALL_TESTS=1 but {reason}"
    );
    eprintln!("SKIPPED: {reason}");
}

/// Compiles the C file `source` to `out` with the system compiler (`$CC`, else `cc`) under
/// the strict flags every C check here uses (C11, `-O2 -Wall -Wextra -Werror -pedantic`)
/// and `extra` (`-shared -fPIC`, `-I DIR`), asserting it compiles. `None` when this run
/// cannot: no usable compiler ([`cannot_run`]), or one that builds for another
/// architecture than the tests run as (a cross build: said, and skipped).
pub fn compile_c(source: &Path, out: &Path, extra: &[&std::ffi::OsStr]) -> Option<PathBuf> {
    let cc = native_cc(source)?;
    compile_strict(&cc, source, out, extra, &[]);
    Some(out.to_owned())
}

/// Compiles the C program `source` to `out` against the C ring client library
/// (`runtime/ring-c`: `vla_ring_client.h` and `vla_ring.h`, `libvla_ring_client.a`), under
/// the same strict flags and rules as [`compile_c`]. The library comes from its own
/// Makefile (`build/ring-c/<arch>/`), run once per test process.
pub fn compile_ring_client_program(source: &Path, out: &Path) -> Option<PathBuf> {
    let cc = native_cc(source)?;
    static LIBRARY: std::sync::OnceLock<Option<PathBuf>> = std::sync::OnceLock::new();
    let library = LIBRARY.get_or_init(build_ring_client).as_ref()?;
    let ring_c = repo_root().join("runtime/ring-c");
    let include = repo_root().join("runtime/include");
    compile_strict(
        &cc,
        source,
        out,
        &[
            "-I".as_ref(),
            include.as_os_str(),
            "-I".as_ref(),
            ring_c.as_os_str(),
        ],
        &[library.as_os_str()],
    );
    Some(out.to_owned())
}

/// `make -C runtime/ring-c`: the library for this machine in `build/ring-c/<arch>/`, the
/// one place set-up, CI and the tests share (the Makefile only rebuilds what changed, and
/// renames each output into place, so parallel builds never see half a file). The static
/// library's path, or `None` after [`cannot_run`] when there is no `make`.
fn build_ring_client() -> Option<PathBuf> {
    let ring_c = repo_root().join("runtime/ring-c");
    let mut make = std::process::Command::new("make");
    make.args(["-s", "-C"]).arg(&ring_c).arg("all");
    if let Ok(cc) = std::env::var("CC") {
        make.arg(format!("CC={cc}"));
    }
    match make.output() {
        Ok(out) => assert!(
            out.status.success(),
            "make -C runtime/ring-c failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        ),
        Err(e) => {
            cannot_run(&format!("no `make` for the C ring client library: {e}"));
            return None;
        }
    }
    Some(repo_root().join(format!(
        "build/ring-c/{}/libvla_ring_client.a",
        std::env::consts::ARCH
    )))
}

/// The system C compiler (`$CC`, else `cc`) when it builds for the architecture these tests
/// run as; else `None`, said ([`cannot_run`] when there is no compiler at all).
fn native_cc(source: &Path) -> Option<String> {
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".to_string());
    let machine = match std::process::Command::new(&cc).arg("-dumpmachine").output() {
        Ok(o) if o.status.success() => String::from_utf8_lossy(&o.stdout).trim().to_string(),
        Ok(o) => {
            cannot_run(&format!("`{cc} -dumpmachine` failed: {}", o.status));
            return None;
        }
        Err(e) => {
            cannot_run(&format!(
                "no C compiler `{cc}` for {}: {e}",
                source.display()
            ));
            return None;
        }
    };
    if !machine.starts_with(std::env::consts::ARCH) {
        eprintln!(
            "skipping {}: `{cc}` builds for {machine}, these tests run as {} (cross build)",
            source.display(),
            std::env::consts::ARCH
        );
        return None;
    }
    Some(cc)
}

/// `cc` under the strict flags: `before` the source (flags), `after` it (libraries).
fn compile_strict(
    cc: &str,
    source: &Path,
    out: &Path,
    before: &[&std::ffi::OsStr],
    after: &[&std::ffi::OsStr],
) {
    let result = std::process::Command::new(cc)
        .args([
            "-std=c11",
            "-O2",
            "-Wall",
            "-Wextra",
            "-Werror",
            "-pedantic",
        ])
        .args(before)
        .arg(source)
        .args(after)
        .arg("-o")
        .arg(out)
        .output()
        .unwrap_or_else(|e| panic!("run {cc}: {e}"));
    assert!(
        result.status.success(),
        "cc failed on {}:\n{}",
        source.display(),
        String::from_utf8_lossy(&result.stderr)
    );
}

/// Copies the directory tree `src` to `dst` (created), e.g. a fixture bundle a test edits.
/// Panics naming the path on any I/O error: it is test set-up.
pub fn copy_dir(src: &Path, dst: &Path) {
    std::fs::create_dir_all(dst).unwrap_or_else(|e| panic!("{}: {e}", dst.display()));
    for entry in std::fs::read_dir(src).unwrap_or_else(|e| panic!("{}: {e}", src.display())) {
        let entry = entry.unwrap();
        let to = dst.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &to);
        } else {
            std::fs::copy(entry.path(), &to)
                .unwrap_or_else(|e| panic!("{} -> {}: {e}", entry.path().display(), to.display()));
        }
    }
}

/// Builds the memfd-backed stand-in for libcdsprpc.so's rpcmem functions
/// (`rpcmem_standin.c`: `rpcmem_alloc`, `rpcmem_free`, `rpcmem_to_fd`, each allocation a
/// shared memfd mapping with a real file descriptor) into `dir` with the C compiler
/// (`$CC`, else `cc`) and returns the library's path; `None` after [`cannot_run`] when no
/// compiler works here. It exists for tests only and is never built into vlad.
pub fn rpcmem_standin(dir: &Path) -> Option<PathBuf> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("rpcmem_standin.c");
    let out = dir.join("libcdsprpc.so");
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".to_string());
    let status = std::process::Command::new(&cc)
        .args(["-shared", "-fPIC", "-O1", "-o"])
        .arg(&out)
        .arg(&src)
        .arg("-lpthread")
        .status();
    match status {
        Ok(s) if s.success() => Some(out),
        Ok(s) => {
            cannot_run(&format!("{cc} could not build the rpcmem stand-in ({s})"));
            None
        }
        Err(e) => {
            cannot_run(&format!(
                "no C compiler ({cc}: {e}) for the rpcmem stand-in"
            ));
            None
        }
    }
}

/// Builds the test-only `libQnnHtp.so` of `qnn_mem_shim.c` into `dir`, in front of the real
/// one in `real_lib_dir` (and linked as `libQnnSystem.so`, forwarding to the real system
/// library): the real library with memRegister/memDeRegister of HTP SHARED_BUFFER
/// descriptors added, so the emulator, which refuses every registration, executes on
/// registered memory. Returns the directory to load QNN from; `None` after [`cannot_run`]
/// when no C compiler works here. It checks the caller's plumbing, not what the NPU's
/// registration does, and is never built into vlad.
pub fn qnn_mem_shim(dir: &Path, real_lib_dir: &Path) -> Option<PathBuf> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("qnn_mem_shim.c");
    std::fs::create_dir_all(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".to_string());
    let status = std::process::Command::new(&cc)
        .args(["-shared", "-fPIC", "-O1", "-o"])
        .arg(dir.join("libQnnHtp.so"))
        .arg(&src)
        .args(["-ldl", "-lpthread"])
        .status();
    match status {
        Ok(s) if s.success() => {}
        Ok(s) => {
            cannot_run(&format!("{cc} could not build the QNN memory shim ({s})"));
            return None;
        }
        Err(e) => {
            cannot_run(&format!(
                "no C compiler ({cc}: {e}) for the QNN memory shim"
            ));
            return None;
        }
    }
    let real_dir = dir.join("real-lib-dir");
    std::fs::write(&real_dir, real_lib_dir.to_string_lossy().as_bytes())
        .unwrap_or_else(|e| panic!("{}: {e}", real_dir.display()));
    let system = dir.join("libQnnSystem.so");
    let _ = std::fs::remove_file(&system);
    std::os::unix::fs::symlink("libQnnHtp.so", &system)
        .unwrap_or_else(|e| panic!("{}: {e}", system.display()));
    Some(dir.to_owned())
}

/// An instruction pack's two files as the importer lays them out (`pack.json` and
/// `rows.npy`), unsigned: `rows` holds `[instructions, text_tokens, context_width]` f32,
/// one block per instruction in order.
pub struct InstructionPack<'a> {
    /// The pack's label.
    pub label: &'a str,
    /// The bundle's name it goes with.
    pub name: &'a str,
    /// The bundle's version it goes with.
    pub version: &'a str,
    /// The oldest runtime that may attach it.
    pub min_runtime_version: &'a str,
    /// `[text_tokens, context_width]` of each instruction's rows.
    pub shape: [usize; 2],
    /// (id, text) per instruction; the text is its own normalized form.
    pub instructions: &'a [(u32, &'a str)],
    /// The rows, `instructions.len() * shape[0] * shape[1]` values.
    pub rows: &'a [f32],
}

impl InstructionPack<'_> {
    /// Writes the pack's files into `dir` (made if missing).
    pub fn write(&self, dir: &Path) {
        std::fs::create_dir_all(dir).unwrap();
        let [m, e] = self.shape;
        let array =
            vla_npz::Array::from_f32("rows", &[self.instructions.len(), m, e], self.rows).unwrap();
        std::fs::write(dir.join("rows.npy"), vla_npz::write_npy(&array)).unwrap();
        let instructions: Vec<serde_json::Value> = self
            .instructions
            .iter()
            .map(|(id, text)| serde_json::json!({"id": id, "text": text, "normalized": text}))
            .collect();
        let pack = serde_json::json!({
            "format": 1, "kind": "instruction-pack", "label": self.label,
            "name": self.name, "version": self.version, "policy": "fastwam",
            "soc_model": 77, "htp_arch": 73, "min_runtime_version": self.min_runtime_version,
            "rows": "rows.npy", "text_tokens": m, "context_width": e,
            "instructions": instructions,
        });
        std::fs::write(
            dir.join("pack.json"),
            serde_json::to_vec_pretty(&pack).unwrap(),
        )
        .unwrap();
    }
}
