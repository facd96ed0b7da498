//! Spill-fill groups on the real libraries (the HTP emulator on x86_64).
//!
//! Every fixture binary reports a spill-fill size of 0, so [`create_contexts`] makes no
//! group for them; the group path itself is driven here with sizes given by hand.
//! Needs `VLA_QNN_LIB_DIR`, as tests/emulator.rs.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use vla_qnn::{
    create_contexts, create_contexts_sharing, Backend, BinaryImage, Context, ContextBinary,
    LoadOptions, QnnError, QnnLibrary, SpillFillSharing,
};
use vla_tensor::compare;
use vla_test_support::qnn_lib_dir;

fn ctx_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../golden/bundles/molmoact2-original/ctx")
}

const COMPONENTS: [&str; 3] = ["vision", "llm_split0", "action_context"];

fn binaries(lib: &Arc<QnnLibrary>) -> Vec<ContextBinary> {
    COMPONENTS
        .iter()
        .map(|c| {
            ContextBinary::open(lib, ctx_dir().join(format!("{c}_socid77_archv73.bin"))).unwrap()
        })
        .collect()
}

/// Vision parity through the first context of a set (it must work however it was made).
fn vision_parity(contexts: &[Context]) {
    let mut graph = contexts[0].graph(None).unwrap();
    let npz = vla_npz::Npz::open(ctx_dir().join("../golden/vision_io.npz")).unwrap();
    let mut io = graph.allocate_io();
    let px = npz.array("pixel_values").unwrap().to_f32().unwrap();
    io.inputs[0].as_f32_mut().copy_from_slice(&px);
    graph.execute_io(&mut io).unwrap();
    let expected = npz.array("image_embeds").unwrap().to_f32().unwrap();
    let c = compare(io.outputs[0].as_f32(), &expected, 1e-3, 1e-2);
    assert!(c.cosine >= 0.9999, "cosine {}", c.cosine);
    for c in &contexts[1..] {
        let mut g = c.graph(None).unwrap();
        let mut io = g.allocate_io();
        g.execute_io(&mut io).unwrap();
    }
}

/// One test (the emulator is used by one thread of this process at a time).
#[test]
fn spill_fill_group_decision_refusal_and_fallback() {
    let Some(dir) = qnn_lib_dir() else { return };
    let lib = Arc::new(QnnLibrary::load(&LoadOptions::htp(&dir)).unwrap());
    let backend = Backend::new(lib.clone()).unwrap();

    // The fixtures report spill-fill 0: no group, contexts as before.
    let set = binaries(&lib);
    assert!(set.iter().all(|b| b.info().spill_fill_bytes() == 0));
    let g = create_contexts(&backend, set).map_err(|e| e.1).unwrap();
    assert_eq!(g.sharing, SpillFillSharing::NotNeeded);
    assert_eq!(g.contexts.len(), COMPONENTS.len());
    vision_parity(&g.contexts);
    drop(g);

    // A group asked for by hand. The emulator refuses REGISTER_MULTI_CONTEXTS for the
    // first context (5010, invalid config; it accepts other HTP custom context options
    // through the same config list), so this drives the fallback: every context is
    // created without a group and executes as before.
    let g = create_contexts_sharing(&backend, binaries(&lib), Some(1 << 20))
        .map_err(|e| e.1)
        .unwrap();
    match &g.sharing {
        SpillFillSharing::Refused {
            bytes,
            grouped,
            error,
        } => {
            assert_eq!((*bytes, *grouped), (1 << 20, 0));
            assert!(error.contains("QNN error 5010"), "{error}");
            assert!(error.contains("vision_socid77_archv73.bin"), "{error}");
        }
        other => panic!("the emulator accepted the group ({other}): check the shared path"),
    }
    assert_eq!(g.contexts.len(), COMPONENTS.len());
    assert!(
        g.contexts.iter().all(|c| c.binary().bytes().is_none()),
        "all unmapped"
    );
    vision_parity(&g.contexts);
    drop(g);

    // An error that persists without the group is the binary's own and is returned.
    let tmp = std::env::temp_dir().join(format!("vla-qnn-group-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).unwrap();
    let mut bytes = std::fs::read(ctx_dir().join("vision_socid77_archv73.bin")).unwrap();
    let n = bytes.len();
    bytes[n / 2..n / 2 + 4096]
        .iter_mut()
        .for_each(|b| *b ^= 0xA5);
    let corrupt = tmp.join("corrupt.bin");
    std::fs::write(&corrupt, &bytes).unwrap();
    if let Ok(bad) = ContextBinary::open(&lib, &corrupt) {
        let mut set = binaries(&lib);
        set.insert(1, bad);
        if let Err((index, e)) = create_contexts_sharing(&backend, set, Some(1 << 20)) {
            assert_eq!(index, 1);
            assert!(e.to_string().contains("corrupt.bin"), "{e}");
        }
    }
    let _ = std::fs::remove_dir_all(&tmp);

    // Bytes given at each context's creation: one binary's image alive at a time, and a
    // refusal of the first (tried with the group, then would be retried without) is the
    // error returned, not "already used".
    let deferred = |refuse: bool| -> Vec<ContextBinary> {
        binaries(&lib)
            .into_iter()
            .enumerate()
            .map(|(i, b)| {
                let path = b.path().to_owned();
                b.with_bytes_at_creation(Box::new(move || {
                    if refuse && i == 0 {
                        return Err("not the bytes signed".into());
                    }
                    let file = std::fs::File::open(&path)?;
                    let len = file.metadata()?.len();
                    Ok(BinaryImage::read(file, len, &path, |_| {})?)
                }))
            })
            .collect()
    };
    BinaryImage::reset_census_peak();
    let g = create_contexts_sharing(&backend, deferred(false), Some(1 << 20))
        .map_err(|e| e.1)
        .unwrap();
    let census = BinaryImage::census();
    assert_eq!((census.live, census.peak), (0, 1), "{census:?}");
    vision_parity(&g.contexts);
    drop(g);
    let (index, e) = create_contexts_sharing(&backend, deferred(true), Some(1 << 20))
        .err()
        .expect("refused");
    assert_eq!(index, 0);
    assert!(matches!(e, QnnError::Refused { .. }), "{e}");
    assert!(e.to_string().contains("not the bytes signed"), "{e}");
}
