//! HTP devices (NSPs) on the real libraries (the HTP emulator on x86_64): what
//! `deviceGetPlatformInfo` reports, a device created per reported NSP with a config
//! selecting it, contexts created on it that execute, and a device id the platform does
//! not report refused. Needs `VLA_QNN_LIB_DIR`, as tests/emulator.rs.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use vla_qnn::{Backend, Context, ContextBinary, LoadOptions, QnnError, QnnLibrary};
use vla_test_support::qnn_lib_dir;

fn vision_bin() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../../golden/bundles/molmoact2-original/ctx/vision_socid77_archv73.bin")
}

/// One test (the emulator is used by one thread of this process at a time).
#[test]
fn a_device_per_reported_nsp_holds_contexts_and_an_unreported_id_is_refused() {
    let Some(dir) = qnn_lib_dir() else { return };
    let lib = Arc::new(QnnLibrary::load(&LoadOptions::htp(&dir)).unwrap());
    let backend = Backend::new(lib.clone()).unwrap();
    let info = backend
        .platform_info()
        .unwrap()
        .expect("QNN 2.x providers have deviceGetPlatformInfo");
    // The emulator: "platform info v1: 1 device(s): device 0 (v68, soc 30, 4 MB VTCM,
    // cores 0 (type 0))". A QCS9075 should report two.
    println!("{}", info.describe());
    assert_eq!(info.version, 1);
    assert!(!info.devices.is_empty(), "{}", info.describe());
    // The offsets read against the library's own report: every field lands on a value
    // an HTP can have (a shifted offset reads padding, a neighbour or a pointer's bytes).
    for d in &info.devices {
        assert_eq!(d.device_type, 0, "on-chip: {}", info.describe());
        assert!(
            d.cores.iter().all(|c| c.core_type <= 1 && c.id < 16),
            "{}",
            info.describe()
        );
        assert!(
            matches!(d.arch, Some(68 | 69 | 73 | 75 | 79 | 81)),
            "HTP arch: {}",
            info.describe()
        );
        assert!(
            matches!(d.vtcm_mb, Some(1..=64)),
            "VTCM MB: {}",
            info.describe()
        );
        assert!(
            matches!(d.soc_model, Some(1..=1000)),
            "SoC: {}",
            info.describe()
        );
    }
    for d in &info.devices {
        assert!(!d.cores.is_empty(), "{}", info.describe());
        let on = backend.on_device(d).unwrap();
        assert_eq!(on.device_id(), Some(d.id));
        let context =
            Context::create(&on, ContextBinary::open(&lib, vision_bin()).unwrap()).unwrap();
        let mut graph = context.graph(None).unwrap();
        let mut io = graph.allocate_io();
        graph.execute_io(&mut io).unwrap();
        assert!(io.outputs[0].as_f32().iter().all(|x| x.is_finite()));
        // The context and the graph go first, then the device (held by them), then the
        // backend: nothing here frees out of order, whatever the drop order.
        drop(on);
        drop(context);
        graph.execute_io(&mut io).unwrap();
    }
    let mut absent = info.devices[0].clone();
    absent.id = info.devices.iter().map(|d| d.id).max().unwrap() + 1;
    match backend.on_device(&absent) {
        Err(QnnError::Call {
            operation, code, ..
        }) => {
            assert_eq!((operation, code), ("deviceCreate", 14001), "invalid config");
        }
        other => panic!(
            "device {} accepted: {:?}",
            absent.id,
            other.map(|b| b.device_id())
        ),
    }
}
