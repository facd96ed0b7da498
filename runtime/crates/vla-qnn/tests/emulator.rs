//! The binding against Qualcomm's real libraries (the HTP emulator on x86_64).
//!
//! Needs `VLA_QNN_LIB_DIR` (set by `scripts/test.sh`). Without it these tests report that
//! they skipped, unless `VLA_REQUIRE_QNN=1`, which CI sets so a missing library fails.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use vla_qnn::{
    ApiVersion, Backend, BinaryImage, Context, ContextBinary, LoadOptions, QnnError, QnnLibrary,
    TensorKind,
};
use vla_tensor::{compare, ElementType};
use vla_test_support::qnn_lib_dir;

/// Tests in this process take turns with the library: the HTP emulator has crashed when
/// several threads created backends and contexts at once (the daemon uses one backend).
static TURN: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn turn() -> std::sync::MutexGuard<'static, ()> {
    TURN.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn bundle() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../golden/bundles/molmoact2-original")
}

fn vision_bin() -> PathBuf {
    bundle().join("ctx/vision_socid77_archv73.bin")
}

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("vla-qnn-test-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn load(dir: &Path) -> Arc<QnnLibrary> {
    Arc::new(QnnLibrary::load(&LoadOptions::htp(dir)).expect("load QNN"))
}

/// A binary planned from one description and given bytes whose metadata differ at its
/// context's creation is refused before QNN sees them; matching bytes make the context.
#[test]
fn bytes_taken_at_creation_must_match_the_planned_description() {
    let _turn = turn();
    let Some(dir) = qnn_lib_dir() else { return };
    let lib = load(&dir);
    let backend = Backend::new(lib.clone()).unwrap();
    let read = |path: PathBuf| {
        move || -> Result<BinaryImage, Box<dyn std::error::Error + Send + Sync>> {
            let file = std::fs::File::open(&path)?;
            let len = file.metadata()?.len();
            Ok(BinaryImage::read(file, len, &path, |_| {})?)
        }
    };
    let planned = || ContextBinary::open(&lib, vision_bin()).unwrap();
    let same = planned().with_bytes_at_creation(Box::new(read(vision_bin())));
    assert!(
        same.bytes().is_none(),
        "nothing held until the context is created"
    );
    let context = Context::create(&backend, same).expect("the bytes it was planned with");
    assert!(
        !context.binary().is_mapped(),
        "freed once the context exists"
    );
    let other = bundle().join("ctx/action_step_socid77_archv73.bin");
    let swapped = planned().with_bytes_at_creation(Box::new(read(other)));
    let e = Context::create(&backend, swapped).err().expect("refused");
    assert!(matches!(e, QnnError::Refused { .. }), "{e}");
    let line = e.to_string();
    assert!(
        line.contains("vision_socid77_archv73.bin")
            && line.contains("differs from the description")
            && !line.contains('\n'),
        "{line}"
    );
}

#[test]
fn reads_metadata_and_executes_with_parity() {
    let _turn = turn();
    let Some(dir) = qnn_lib_dir() else { return };
    let lib = load(&dir);
    assert_eq!(lib.core_api().major, 2);
    let backend = Backend::new(lib.clone()).unwrap();
    let binary = ContextBinary::open(&lib, vision_bin()).unwrap();
    let info = binary.info().clone();
    assert_eq!(info.soc_model, Some(77));
    assert_eq!(info.graphs.len(), 1);
    let g = &info.graphs[0];
    assert_eq!(g.inputs[0].name, "pixel_values");
    assert_eq!(g.inputs[0].kind, TensorKind::Input);
    assert_eq!(g.inputs[0].dims, vec![1, 2, 16, 588]);
    assert_eq!(g.outputs[0].name, "image_embeds");
    assert_eq!(g.outputs[0].element, Some(ElementType::F32));
    // The fixtures' graphs report their HTP spill-fill need, and it is none.
    assert_eq!(g.spill_fill_bytes, Some(0));
    assert_eq!(info.spill_fill_bytes(), 0);

    let mut graph = Context::create(&backend, binary)
        .unwrap()
        .graph(None)
        .unwrap();
    // The binary is unmapped once its context exists; the parity below runs without it.
    assert!(graph.context_binary().bytes().is_none());
    assert_eq!(graph.context_binary().size(), 159744);
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    let canonical = std::fs::canonicalize(vision_bin()).unwrap();
    assert!(
        !maps.contains(canonical.to_str().unwrap()),
        "binary still mapped:\n{maps}"
    );
    let npz = vla_npz::Npz::open(bundle().join("golden/vision_io.npz")).unwrap();
    let mut io = graph.allocate_io();
    let px = npz.array("pixel_values").unwrap().to_f32().unwrap();
    io.inputs[0].as_f32_mut().copy_from_slice(&px);
    graph.execute_io(&mut io).unwrap();
    let expected = npz.array("image_embeds").unwrap().to_f32().unwrap();
    let c = compare(io.outputs[0].as_f32(), &expected, 1e-3, 1e-2);
    assert!(c.cosine >= 0.9999, "cosine {}", c.cosine);

    // The same through caller-owned slices.
    let mut out = vec![0u8; io.outputs[0].len()];
    graph
        .execute(&[io.inputs[0].as_bytes()], &mut [&mut out[..]])
        .unwrap();
    assert_eq!(out, io.outputs[0].as_bytes(), "execution is deterministic");
}

#[test]
fn wrong_buffer_sizes_are_rejected_before_qnn_sees_them() {
    let _turn = turn();
    let Some(dir) = qnn_lib_dir() else { return };
    let lib = load(&dir);
    let backend = Backend::new(lib.clone()).unwrap();
    let binary = ContextBinary::open(&lib, vision_bin()).unwrap();
    let mut graph = Context::create(&backend, binary)
        .unwrap()
        .graph(None)
        .unwrap();
    let io = graph.allocate_io();
    let input = io.inputs[0].as_bytes();
    let mut short = vec![0u8; io.outputs[0].len() - 4];
    let err = graph.execute(&[input], &mut [&mut short[..]]).unwrap_err();
    assert!(matches!(err, QnnError::Buffer { .. }), "{err}");
    let msg = err.to_string();
    assert!(
        msg.contains("image_embeds") && msg.contains(&format!("{}", io.outputs[0].len())),
        "{msg}"
    );

    let mut out = vec![0u8; io.outputs[0].len()];
    let long_input = vec![0u8; input.len() + 1];
    let err = graph
        .execute(&[&long_input], &mut [&mut out[..]])
        .unwrap_err();
    assert!(err.to_string().contains("pixel_values"), "{err}");
    let err = graph.execute(&[], &mut [&mut out[..]]).unwrap_err();
    assert!(
        matches!(
            err,
            QnnError::BufferCount {
                expected: 1,
                found: 0,
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn bad_binaries_get_clear_errors() {
    let _turn = turn();
    let Some(dir) = qnn_lib_dir() else { return };
    let lib = load(&dir);
    let backend = Backend::new(lib.clone()).unwrap();
    let tmp = scratch("bad");
    let good = std::fs::read(vision_bin()).unwrap();

    let empty = tmp.join("empty.bin");
    std::fs::write(&empty, b"").unwrap();
    let err = ContextBinary::open(&lib, &empty).unwrap_err();
    assert_eq!(
        err.to_string(),
        format!("context binary {}: empty file", empty.display())
    );

    let err = ContextBinary::open(&lib, &tmp).unwrap_err();
    assert!(err.to_string().contains("not a regular file"), "{err}");

    let err = ContextBinary::open(&lib, tmp.join("missing.bin")).unwrap_err();
    assert!(err.to_string().contains("missing.bin"), "{err}");

    let truncated = tmp.join("truncated.bin");
    std::fs::write(&truncated, &good[..good.len() / 2]).unwrap();
    let err = ContextBinary::open(&lib, &truncated).unwrap_err();
    assert!(
        matches!(
            err,
            QnnError::Call {
                operation: "systemContextGetBinaryInfo",
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("truncated.bin"), "{err}");

    let garbage = tmp.join("garbage.bin");
    std::fs::write(&garbage, vec![0x5Au8; 4096]).unwrap();
    let err = ContextBinary::open(&lib, &garbage).unwrap_err();
    assert!(err.to_string().contains("garbage.bin"), "{err}");

    // Flip bytes in the payload (past the header the metadata comes from): either the
    // metadata read or the context creation must refuse it, never crash.
    let corrupt = tmp.join("corrupt.bin");
    let mut bytes = good.clone();
    let n = bytes.len();
    for b in &mut bytes[n / 2..n / 2 + 4096] {
        *b ^= 0xA5;
    }
    std::fs::write(&corrupt, &bytes).unwrap();
    match ContextBinary::open(&lib, &corrupt) {
        Err(e) => assert!(e.to_string().contains("corrupt.bin"), "{e}"),
        Ok(binary) => match Context::create(&backend, binary) {
            Err(e) => assert!(e.to_string().contains("corrupt.bin"), "{e}"),
            Ok(ctx) => {
                // Some payload bytes are not checked at load; the graph must still run
                // with checked buffers and report rather than crash.
                let mut g = ctx.graph(None).unwrap();
                let mut io = g.allocate_io();
                let _ = g.execute_io(&mut io);
            }
        },
    }
    let _ = std::fs::remove_dir_all(&tmp);
}

#[test]
fn wrong_graph_name_lists_the_graphs() {
    let _turn = turn();
    let Some(dir) = qnn_lib_dir() else { return };
    let lib = load(&dir);
    let backend = Backend::new(lib.clone()).unwrap();
    let binary = ContextBinary::open(&lib, vision_bin()).unwrap();
    let real = binary.info().graphs[0].name.clone();
    let ctx = Context::create(&backend, binary).unwrap();
    let err = ctx.graph(Some("no_such_graph")).err().expect("must fail");
    let msg = err.to_string();
    assert!(
        msg.contains("no graph named `no_such_graph`") && msg.contains(&real),
        "{msg}"
    );
    assert!(ctx.graph(Some(&real)).is_ok());
}

/// One executable handle per QNN graph: a second retrieval of a graph that has a live
/// `Graph` (from this context or a clone of it, on any thread) is refused, so two threads
/// can never execute one QNN graph at once; once dropped, it can be retrieved again.
#[test]
fn a_graph_has_one_executable_handle_at_a_time() {
    let _turn = turn();
    let Some(dir) = qnn_lib_dir() else { return };
    let lib = load(&dir);
    let backend = Backend::new(lib.clone()).unwrap();
    let ctx = Context::create(&backend, ContextBinary::open(&lib, vision_bin()).unwrap()).unwrap();
    let first = ctx.graph(None).unwrap();
    let clone = ctx.clone();
    let second = std::thread::spawn(move || clone.graph(None).map(|_| ()))
        .join()
        .unwrap();
    match second {
        Err(QnnError::GraphInUse { graph, .. }) => assert_eq!(graph, first.name()),
        Err(e) => panic!("expected GraphInUse, got {e}"),
        Ok(()) => panic!("a second executable handle of one QNN graph"),
    }
    drop(first);
    let mut again = ctx.graph(None).unwrap();
    let mut io = again.allocate_io();
    again.execute_io(&mut io).unwrap();
}

/// A context binary whose inode has another name (`ota install --link` of a RAUC artifact
/// repository, which vlad does not control) is read into a private copy, never mapped:
/// the other store truncating or rewriting its file cannot fault (SIGBUS) or change the
/// bytes QNN reads. A file with one link (vlad's own store) is mapped.
#[test]
fn a_binary_whose_inode_is_shared_is_copied_not_mapped() {
    let _turn = turn();
    let Some(dir) = qnn_lib_dir() else { return };
    let lib = load(&dir);
    let backend = Backend::new(lib.clone()).unwrap();
    let tmp = scratch("shared-inode");
    let theirs = tmp.join("artifact-repo.bin");
    std::fs::copy(vision_bin(), &theirs).unwrap();
    let ours = tmp.join("bundle.bin");
    std::fs::hard_link(&theirs, &ours).unwrap();
    let binary = ContextBinary::open(&lib, &ours).unwrap();
    // The other store truncates its file before the context exists.
    std::fs::OpenOptions::new()
        .write(true)
        .open(&theirs)
        .unwrap()
        .set_len(0)
        .unwrap();
    assert!(!binary.maps_the_file(), "a shared inode must not be mapped");
    let ctx = Context::create(&backend, binary).unwrap();
    let mut graph = ctx.graph(None).unwrap();
    let mut io = graph.allocate_io();
    graph.execute_io(&mut io).unwrap();

    let single = tmp.join("single.bin");
    std::fs::copy(vision_bin(), &single).unwrap();
    assert!(ContextBinary::open(&lib, &single).unwrap().maps_the_file());
    let _ = std::fs::remove_dir_all(&tmp);
}

#[test]
fn api_version_requirement_names_found_and_needed() {
    let _turn = turn();
    let Some(dir) = qnn_lib_dir() else { return };
    let mut opts = LoadOptions::htp(&dir);
    opts.min_core_api = ApiVersion::new(2, 99, 0);
    let err = QnnLibrary::load(&opts).unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, QnnError::ApiVersion { .. }), "{msg}");
    assert!(
        msg.contains("found HTP_QTI_AISW core API 2.")
            && msg.contains("need core API 2.99.0 ..= 2.40.x"),
        "{msg}"
    );

    let mut opts = LoadOptions::htp(&dir);
    opts.min_core_api = ApiVersion::new(3, 0, 0);
    assert!(
        QnnLibrary::load(&opts).is_err(),
        "a different major is never accepted"
    );
}

/// A library newer than the layouts this build knows is refused, naming the version found
/// and the window (it used to be accepted: any newer minor "satisfied" the minimum).
#[test]
fn a_library_newer_than_the_known_layouts_is_refused_naming_its_version() {
    let _turn = turn();
    let Some(dir) = qnn_lib_dir() else { return };
    // The emulator's libraries are QNN 2.51: core API 2.40, system API 1.15.
    let mut opts = LoadOptions::htp(&dir);
    opts.newest_core_api = ApiVersion::new(2, 39, 0);
    let msg = QnnLibrary::load(&opts).unwrap_err().to_string();
    assert!(
        msg.contains("found HTP_QTI_AISW core API 2.40.0")
            && msg.contains(
                "need core API 2.14.0 ..= 2.39.x (the versions whose layouts this build knows)"
            ),
        "{msg}"
    );
    let mut opts = LoadOptions::htp(&dir);
    opts.newest_system_api = ApiVersion::new(1, 14, 0);
    let msg = QnnLibrary::load(&opts).unwrap_err().to_string();
    assert!(
        msg.contains("system API 1.15.0") && msg.contains("need system API 1.3.0 ..= 1.14.x"),
        "{msg}"
    );
    // The default window is the newest checked one, and these libraries are in it.
    let lib = QnnLibrary::load(&LoadOptions::htp(&dir)).unwrap();
    assert!(lib
        .core_api()
        .within(ApiVersion::new(2, 14, 0), vla_qnn::NEWEST_KNOWN_CORE_API));
}

#[test]
fn api_windows_bound_the_minor_but_not_the_patch() {
    let (old, new) = (ApiVersion::new(2, 14, 0), ApiVersion::new(2, 40, 0));
    assert!(ApiVersion::new(2, 40, 7).within(old, new));
    assert!(ApiVersion::new(2, 14, 0).within(old, new));
    assert!(
        !ApiVersion::new(2, 41, 0).within(old, new),
        "newer minor: unknown layouts"
    );
    assert!(!ApiVersion::new(2, 13, 9).within(old, new));
    assert!(!ApiVersion::new(3, 0, 0).within(old, new));
}

#[test]
fn missing_or_unloadable_libraries_are_named() {
    let err = QnnLibrary::load(&LoadOptions::htp("/nonexistent/qnn")).unwrap_err();
    assert_eq!(
        err.to_string(),
        "QNN library directory /nonexistent/qnn does not exist (set qnn.lib_dir or VLA_QNN_LIB_DIR)"
    );
    let tmp = scratch("libs");
    let err = QnnLibrary::load(&LoadOptions::htp(&tmp)).unwrap_err();
    assert!(
        err.to_string().contains("libQnnHtp.so: no such file"),
        "{err}"
    );
    std::fs::write(tmp.join("libQnnHtp.so"), b"not an ELF file").unwrap();
    let err = QnnLibrary::load(&LoadOptions::htp(&tmp)).unwrap_err();
    assert!(matches!(err, QnnError::LibraryLoad { .. }), "{err}");
    assert!(err.to_string().starts_with(&format!(
        "cannot load QNN library {}: dlopen failed: ",
        tmp.join("libQnnHtp.so").display()
    )));
    // The loader's own error is kept typed, not only as text.
    let cause = err.loader_error().expect("the loader's error kept");
    assert!(err.to_string().ends_with(&cause.to_string()), "{cause:?}");
    // Named in the message, so not handed out again as the source.
    assert!(std::error::Error::source(&err).is_none());
    let _ = std::fs::remove_dir_all(&tmp);
}

#[test]
fn handles_outlive_their_owners_in_any_drop_order() {
    let _turn = turn();
    let Some(dir) = qnn_lib_dir() else { return };
    let lib = load(&dir);
    let backend = Backend::new(lib.clone()).unwrap();
    let binary = ContextBinary::open(&lib, vision_bin()).unwrap();
    let ctx = Context::create(&backend, binary).unwrap();
    let mut graph = ctx.graph(None).unwrap();
    // Drop the owners first: the graph keeps context, backend and library alive.
    drop(ctx);
    drop(backend);
    drop(lib);
    let mut io = graph.allocate_io();
    graph.execute_io(&mut io).unwrap();
}

#[test]
fn performance_votes_are_made_released_and_refused() {
    use std::time::{Duration, Instant};
    use vla_qnn::ffi::PowerConfig;
    use vla_qnn::{PerfGovernor, PerformanceMode, PerformanceVote, PowerConfigList};
    let _turn = turn();
    let Some(dir) = qnn_lib_dir() else { return };
    let lib = load(&dir);
    let backend = Backend::new(lib.clone()).unwrap();
    assert!(
        PerfGovernor::start(&backend, PerformanceMode::Off, Duration::from_millis(1))
            .unwrap()
            .is_none(),
        "off votes nothing"
    );

    // Every mode's list and the idle list are accepted (return code 0).
    let vote = PerformanceVote::create(&backend).unwrap();
    assert_ne!(vote.id(), 0, "id 0 would override every other voter");
    for mode in PerformanceMode::ALL {
        match PowerConfigList::for_mode(mode, vote.id()) {
            Some(list) => vote.apply(&list).unwrap(),
            None => assert_eq!(mode, PerformanceMode::Off),
        }
    }
    vote.apply(&PowerConfigList::relaxed(vote.id())).unwrap();
    // A refused option is a typed error carrying QNN's code, and the voter stays usable.
    let unknown = PowerConfigList::new(vec![PowerConfig {
        option: 99,
        payload: [0; 16],
    }]);
    let err = vote.apply(&unknown).unwrap_err();
    assert!(matches!(err, QnnError::Call { code: 13002, .. }), "{err}");
    // apply_raw hands out QNN's error handle unmasked (what errorGetMessage takes); on
    // the emulator the handle is the bare code.
    assert_eq!(vote.apply_raw(&unknown), Err(13002));
    assert!(err.to_string().contains("setPowerConfig"), "{err}");
    vote.apply(&PowerConfigList::relaxed(vote.id())).unwrap();
    drop(vote);

    // The governor: one vote at start, graphs execute under it, released when idle,
    // voted again by the next inference. The context exists before the governor starts,
    // and the counts are compared with what was released, not with fixed numbers: on a
    // loaded machine more than the idle time may pass before the first inference, which
    // releases and votes again as it should.
    let mut graph = Context::create(&backend, ContextBinary::open(&lib, vision_bin()).unwrap())
        .unwrap()
        .graph(None)
        .unwrap();
    let mut io = graph.allocate_io();
    let gov = PerfGovernor::start(&backend, PerformanceMode::Burst, Duration::from_millis(50))
        .unwrap()
        .unwrap();
    assert_eq!(gov.stats().votes, 1);
    {
        let _vote = gov.inference();
        assert!(gov.is_voted());
        graph.execute_io(&mut io).unwrap();
    }
    let t = Instant::now();
    // The governor's thread releases the vote after 50 ms idle; the bound is a hang guard.
    while gov.is_voted() && t.elapsed() < vla_test_support::HANG_GUARD {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(!gov.is_voted(), "released after the idle time");
    let idle = gov.stats();
    assert!(idle.releases >= 1, "{idle:?}");
    assert_eq!(idle.votes, idle.releases, "every vote released: {idle:?}");
    {
        let _vote = gov.inference();
        assert!(gov.is_voted());
        graph.execute_io(&mut io).unwrap();
    }
    let stats = gov.stats();
    assert_eq!(
        (stats.votes, stats.refused),
        (idle.votes + 1, 0),
        "{stats:?}"
    );

    // Teardown: the governor outlives graph, context and backend handles; its id is
    // destroyed before the backend it keeps alive.
    drop(graph);
    drop(backend);
    drop(lib);
    drop(gov);
}
