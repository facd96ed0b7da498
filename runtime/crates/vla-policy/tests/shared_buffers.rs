//! The policies on HTP shared buffers: refused by the bare emulator (it registers no
//! memory) and left on client buffers; through `vla-test-support`'s memory shim (a
//! test-only memRegister in front of the emulator) the actions are bit-identical to the
//! client-buffer ones: Fast-WAM's action_step, and MolmoAct2's whole chain in one arena.

mod common;

use std::path::Path;
use std::sync::{Arc, Mutex};
use vla_policy::{Bundle, ObservationFile, Policy, PolicyError};
use vla_qnn::{Backend, LoadOptions, QnnLibrary, RpcMem};
use vla_test_support::{qnn_lib_dir, qnn_mem_shim, rpcmem_standin};

/// The emulator crashes when several backends are made at once: tests take turns.
static TURN: Mutex<()> = Mutex::new(());

fn backend(dir: &Path) -> Backend {
    let lib = Arc::new(QnnLibrary::load(&LoadOptions::htp(dir)).expect("load QNN"));
    Backend::new(lib).expect("QNN backend")
}

/// Two inferences' actions (different seeds) of `policy` on the bundle's golden observation.
fn actions(policy: &mut Policy, bundle: &Bundle) -> Vec<f32> {
    actions_of(policy, bundle, &[0, 7])
}

/// The actions of one inference per seed, concatenated.
fn actions_of(policy: &mut Policy, bundle: &Bundle, seeds: &[u64]) -> Vec<f32> {
    let obs = ObservationFile::load(&bundle.path(&bundle.manifest.end_to_end)).unwrap();
    let g = policy.geometry();
    let mut all = Vec::new();
    for &seed in seeds {
        let mut o = obs.observation();
        o.seed = seed;
        let mut a = vec![0f32; g.chunk_len * g.action_dims];
        policy.infer(&o, &mut a).unwrap();
        all.extend(a);
    }
    all
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

#[test]
fn fastwam_on_shared_buffers_acts_bit_identically_and_falls_back_where_refused() {
    let _turn = TURN.lock().unwrap_or_else(|p| p.into_inner());
    let Some(dir) = qnn_lib_dir() else { return };
    let tmp = std::env::temp_dir().join(format!("vla-policy-shm-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).unwrap();
    let Some(standin) = rpcmem_standin(&tmp) else {
        return;
    };
    let rpc = RpcMem::load(&standin).unwrap();
    let bundle = Bundle::open(common::fixture("fastwam")).unwrap();

    // The bare emulator: memRegister 1000, the policy keeps client buffers.
    let real = backend(&dir);
    let mut policy = Policy::load(&bundle, &real).unwrap();
    let client = actions(&mut policy, &bundle);
    let e = policy.use_shared_buffers(&rpc).unwrap_err().to_string();
    assert!(
        e.contains("memRegister failed") && e.contains("QNN error 1000"),
        "{e}"
    );
    assert!(!policy.on_shared_buffers());
    assert_eq!(bits(&actions(&mut policy, &bundle)), bits(&client));
    drop(policy);
    drop(real);

    // Through the memory shim the same inferences run on registered memory.
    let Some(shim) = qnn_mem_shim(&tmp.join("qnn"), &dir) else {
        return;
    };
    let shimmed = backend(&shim);
    let mut policy = Policy::load(&bundle, &shimmed).unwrap();
    assert_eq!(bits(&actions(&mut policy, &bundle)), bits(&client));
    policy.use_shared_buffers(&rpc).unwrap();
    assert!(policy.on_shared_buffers());
    let counted: u64 = policy
        .graphs_mut()
        .iter()
        .map(|g| g.graph.client_buffer_bytes())
        .sum();
    let shared = actions(&mut policy, &bundle);
    assert_eq!(bits(&shared), bits(&client), "shared-buffer actions differ");
    let after: u64 = policy
        .graphs_mut()
        .iter()
        .map(|g| g.graph.client_buffer_bytes())
        .sum();
    assert_eq!(after, counted, "no client buffer was handed to QNN");
    // The parity gate still passes on the bound policy.
    assert!(bundle.parity(&mut policy).unwrap().passed());
    drop(policy);
    drop(shimmed);

    // The closed-loop form (its world-model chain writes through client buffers) says so.
    let closed = Bundle::open(common::fixture("fastwam-closed-loop")).unwrap();
    let b = backend(&shim);
    let mut policy = Policy::load(&closed, &b).unwrap();
    let e = policy.use_shared_buffers(&rpc).unwrap_err().to_string();
    assert!(e.contains("world-model chain"), "{e}");
    let _ = std::fs::remove_dir_all(&tmp);
}

#[test]
fn molmoact2_on_one_chained_arena_acts_bit_identically_with_no_client_buffer() {
    let _turn = TURN.lock().unwrap_or_else(|p| p.into_inner());
    let Some(dir) = qnn_lib_dir() else { return };
    let tmp = std::env::temp_dir().join(format!("vla-policy-shm-m-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).unwrap();
    let Some(standin) = rpcmem_standin(&tmp) else {
        return;
    };
    let Some(shim) = qnn_mem_shim(&tmp.join("qnn"), &dir) else {
        return;
    };
    let rpc = RpcMem::load(&standin).unwrap();
    let bundle = Bundle::open(common::fixture("molmoact2-original")).unwrap();
    let shimmed = backend(&shim);
    let mut policy = Policy::load(&bundle, &shimmed).unwrap();
    // One inference per mode here (the emulator takes seconds each); the recovery below is
    // the second one on shared buffers.
    let client = actions_of(&mut policy, &bundle, &[0]);
    let client_bytes = |p: &mut Policy| -> u64 {
        p.graphs_mut()
            .iter()
            .map(|g| g.graph.client_buffer_bytes())
            .sum()
    };
    let counted = client_bytes(&mut policy);
    assert!(counted > 0, "client buffers are counted");
    policy.use_shared_buffers(&rpc).unwrap();
    assert!(policy.on_shared_buffers());
    assert!(
        policy.graphs_mut().iter().all(|g| g.graph.is_shared()),
        "every context on registered memory"
    );
    let copied = policy.host_copy_bytes();
    let shared = actions_of(&mut policy, &bundle, &[0]);
    assert_eq!(bits(&shared), bits(&client), "shared-buffer actions differ");
    assert_eq!(
        client_bytes(&mut policy),
        counted,
        "no client buffer was handed to QNN"
    );
    // The first inference of an instruction: its scaffold, bias and mask, and the
    // candidate's rows.
    let g = policy.geometry();
    let rows = (g.chunk_len * g.action_dims * 4) as u64;
    let m = match &policy {
        Policy::MolmoAct2(m) => m,
        Policy::FastWam(_) => unreachable!(),
    };
    let s = m.settings.seq_len as u64;
    let once = s * m.settings.hidden as u64 * 4 + s * s * 4 + s * 4;
    assert_eq!(policy.host_copy_bytes() - copied, once + rows);

    // The guard's scans read regions while the next context runs: a NaN in a split's
    // hidden_out (scanned during the next split) and in v_ctx (during the flow loop) is
    // found and named, no action is written, and the next inference recovers.
    let file = ObservationFile::load(&bundle.path(&bundle.manifest.end_to_end)).unwrap();
    let mut obs = file.observation();
    obs.seed = 0; // `client` starts with seed 0's actions
    let mut a = vec![0f32; g.chunk_len * g.action_dims];
    for (component, tensor) in [("llm_split1", "hidden_out"), ("action_context", "v_ctx")] {
        policy.inject_non_finite(Some(component));
        let e = policy.infer(&obs, &mut a).unwrap_err();
        assert!(
            matches!(&e, PolicyError::NonFinite { component: c, tensor: t, .. }
                if c == component && t == tensor),
            "{component}: {e}"
        );
        assert!(a.iter().all(|v| *v == 0.0), "{component}: actions written");
    }
    policy.inject_non_finite(None);
    policy.infer(&obs, &mut a).unwrap();
    assert_eq!(
        bits(&a),
        bits(&client[..a.len()]),
        "recovered, bit-identical"
    );
    drop(policy);
    drop(shimmed);
    let _ = std::fs::remove_dir_all(&tmp);
}
