//! Devices per NSP against a stand-in QNN library (tests/c/fake_qnn.c, built here with the
//! system `cc`): the calls vla-qnn makes, in order; each context created on the device of
//! its NSP; and the teardown order (contexts, then their devices, then the default
//! device, the backend and the log), whatever order the owner drops things in. The
//! stand-in reports two NSPs, which the emulator cannot (it reports one). The HTP
//! performance votes go to a voter per NSP, each with its own id.

use std::path::{Path, PathBuf};
use vla_qnn::{
    create_contexts, Backend, Context, ContextBinary, ContextPlacement, LoadOptions, PerfGovernor,
    PerformanceMode, QnnError, QnnLibrary,
};

struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Builds the stand-in library into `dir`, or says why this run cannot.
fn build_fake(dir: &Path) -> Option<PathBuf> {
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c/fake_qnn.c");
    vla_test_support::compile_c(
        &source,
        &dir.join("libfakeqnn.so"),
        &["-shared".as_ref(), "-fPIC".as_ref()],
    )
}

#[test]
fn each_context_lands_on_its_nsp_device_and_teardown_goes_contexts_devices_backend_log() {
    let scratch =
        Scratch(std::env::temp_dir().join(format!("vla-fake-qnn-{}", std::process::id())));
    std::fs::create_dir_all(&scratch.0).unwrap();
    let Some(fake) = build_fake(&scratch.0) else {
        return;
    };
    // The test's own handle on the library keeps it (and its call log) loaded after
    // vla-qnn has closed it.
    // SAFETY: the stand-in built above; its initializers do nothing.
    let probe = unsafe { libloading::Library::new(&fake) }.unwrap();
    let calls = || -> String {
        // SAFETY: `fake_qnn_calls` has this signature in tests/c/fake_qnn.c.
        let f: libloading::Symbol<unsafe extern "C" fn() -> *const core::ffi::c_char> =
            unsafe { probe.get(b"fake_qnn_calls\0") }.unwrap();
        // SAFETY: takes no arguments and returns the library's static log buffer.
        let text = unsafe { f() };
        // SAFETY: a NUL-terminated static buffer of the library, loaded while `probe` is.
        unsafe { std::ffi::CStr::from_ptr(text) }
            .to_string_lossy()
            .into_owned()
    };
    let binary = |name: &str| {
        let path = scratch.0.join(name);
        std::fs::write(&path, b"not a real context binary").unwrap();
        path
    };
    let (a, b, c) = (binary("a.bin"), binary("b.bin"), binary("c.bin"));
    {
        let opts = LoadOptions {
            backend_lib: "libfakeqnn.so".into(),
            system_lib: "libfakeqnn.so".into(),
            ..LoadOptions::htp(&scratch.0)
        };
        let lib = std::sync::Arc::new(QnnLibrary::load(&opts).unwrap());
        let backend = Backend::new(lib.clone()).unwrap();
        let info = backend.platform_info().unwrap().unwrap();
        assert_eq!(
            info.describe(),
            "platform info v1: 2 device(s): device 0 (v73, soc 77, 8 MB VTCM, cores 0 (type 0)); \
             device 1 (v73, soc 77, 8 MB VTCM, cores 0 (type 0))"
        );
        let nsp0 = backend.on_device(info.device(0).unwrap()).unwrap();
        let nsp1 = backend.on_device(info.device(1).unwrap()).unwrap();
        assert_eq!(
            (nsp0.device_id(), nsp1.device_id(), backend.device_id()),
            (Some(0), Some(1), None)
        );
        let mut absent = info.devices[1].clone();
        absent.id = 2;
        match backend.on_device(&absent) {
            Err(QnnError::Call { code: 14001, .. }) => {}
            other => panic!("NSP 2 accepted: {:?}", other.map(|b| b.device_id())),
        }
        let ca = Context::create(&nsp0, ContextBinary::open(&lib, &a).unwrap()).unwrap();
        let cb = Context::create(&nsp1, ContextBinary::open(&lib, &b).unwrap()).unwrap();
        let cc = Context::create(&nsp0, ContextBinary::open(&lib, &c).unwrap()).unwrap();
        // Dropped in the worst order: backends (and their devices) before the contexts
        // on them, the library handle first of all.
        drop(lib);
        drop(nsp0);
        drop(nsp1);
        drop(backend);
        drop(cb);
        drop(ca);
        drop(cc);
    }
    let log = calls();
    let expected = "\
logCreate
backendCreate
deviceCreate default
deviceGetPlatformInfo
deviceFreePlatformInfo ours
deviceCreate nsp 0 cores 1 core0 0 ext soc 77 arch 73 vtcm 8
deviceCreate nsp 1 cores 1 core0 0 ext soc 77 arch 73 vtcm 8
deviceCreate refused: nsp 2
contextCreateFromBinary on 0x200 -> 0x1001
contextCreateFromBinary on 0x201 -> 0x1002
contextCreateFromBinary on 0x200 -> 0x1003
contextFree 0x1002
deviceFree 0x201
contextFree 0x1001
contextFree 0x1003
deviceFree 0x200
deviceFree 0x100
backendFree 0x20
logFree 0x10
";
    assert_eq!(log, expected, "calls:\n{log}");

    // A placement: a and c share session 0 on NSP 0, b is session 1 on NSP 1. Each
    // session's contexts are created together on its device; they come back in the
    // binaries' order.
    // SAFETY: `fake_qnn_reset` has this signature in tests/c/fake_qnn.c.
    let reset: libloading::Symbol<unsafe extern "C" fn()> =
        unsafe { probe.get(b"fake_qnn_reset\0") }.unwrap();
    // SAFETY: clears the library's log; nothing else uses the library now.
    unsafe { reset() };
    {
        let opts = LoadOptions {
            backend_lib: "libfakeqnn.so".into(),
            system_lib: "libfakeqnn.so".into(),
            ..LoadOptions::htp(&scratch.0)
        };
        let lib = std::sync::Arc::new(QnnLibrary::load(&opts).unwrap());
        let backend = Backend::new(lib.clone()).unwrap();
        let info = backend.platform_info().unwrap().unwrap();
        let nsp0 = backend.on_device(info.device(0).unwrap()).unwrap();
        let nsp1 = backend.on_device(info.device(1).unwrap()).unwrap();
        let mut placement = ContextPlacement::default();
        placement.place(&a, 0, &nsp0);
        placement.place(&b, 1, &nsp1);
        placement.place(&c, 0, &nsp0);
        let placed = backend.with_placement(placement);
        drop((nsp0, nsp1));
        let binaries = [&a, &b, &c]
            .iter()
            .map(|p| ContextBinary::open(&lib, p).unwrap())
            .collect();
        let group = create_contexts(&placed, binaries).map_err(|e| e.1).unwrap();
        let paths: Vec<&Path> = group.contexts.iter().map(|c| c.binary().path()).collect();
        assert_eq!(paths, vec![a.as_path(), b.as_path(), c.as_path()]);
        drop(placed);
        drop(backend);
        drop(group);
    }
    let log = calls();
    let expected = "\
logCreate
backendCreate
deviceCreate default
deviceGetPlatformInfo
deviceFreePlatformInfo ours
deviceCreate nsp 0 cores 1 core0 0 ext soc 77 arch 73 vtcm 8
deviceCreate nsp 1 cores 1 core0 0 ext soc 77 arch 73 vtcm 8
contextCreateFromBinary on 0x200 -> 0x1001
contextCreateFromBinary on 0x200 -> 0x1002
contextCreateFromBinary on 0x201 -> 0x1003
contextFree 0x1001
contextFree 0x1003
deviceFree 0x201
contextFree 0x1002
deviceFree 0x200
deviceFree 0x100
backendFree 0x20
logFree 0x10
";
    assert_eq!(log, expected, "calls:\n{log}");

    // Spill-fill groups follow the sessions: binaries that report spill-fill sizes
    // (1, 2, 4 and 1 MiB) placed as d + f in session 0 on NSP 0 and e + g in session 1
    // on NSP 1 make two groups, each sized by its own largest member and joined through
    // its own first context.
    // SAFETY: as above.
    unsafe { reset() };
    {
        let spill = |name: &str, bytes: u64| {
            let path = scratch.0.join(name);
            std::fs::write(&path, format!("spill-fill {bytes}")).unwrap();
            path
        };
        let (d, e, f, g) = (
            spill("d.bin", 1 << 20),
            spill("e.bin", 2 << 20),
            spill("f.bin", 4 << 20),
            spill("g.bin", 1 << 20),
        );
        let opts = LoadOptions {
            backend_lib: "libfakeqnn.so".into(),
            system_lib: "libfakeqnn.so".into(),
            ..LoadOptions::htp(&scratch.0)
        };
        let lib = std::sync::Arc::new(QnnLibrary::load(&opts).unwrap());
        let backend = Backend::new(lib.clone()).unwrap();
        let info = backend.platform_info().unwrap().unwrap();
        let nsp0 = backend.on_device(info.device(0).unwrap()).unwrap();
        let nsp1 = backend.on_device(info.device(1).unwrap()).unwrap();
        let mut placement = ContextPlacement::default();
        placement.place(&d, 0, &nsp0);
        placement.place(&e, 1, &nsp1);
        placement.place(&f, 0, &nsp0);
        placement.place(&g, 1, &nsp1);
        let placed = backend.with_placement(placement);
        let binaries: Vec<ContextBinary> = [&d, &e, &f, &g]
            .iter()
            .map(|p| ContextBinary::open(&lib, p).unwrap())
            .collect();
        let sizes: Vec<u64> = binaries
            .iter()
            .map(|b| b.info().spill_fill_bytes())
            .collect();
        assert_eq!(sizes, vec![1 << 20, 2 << 20, 4 << 20, 1 << 20]);
        let group = create_contexts(&placed, binaries).map_err(|e| e.1).unwrap();
        assert!(
            matches!(group.sharing, vla_qnn::SpillFillSharing::Shared { .. }),
            "{}",
            group.sharing
        );
        drop((group, placed, nsp0, nsp1, backend));
    }
    let log = calls();
    let created: Vec<&str> = log
        .lines()
        .filter(|l| l.starts_with("contextCreateFromBinary"))
        .collect();
    assert_eq!(
        created,
        vec![
            "contextCreateFromBinary on 0x200 group first 0x0 max 4194304 -> 0x1001",
            "contextCreateFromBinary on 0x200 group first 0x1001 max 4194304 -> 0x1002",
            "contextCreateFromBinary on 0x201 group first 0x0 max 2097152 -> 0x1003",
            "contextCreateFromBinary on 0x201 group first 0x1003 max 2097152 -> 0x1004",
        ],
        "calls:\n{log}"
    );

    // Performance votes on both NSPs: a voter per device, each voting with its own id,
    // and the idle release relaxing both; the ids go before the backend. A device the
    // platform lacks fails the start, and the voter already made is destroyed.
    // SAFETY: as above.
    unsafe { reset() };
    {
        let opts = LoadOptions {
            backend_lib: "libfakeqnn.so".into(),
            system_lib: "libfakeqnn.so".into(),
            ..LoadOptions::htp(&scratch.0)
        };
        let lib = std::sync::Arc::new(QnnLibrary::load(&opts).unwrap());
        let backend = Backend::new(lib).unwrap();
        let governor = PerfGovernor::start_on(
            &backend,
            &[1, 0, 1],
            PerformanceMode::Burst,
            std::time::Duration::from_millis(1),
        )
        .unwrap()
        .unwrap();
        assert_eq!(governor.power_config_ids(), vec![(0, 0x50), (1, 0x51)]);
        // The releaser relaxes once no inference has run for 1 ms; wait for that event
        // (the bound only guards against a hang).
        let t = std::time::Instant::now();
        while governor.stats().releases == 0 {
            assert!(
                t.elapsed() < vla_test_support::HANG_GUARD,
                "no idle release"
            );
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert_eq!((governor.stats().votes, governor.stats().refused), (1, 0));
        drop(governor);
        match PerfGovernor::start_on(
            &backend,
            &[0, 2],
            PerformanceMode::Burst,
            std::time::Duration::from_secs(60),
        ) {
            Err(QnnError::Call {
                operation: "createPowerConfigId",
                code: 13001,
                subject,
                ..
            }) => assert_eq!(subject, "device 2, core 0"),
            Err(e) => panic!("device 2 refused with {e}"),
            Ok(_) => panic!("a vote on device 2 accepted"),
        }
        drop(backend);
    }
    let log = calls();
    let expected = "\
logCreate
backendCreate
deviceCreate default
createPowerConfigId device 0 core 0 -> 0x50
setPowerConfig 0x50 dcvs for 0x50 core target 0xa0, 3 configs
createPowerConfigId device 1 core 0 -> 0x51
setPowerConfig 0x51 dcvs for 0x51 core target 0xa0, 3 configs
setPowerConfig 0x50 dcvs for 0x50 core target 0x40, 2 configs
setPowerConfig 0x51 dcvs for 0x51 core target 0x40, 2 configs
destroyPowerConfigId 0x50
destroyPowerConfigId 0x51
createPowerConfigId device 0 core 0 -> 0x50
setPowerConfig 0x50 dcvs for 0x50 core target 0xa0, 3 configs
createPowerConfigId refused: device 2 core 0
destroyPowerConfigId 0x50
deviceFree 0x100
backendFree 0x20
logFree 0x10
";
    assert_eq!(log, expected, "calls:\n{log}");
}
