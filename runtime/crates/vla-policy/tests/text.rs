//! Instructions given as text at run time, on the tiny upstream MolmoAct2 bundle and the HTP
//! emulator: texts the bundle was not imported with give upstream predict_action's actions
//! for them (golden/upstream-molmoact2/upstream/text_actions.npz, made by
//! tools/goldens/vla_goldens/upstream_text_actions.py), an imported instruction written otherwise gives the
//! fixed instruction's actions exactly, and bad text is refused in one line with nothing lost.

mod common;

use vla_policy::{Bundle, Observation, Policy, PolicyError, TEXT_INSTRUCTION_FLAG, TEXT_SLOTS};

struct Golden {
    frames: Vec<u8>,
    state: Vec<f32>,
    seed: u64,
    texts: Vec<String>,
    actions: Vec<Vec<f32>>,
    too_long: String,
}

fn golden() -> Golden {
    let npz = vla_npz::Npz::open(
        vla_test_support::repo_root().join("golden/upstream-molmoact2/upstream/text_actions.npz"),
    )
    .unwrap();
    let text = |name: &str| String::from_utf8(npz.array(name).unwrap().to_u8().unwrap()).unwrap();
    let texts: Vec<String> = text("texts").lines().map(String::from).collect();
    let actions = (0..texts.len())
        .map(|i| npz.array(&format!("actions{i}")).unwrap().to_f32().unwrap())
        .collect();
    Golden {
        frames: npz.array("frames").unwrap().to_u8().unwrap(),
        state: npz.array("state").unwrap().to_f32().unwrap(),
        seed: npz.array("seed").unwrap().to_u64().unwrap()[0],
        texts,
        actions,
        too_long: text("too_long"),
    }
}

/// One inference on the golden observation naming instruction `id`.
fn try_infer(policy: &mut Policy, g: &Golden, id: u32) -> Result<Vec<f32>, PolicyError> {
    let geo = policy.geometry();
    let mut actions = vec![0f32; geo.chunk_len * geo.action_dims];
    let obs = Observation {
        cameras: 2,
        height: 48,
        width: 64,
        frames: &g.frames,
        state: &g.state,
        instruction_id: id,
        seed: g.seed,
    };
    policy.infer(&obs, &mut actions)?;
    Ok(actions)
}

fn infer(policy: &mut Policy, g: &Golden, id: u32) -> Vec<f32> {
    try_infer(policy, g, id).unwrap()
}

#[test]
fn texts_not_in_the_bundle_give_upstreams_actions_and_bad_text_is_refused() {
    let Some(backend) = common::backend() else {
        return;
    };
    let g = golden();
    assert!(g.texts.len() >= 2);
    let bundle = Bundle::open(common::fixture("molmoact2-upstream-original")).unwrap();
    let gate = bundle.manifest.parity.end_to_end_cosine;
    let fixed = bundle.manifest.molmoact2().unwrap().instructions.clone();
    let mut policy = Policy::load(&bundle, &backend).unwrap();
    // Two of the golden's texts run here (CI time); all four were measured at 0.99999.
    for (text, want) in g.texts.iter().zip(&g.actions).take(2) {
        assert!(!fixed.contains(text));
        let id = policy.instruction_from_text(text.as_bytes()).unwrap();
        assert_ne!(id & TEXT_INSTRUCTION_FLAG, 0);
        let got = infer(&mut policy, &g, id);
        let c = vla_tensor::compare(&got, want, 0.0, 0.0);
        eprintln!(
            "{text:?}: end-to-end cosine {:.6}, max abs {:.3e}",
            c.cosine, c.max_abs_diff
        );
        assert!(
            c.cosine >= gate,
            "{text:?}: cosine {} below the gate {gate}",
            c.cosine
        );
    }
    // An imported instruction written otherwise renders to the same prompt: the same
    // actions as its fixed id, bit for bit (the bf16 table's rows are exact in the f16 tables).
    let by_id = infer(&mut policy, &g, 0);
    let id = policy
        .instruction_from_text(b"  Put the Bowl on the Stove.  ")
        .unwrap();
    assert_ne!(id & TEXT_INSTRUCTION_FLAG, 0);
    assert_eq!(infer(&mut policy, &g, id), by_id);
    // A plain id past the fixed list names no text, though texts are rendered: refused.
    for plain in fixed.len() as u32..(fixed.len() + TEXT_SLOTS) as u32 {
        let msg = try_infer(&mut policy, &g, plain).unwrap_err().to_string();
        assert!(msg.contains("instruction_id"), "{msg}");
    }
    assert_eq!(
        policy.instruction_from_text(fixed[0].as_bytes()).unwrap(),
        0
    );
    // Refusals: one line each, naming the reason; what is rendered stays usable.
    for (text, reason) in [
        (g.too_long.as_bytes(), "too many tokens"),
        (&b"put the \xff bowl"[..], "invalid UTF-8"),
        (b"put the <im_patch> on the stove", "<im_patch>"),
        (b"go", "too few tokens"),
    ] {
        let msg = policy.instruction_from_text(text).unwrap_err().to_string();
        assert!(msg.contains(reason) && !msg.contains('\n'), "{msg}");
    }
    // Slots 0 and 1 hold texts[0..2], slot 2 the rewritten instruction; they keep their ids
    // through the refusals. texts[2] takes the last free slot, texts[3] replaces the oldest
    // (slot 0) in place and the others keep theirs.
    assert_eq!(id, TEXT_INSTRUCTION_FLAG | 2);
    let slot = |policy: &mut Policy, text: &str| {
        policy.instruction_from_text(text.as_bytes()).unwrap() & !TEXT_INSTRUCTION_FLAG
    };
    assert_eq!(slot(&mut policy, &g.texts[1]), 1);
    assert_eq!(slot(&mut policy, &g.texts[2]), 3);
    assert_eq!(slot(&mut policy, &g.texts[3]), 0);
    assert_eq!(slot(&mut policy, &g.texts[1]), 1);
    assert_eq!(slot(&mut policy, "  Put the Bowl on the Stove.  "), 2);
    assert_eq!(TEXT_SLOTS, 4);

    // The daemon's path: rendered on another thread, installed on this one (the inference
    // thread's part) with no heap allocation; the slots are full, so the oldest (slot 1)
    // is replaced and handed back to be freed elsewhere.
    let renderer = policy.text_renderer().unwrap();
    let text = g.texts[0].clone();
    let rendered = std::thread::spawn(move || renderer.render(text.as_bytes()))
        .join()
        .unwrap()
        .unwrap();
    let bytes = g.texts[0].as_bytes().to_vec();
    let (installed, allocations) = {
        let _one = vla_alloc_count::WATCH_LOCK
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        vla_alloc_count::watch(vla_alloc_count::current_tid());
        let before = vla_alloc_count::watched_allocations();
        let installed = policy.install_text(bytes, rendered);
        let n = vla_alloc_count::watched_allocations() - before;
        vla_alloc_count::watch(0);
        (installed, n)
    };
    assert_eq!(allocations, 0, "installing a rendered text allocated");
    let (id, replaced) = installed.unwrap();
    assert_eq!(id, TEXT_INSTRUCTION_FLAG | 1);
    assert_eq!(replaced.unwrap().0, g.texts[1].as_bytes());
}
