//! Context binaries found by the `qnn_binary` fuzz target (`fuzz/fuzz_targets/`), replayed
//! on every `cargo test` through `QnnLibrary::inspect_bytes`, the fuzz target's entry
//! point: each file under `tests/fuzz_regressions/qnn_binary/` must give metadata or a
//! one-line error. Inputs that crash inside libQnnSystem itself cannot be replayed in a
//! test process; they are kept in `fuzz/vendor-crashes/` (see `fuzz/README.md`).
//!
//! Needs `VLA_QNN_LIB_DIR`, as `tests/emulator.rs` (skips without it unless
//! `VLA_REQUIRE_QNN=1`).

use std::path::{Path, PathBuf};
use vla_qnn::{ContextBinary, LoadOptions, QnnError, QnnLibrary};

/// Tests in this process take turns with the library (see tests/emulator.rs).
static TURN: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// The library, held by one test at a time.
struct Held {
    lib: QnnLibrary,
    _turn: std::sync::MutexGuard<'static, ()>,
}

impl std::ops::Deref for Held {
    type Target = QnnLibrary;
    fn deref(&self) -> &QnnLibrary {
        &self.lib
    }
}

fn library() -> Option<Held> {
    let turn = TURN.lock().unwrap_or_else(|p| p.into_inner());
    let dir = vla_test_support::qnn_lib_dir()?;
    Some(Held {
        lib: QnnLibrary::load(&LoadOptions::htp(dir)).unwrap(),
        _turn: turn,
    })
}

fn files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    files
}

fn one_line(error: &QnnError) -> String {
    let message = error.to_string();
    assert!(
        !message.contains('\n') && !message.contains('\r'),
        "multi-line error: {message:?}"
    );
    message
}

#[test]
fn every_found_binary_gives_metadata_or_a_one_line_error() {
    let Some(lib) = library() else { return };
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fuzz_regressions/qnn_binary");
    let inputs = files(&dir);
    assert!(!inputs.is_empty());
    for input in inputs {
        let bytes = std::fs::read(&input).unwrap();
        match lib.inspect_bytes(&bytes, &input) {
            Ok(info) => assert!(!info.graphs.is_empty(), "{}", input.display()),
            Err(e) => {
                let message = one_line(&e);
                assert!(message.contains(&input.display().to_string()), "{message}");
            }
        }
    }
}

/// The in-memory entry point reads exactly what `ContextBinary::open` reads from the file.
#[test]
fn inspect_bytes_matches_open_on_every_golden_binary() {
    let Some(lib) = library() else { return };
    let golden = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../golden");
    let mut binaries = files(&golden.join("contexts"));
    for bundle in files(&golden.join("bundles")) {
        binaries.extend(files(&bundle.join("ctx")));
    }
    binaries.retain(|p| p.extension().is_some_and(|e| e == "bin"));
    assert!(binaries.len() >= 5, "{binaries:?}");
    for path in binaries {
        let opened = ContextBinary::open(&lib, &path).unwrap();
        let bytes = std::fs::read(&path).unwrap();
        let inspected = lib.inspect_bytes(&bytes, &path).unwrap();
        assert_eq!(&inspected, opened.info(), "{}", path.display());
    }
    let err = lib.inspect_bytes(&[], "received.bin").unwrap_err();
    assert_eq!(err.to_string(), "context binary received.bin: empty file");
}

/// libQnnSystem described a graph with an info version outside 1..=3; its union was read
/// as version 1 and a wild `graphName` pointer was dereferenced (SIGSEGV in our strlen).
#[test]
fn graph_info_of_unknown_version_is_refused_before_reading_its_fields() {
    let Some(lib) = library() else { return };
    let input = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fuzz_regressions/qnn_binary/graph-info-version-unknown.bin");
    let bytes = std::fs::read(&input).unwrap();
    let err = lib.inspect_bytes(&bytes, "graph.bin").unwrap_err();
    let message = one_line(&err);
    assert!(
        message.starts_with("context binary graph.bin: unusable metadata: graph 0 info version"),
        "{message}"
    );
}

/// libQnnSystem reported tensor dims whose product overflows: `TensorInfo::elements`
/// panicked (debug) or wrapped into a too-small buffer size (release).
#[test]
fn tensor_dims_whose_product_overflows_are_refused() {
    let Some(lib) = library() else { return };
    let input = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fuzz_regressions/qnn_binary/tensor-dims-overflow.bin");
    let bytes = std::fs::read(&input).unwrap();
    let err = lib.inspect_bytes(&bytes, "dims.bin").unwrap_err();
    let message = one_line(&err);
    assert!(message.contains("too large for any buffer"), "{message}");
}
