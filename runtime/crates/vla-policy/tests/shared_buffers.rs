//! The policies on HTP shared buffers: refused by the bare emulator (it registers no
//! memory) and left on client buffers; through `vla-test-support`'s memory shim (a
//! test-only memRegister in front of the emulator) the actions are bit-identical to the
//! client-buffer ones: Fast-WAM's open-loop action_step, Fast-WAM's world-model chain and
//! MolmoAct2's whole chain, each in one arena.

mod common;

use std::path::{Path, PathBuf};
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

/// The shim's own `libQnnHtp.so` in `shim_dir` (already loaded by this process).
fn shim(shim_dir: &Path) -> libloading::Library {
    // SAFETY: the shim built by vla-test-support; loading it runs no initializer.
    unsafe { libloading::Library::new(shim_dir.join("libQnnHtp.so")) }.unwrap()
}

/// Makes the shim refuse the memRegister call after the next `n` (n < 0: none).
fn refuse_registrations_after(shim_dir: &Path, n: std::ffi::c_long) {
    let lib = shim(shim_dir);
    // SAFETY: `void qnn_mem_shim_refuse_after(long)` in qnn_mem_shim.c.
    let f: libloading::Symbol<unsafe extern "C" fn(std::ffi::c_long)> =
        unsafe { lib.get(b"qnn_mem_shim_refuse_after\0") }.unwrap();
    // SAFETY: sets a counter under the shim's lock.
    unsafe { f(n) }
}

/// Registrations the shim holds.
fn shim_registrations(shim_dir: &Path) -> std::ffi::c_long {
    let lib = shim(shim_dir);
    // SAFETY: `long qnn_mem_shim_live(void)` in qnn_mem_shim.c.
    let f: libloading::Symbol<unsafe extern "C" fn() -> std::ffi::c_long> =
        unsafe { lib.get(b"qnn_mem_shim_live\0") }.unwrap();
    // SAFETY: no arguments; reads a counter under the shim's lock.
    unsafe { f() }
}

/// The bytes of client buffers `policy`'s graphs have handed to QNN.
fn client_bytes(policy: &mut Policy) -> u64 {
    policy
        .graphs_mut()
        .iter()
        .map(|g| g.graph.client_buffer_bytes())
        .sum()
}

/// The memory shim in front of the emulator, with the rpcmem stand-in, under a fresh
/// scratch directory.
struct Shimmed {
    /// The scratch directory (the caller removes it).
    tmp: PathBuf,
    /// The rpcmem stand-in's allocator.
    rpc: Arc<RpcMem>,
    /// The shim's library directory.
    shim: PathBuf,
    /// A backend through the shim.
    backend: Backend,
}

/// [`Shimmed`] in a scratch directory named for `tag`, or `None` where the emulator, the
/// stand-in or the shim is not there (each says why).
fn shimmed(tag: &str) -> Option<Shimmed> {
    let dir = qnn_lib_dir()?;
    let tmp = std::env::temp_dir().join(format!("vla-policy-shm-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).unwrap();
    let standin = rpcmem_standin(&tmp)?;
    let shim = qnn_mem_shim(&tmp.join("qnn"), &dir)?;
    let rpc = RpcMem::load(&standin).unwrap();
    let backend = backend(&shim);
    Some(Shimmed {
        tmp,
        rpc,
        shim,
        backend,
    })
}

/// One inference (seed 0) of `policy` on registered memory: bit for bit `client`'s, and
/// still `counted` bytes of client buffers (none handed to QNN since).
fn acts_as_on_client_buffers(policy: &mut Policy, bundle: &Bundle, client: &[f32], counted: u64) {
    let shared = actions_of(policy, bundle, &[0]);
    assert_eq!(bits(&shared), bits(client), "shared-buffer actions differ");
    assert_eq!(
        client_bytes(policy),
        counted,
        "no client buffer was handed to QNN"
    );
}

/// For each (component, tensor): a non-finite value injected into `component`'s output
/// fails the inference on the golden observation (seed 0) naming both, and no action is
/// written; the next inference recovers, bit for bit the start of `client`.
fn non_finite_found_named_and_recovered(
    policy: &mut Policy,
    bundle: &Bundle,
    cases: &[(&str, &str)],
    client: &[f32],
) {
    let file = ObservationFile::load(&bundle.path(&bundle.manifest.end_to_end)).unwrap();
    let mut obs = file.observation();
    obs.seed = 0; // `client` starts with seed 0's actions
    let g = policy.geometry();
    let mut a = vec![0f32; g.chunk_len * g.action_dims];
    for &(component, tensor) in cases {
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
    let counted = client_bytes(&mut policy);
    let shared = actions(&mut policy, &bundle);
    assert_eq!(bits(&shared), bits(&client), "shared-buffer actions differ");
    let after = client_bytes(&mut policy);
    assert_eq!(after, counted, "no client buffer was handed to QNN");
    // The parity gate still passes on the bound policy.
    assert!(bundle.parity(&mut policy).unwrap().passed());
    drop(policy);
    drop(shimmed);
    let _ = std::fs::remove_dir_all(&tmp);
}

#[test]
fn fastwam_world_model_chain_on_one_chained_arena_acts_bit_identically_with_no_client_buffer() {
    let _turn = TURN.lock().unwrap_or_else(|p| p.into_inner());
    let Some(arena) = shimmed("c") else {
        return;
    };
    let bundle = Bundle::open(common::fixture("fastwam-closed-loop")).unwrap();
    let mut policy = Policy::load(&bundle, &arena.backend).unwrap();
    // One inference per mode (the emulator takes seconds each); the recovery below is the
    // second one on shared buffers.
    let client = actions_of(&mut policy, &bundle, &[0]);
    // The first inference of an instruction copies its text rows into the context, and
    // nothing else is copied buffer to buffer.
    let c = match &policy {
        Policy::FastWam(f) => f.settings.chain.clone().expect("the closed-loop form"),
        Policy::MolmoAct2(_) => unreachable!(),
    };
    let text = (c.text_tokens * c.context_width * 4) as u64;
    assert_eq!(policy.host_copy_bytes(), text);
    let counted = client_bytes(&mut policy);
    assert!(counted > 0, "client buffers are counted");

    // A registration refused part-way (action_step, wm_vae_enc and wm_embed registered,
    // wm_prefill_split0 refused): every graph goes back to client buffers and nothing
    // stays registered; a later move succeeds.
    // (memRegister is called once per tensor.)
    let tensors = |g: &vla_policy::LoadedGraph| g.graph.inputs().len() + g.graph.outputs().len();
    let graphs = policy.graphs_mut(); // wm_vae_enc, wm_embed, the splits, action_step
    let before_split0 = tensors(graphs[graphs.len() - 1]) + tensors(graphs[0]) + tensors(graphs[1]);
    refuse_registrations_after(&arena.shim, before_split0 as std::ffi::c_long);
    let e = policy
        .use_shared_buffers(&arena.rpc)
        .unwrap_err()
        .to_string();
    refuse_registrations_after(&arena.shim, -1);
    assert!(e.contains("wm_prefill_split0") && e.contains("1000"), "{e}");
    assert!(!policy.on_shared_buffers());
    assert!(policy.graphs_mut().iter().all(|g| !g.graph.is_shared()));
    assert_eq!(
        shim_registrations(&arena.shim),
        0,
        "every registration dropped"
    );

    policy.use_shared_buffers(&arena.rpc).unwrap();
    assert!(policy.on_shared_buffers());
    assert_eq!(policy.graphs_mut().len(), 2 + c.prefill_layers.len() + 1);
    assert!(
        policy.graphs_mut().iter().all(|g| g.graph.is_shared()),
        "every context on registered memory"
    );
    acts_as_on_client_buffers(&mut policy, &bundle, &client, counted);
    // The text rows moved over with the context region: nothing copied this time.
    assert_eq!(policy.host_copy_bytes(), text, "no host copy on the arena");

    // The NaN/Inf scans read the regions the next context reads: a NaN in split 0's
    // tokens and an Inf in action_step's prediction are found and named, no action is
    // written, and the next inference recovers bit-identically.
    non_finite_found_named_and_recovered(
        &mut policy,
        &bundle,
        &[
            ("wm_prefill_split0", "video_tokens_out"),
            ("action_step", "pred_noise"),
        ],
        &client,
    );
    drop(policy);
    assert_eq!(shim_registrations(&arena.shim), 0, "deregistered at drop");
    drop(arena.backend);
    let _ = std::fs::remove_dir_all(&arena.tmp);
}

#[test]
fn molmoact2_on_one_chained_arena_acts_bit_identically_with_no_client_buffer() {
    let _turn = TURN.lock().unwrap_or_else(|p| p.into_inner());
    let Some(arena) = shimmed("m") else {
        return;
    };
    let bundle = Bundle::open(common::fixture("molmoact2-original")).unwrap();
    let mut policy = Policy::load(&bundle, &arena.backend).unwrap();
    // One inference per mode here (the emulator takes seconds each); the recovery below is
    // the second one on shared buffers.
    let client = actions_of(&mut policy, &bundle, &[0]);
    let counted = client_bytes(&mut policy);
    assert!(counted > 0, "client buffers are counted");
    policy.use_shared_buffers(&arena.rpc).unwrap();
    assert!(policy.on_shared_buffers());
    assert!(
        policy.graphs_mut().iter().all(|g| g.graph.is_shared()),
        "every context on registered memory"
    );
    let copied = policy.host_copy_bytes();
    acts_as_on_client_buffers(&mut policy, &bundle, &client, counted);
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
    non_finite_found_named_and_recovered(
        &mut policy,
        &bundle,
        &[("llm_split1", "hidden_out"), ("action_context", "v_ctx")],
        &client,
    );
    drop(policy);
    drop(arena.backend);
    let _ = std::fs::remove_dir_all(&arena.tmp);
}
