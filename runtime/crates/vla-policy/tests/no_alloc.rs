//! One inference after warm-up allocates nothing on the Rust heap (a counting global
//! allocator proves it), on client buffers and on HTP shared buffers (through the memory
//! shim and the rpcmem stand-in). The QNN backend's own C++ allocations are outside this
//! count.

mod common;

use std::sync::Arc;
use vla_alloc_count::allocations;
use vla_policy::{Bundle, ObservationFile, Policy};
use vla_qnn::{Backend, LoadOptions, QnnLibrary, RpcMem};

/// One warm-up inference, then one counted: no allocation, the same actions.
fn steady(name: &str, policy: &mut Policy, bundle: &Bundle) {
    let obs = ObservationFile::load(&bundle.path(&bundle.manifest.end_to_end)).unwrap();
    let g = policy.geometry();
    let mut actions = vec![0f32; g.chunk_len * g.action_dims];
    policy.infer(&obs.observation(), &mut actions).unwrap();
    let before = actions.clone();

    let start = allocations();
    let result = policy.infer(&obs.observation(), &mut actions);
    let n = allocations() - start;
    result.unwrap();
    assert_eq!(
        n, 0,
        "{name}: {n} heap allocations in one steady-state inference"
    );
    assert_eq!(
        actions, before,
        "{name}: same observation and seed give the same actions"
    );
}

/// Runs as one test so no other test thread allocates while counting.
#[test]
fn steady_state_inference_allocates_nothing() {
    // The counter itself works: an allocation while counting is seen.
    let start = allocations();
    let probe = std::hint::black_box(vec![1u8; 64]);
    assert!(allocations() - start >= 1 && probe.len() == 64);

    let Some(backend) = common::backend() else {
        return;
    };
    let quaternion = common::quaternion_state_fixture("no-alloc-quat");
    for (name, dir) in [
        "molmoact2-drift-keystone",
        "molmoact2-lp-vtp-sd",
        "fastwam",
        "fastwam-closed-loop",
    ]
    .map(|n| (n, common::fixture(n)))
    .into_iter()
    .chain([(
        "fastwam-closed-loop (eef_pos_quat_gripper)",
        quaternion.clone(),
    )]) {
        let bundle = Bundle::open(&dir).unwrap();
        let mut policy = Policy::load(&bundle, &backend).unwrap();
        steady(name, &mut policy, &bundle);
    }
    let _ = std::fs::remove_dir_all(&quaternion);
    drop(backend);

    // The shared-buffer path: regions instead of client buffers, the guard's scans on
    // registered memory.
    let dir = std::env::var_os("VLA_QNN_LIB_DIR").expect("checked by common::backend");
    let tmp = std::env::temp_dir().join(format!("vla-policy-noalloc-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).unwrap();
    let Some(standin) = vla_test_support::rpcmem_standin(&tmp) else {
        return;
    };
    let Some(shim) = vla_test_support::qnn_mem_shim(&tmp.join("qnn"), dir.as_ref()) else {
        return;
    };
    let rpc = RpcMem::load(&standin).unwrap();
    let lib = Arc::new(QnnLibrary::load(&LoadOptions::htp(shim)).expect("load QNN"));
    let backend = Backend::new(lib).expect("QNN backend");
    for name in ["molmoact2-drift-keystone", "fastwam"] {
        let bundle = Bundle::open(common::fixture(name)).unwrap();
        let mut policy = Policy::load(&bundle, &backend).unwrap();
        policy.use_shared_buffers(&rpc).unwrap();
        steady(&format!("{name} on shared buffers"), &mut policy, &bundle);
    }
    let _ = std::fs::remove_dir_all(&tmp);
}
