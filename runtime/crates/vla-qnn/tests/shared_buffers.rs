//! Shared buffers against Qualcomm's real library (the HTP emulator on x86_64) and the
//! memfd-backed rpcmem stand-in (`vla-test-support`).
//!
//! What the emulator does (QAIRT 2.51, onnxruntime-qnn 2.7.0): `memRegister` returns 1000
//! (QNN_COMMON_ERROR_NOT_SUPPORTED, "QnnMem API is not supported") for every descriptor,
//! so the path through registered memory is checked here up to that refusal, and its call
//! order and lifetimes against a stand-in table (`mem.rs`'s unit tests), and end to end
//! through `vla-test-support`'s QNN memory shim: the real emulator in front of which a
//! test-only memRegister maps the registered fd, so the graph computes on the registered
//! bytes (the binding's plumbing, not the NPU's registration).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use vla_qnn::{
    Backend, Context, ContextBinary, LoadOptions, QnnError, QnnLibrary, RpcMem, SharedBuffer,
};
use vla_test_support::{qnn_lib_dir, qnn_mem_shim, rpcmem_standin};

/// Tests in this process take turns with the library (as `emulator.rs`'s do: the HTP
/// emulator has crashed when several threads created backends and contexts at once).
static TURN: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn turn() -> std::sync::MutexGuard<'static, ()> {
    TURN.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn vision_bin() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../../golden/bundles/molmoact2-original/ctx/vision_socid77_archv73.bin")
}

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("vla-qnn-shm-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Live allocations of the stand-in library at `path`.
fn live_allocations(path: &Path) -> std::ffi::c_long {
    // SAFETY: the stand-in built by vla-test-support; its constructor-free C code.
    let lib = unsafe { libloading::Library::new(path) }.unwrap();
    // SAFETY: `long rpcmem_standin_live(void)` in rpcmem_standin.c.
    let live: libloading::Symbol<unsafe extern "C" fn() -> std::ffi::c_long> =
        unsafe { lib.get(b"rpcmem_standin_live\0") }.unwrap();
    // SAFETY: no arguments; reads a counter under the stand-in's lock.
    unsafe { live() }
}

#[test]
fn the_emulator_refuses_memory_registration_and_the_graph_keeps_client_buffers() {
    let _turn = turn();
    let Some(dir) = qnn_lib_dir() else { return };
    let tmp = scratch("refused");
    let Some(standin) = rpcmem_standin(&tmp) else {
        return;
    };
    let rpc = RpcMem::load(&standin).unwrap();
    assert_eq!(rpc.origin(), standin);

    let lib = Arc::new(QnnLibrary::load(&LoadOptions::htp(&dir)).unwrap());
    let backend = Backend::new(lib.clone()).unwrap();
    let binary = ContextBinary::open(&lib, vision_bin()).unwrap();
    let mut graph = Context::create(&backend, binary)
        .unwrap()
        .graph(None)
        .unwrap();

    let layout = graph.shared_layout(0);
    assert_eq!(layout.inputs, vec![0]);
    let in_len = graph.inputs()[0].byte_len().unwrap();
    assert_eq!(layout.outputs, vec![vla_qnn::align_region(in_len)]);
    let mut buffer = SharedBuffer::allocate(&rpc, layout.end).unwrap();
    assert!(buffer.fd() >= 0, "a real file descriptor");
    assert_eq!(live_allocations(&standin), 1);

    // Every descriptor is refused by the emulator: the error names the call and the code.
    let e = graph.bind_shared(&buffer, &layout).unwrap_err();
    match &e {
        QnnError::Call {
            operation, code, ..
        } => {
            assert_eq!((*operation, *code), ("memRegister", 1000), "{e}");
        }
        other => panic!("{other}"),
    }
    assert!(e.to_string().contains("not supported"), "{e}");
    assert!(!graph.is_shared());
    // Not bound: executing on the shared buffer is refused before QNN sees it.
    let e = graph.execute_shared(&mut buffer).unwrap_err().to_string();
    assert!(e.contains("not bound to this shared buffer"), "{e}");

    // A region outside the buffer never reaches QNN.
    let mut past = layout.clone();
    past.outputs[0] = layout.end;
    let e = graph.bind_shared(&buffer, &past).unwrap_err().to_string();
    assert!(e.contains("are not inside the"), "{e}");
    // Overlapping regions of one graph are refused too.
    let mut overlap = layout.clone();
    overlap.outputs[0] = 64;
    let e = graph
        .bind_shared(&buffer, &overlap)
        .unwrap_err()
        .to_string();
    assert!(e.contains("overlap those of tensor `pixel_values`"), "{e}");

    // The client-buffer path is untouched by the failed bindings.
    let mut io = graph.allocate_io();
    let before = graph.client_buffer_bytes();
    graph.execute_io(&mut io).unwrap();
    // Counted: what QNN copies for client buffers, inputs and outputs.
    let out_len = graph.outputs()[0].byte_len().unwrap();
    assert_eq!(
        graph.client_buffer_bytes() - before,
        (in_len + out_len) as u64
    );
    drop(graph);
    drop(buffer);
    assert_eq!(live_allocations(&standin), 0, "the allocation was freed");
    let _ = std::fs::remove_dir_all(&tmp);
}

/// Registrations the shim holds.
fn shim_registrations(dir: &Path) -> std::ffi::c_long {
    // SAFETY: the shim built by vla-test-support, already loaded by this process.
    let lib = unsafe { libloading::Library::new(dir.join("libQnnHtp.so")) }.unwrap();
    // SAFETY: `long qnn_mem_shim_live(void)` in qnn_mem_shim.c.
    let live: libloading::Symbol<unsafe extern "C" fn() -> std::ffi::c_long> =
        unsafe { lib.get(b"qnn_mem_shim_live\0") }.unwrap();
    // SAFETY: no arguments; reads a counter under the shim's lock.
    unsafe { live() }
}

#[test]
fn through_the_memory_shim_registered_outputs_are_bit_identical_to_client_buffers() {
    let _turn = turn();
    let Some(dir) = qnn_lib_dir() else { return };
    let tmp = scratch("shim");
    let Some(standin) = rpcmem_standin(&tmp) else {
        return;
    };
    let Some(shim) = qnn_mem_shim(&tmp.join("qnn"), &dir) else {
        return;
    };
    let rpc = RpcMem::load(&standin).unwrap();
    let lib = Arc::new(QnnLibrary::load(&LoadOptions::htp(&shim)).unwrap());
    let backend = Backend::new(lib.clone()).unwrap();
    let binary = ContextBinary::open(&lib, vision_bin()).unwrap();
    let mut graph = Context::create(&backend, binary)
        .unwrap()
        .graph(None)
        .unwrap();
    let npz = vla_npz::Npz::open(
        vision_bin()
            .parent()
            .unwrap()
            .join("../golden/vision_io.npz"),
    )
    .unwrap();
    let mut io = graph.allocate_io();
    let px = npz.array("pixel_values").unwrap().to_f32().unwrap();
    io.inputs[0].as_f32_mut().copy_from_slice(&px);
    graph.execute_io(&mut io).unwrap();

    let layout = graph.shared_layout(0);
    let mut buffer = SharedBuffer::allocate(&rpc, layout.end).unwrap();
    let input = graph.inputs()[0].byte_len().unwrap();
    buffer
        .bytes_mut(0..input)
        .unwrap()
        .copy_from_slice(io.inputs[0].as_bytes());
    graph.bind_shared(&buffer, &layout).unwrap();
    assert!(graph.is_shared());
    assert_eq!(shim_registrations(&shim), 2, "one registration per tensor");
    let counted = graph.client_buffer_bytes();
    for _ in 0..2 {
        graph.execute_shared(&mut buffer).unwrap();
        let out = graph.shared_output(0).unwrap();
        assert!(
            buffer.bytes(out).unwrap() == io.outputs[0].as_bytes(),
            "registered output differs from the client-buffer one"
        );
    }
    assert_eq!(
        graph.client_buffer_bytes(),
        counted,
        "no client buffer was used"
    );

    // Client buffers still work on a bound graph, and it goes back to its registrations.
    let mut other = graph.allocate_io();
    other.inputs[0]
        .as_bytes_mut()
        .copy_from_slice(io.inputs[0].as_bytes());
    graph.execute_io(&mut other).unwrap();
    assert!(other.outputs[0].as_bytes() == io.outputs[0].as_bytes());
    buffer
        .bytes_mut(layout.outputs[0]..layout.end)
        .unwrap()
        .fill(0);
    graph.execute_shared(&mut buffer).unwrap();
    assert!(buffer.bytes(graph.shared_output(0).unwrap()).unwrap() == io.outputs[0].as_bytes());

    // Whatever the drop order, the registrations go before the memory is freed.
    drop(buffer);
    assert_eq!(live_allocations(&standin), 1, "held by the registrations");
    graph.unbind_shared();
    assert_eq!(shim_registrations(&shim), 0);
    assert_eq!(live_allocations(&standin), 0);

    // The same graph on regions of an arena: each execute is handed the region of every
    // tensor (inputs shared, outputs exclusive), checked against its registration.
    let output = graph.outputs()[0].byte_len().unwrap();
    let counted = graph.client_buffer_bytes();
    let arena = SharedBuffer::allocate(&rpc, layout.end).unwrap();
    let [mut input_region, mut output_region]: [vla_qnn::Region; 2] = arena
        .into_regions(&[0..input, layout.outputs[0]..layout.outputs[0] + output])
        .unwrap()
        .try_into()
        .unwrap();
    input_region
        .as_bytes_mut()
        .copy_from_slice(io.inputs[0].as_bytes());
    let e = graph
        .bind_regions(&[(&input_region, 8)], &[(&output_region, 0)])
        .unwrap_err()
        .to_string();
    assert!(e.contains("are not inside its region"), "{e}");
    assert_eq!(
        shim_registrations(&shim),
        0,
        "nothing registered on a refusal"
    );
    graph
        .bind_regions(&[(&input_region, 0)], &[(&output_region, 0)])
        .unwrap();
    let e = graph
        .execute_regions(&[&output_region], &mut [&mut input_region])
        .unwrap_err()
        .to_string();
    assert!(e.contains("not in the region given"), "{e}");
    graph
        .execute_regions(&[&input_region], &mut [&mut output_region])
        .unwrap();
    assert!(output_region.as_bytes() == io.outputs[0].as_bytes());
    assert_eq!(
        graph.client_buffer_bytes(),
        counted,
        "no client buffer was used"
    );
    drop((input_region, output_region));
    assert_eq!(live_allocations(&standin), 1, "held by the registrations");
    drop(graph);
    assert_eq!(shim_registrations(&shim), 0);
    assert_eq!(live_allocations(&standin), 0);
    let _ = std::fs::remove_dir_all(&tmp);
}

#[test]
fn rpcmem_from_a_missing_library_is_named() {
    let e = RpcMem::load("/nonexistent/libcdsprpc.so")
        .unwrap_err()
        .to_string();
    assert!(
        e.starts_with("cannot load QNN library /nonexistent/libcdsprpc.so: dlopen failed"),
        "{e}"
    );
}
