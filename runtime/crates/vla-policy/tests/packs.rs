//! Fast-WAM instruction packs on the HTP emulator: a pack instruction, selected by id or by
//! text, gives bit for bit the actions of the same rows used as a fixed instruction; a text
//! in no pack, an id no pack holds and a pack that does not fit are refused in one line; a
//! pack attached while the policy runs (another thread builds the set, the policy swaps it
//! in) adds its ids and texts and keeps the others'.

mod common;

use std::path::{Path, PathBuf};
use vla_npz::Npz;
use vla_policy::{
    Bundle, ObservationFile, Policy, RenderedText, PACK_INSTRUCTION_FLAG, TEXT_INSTRUCTION_FLAG,
};
use vla_test_support::InstructionPack;

const BUNDLE: &str = "fastwam-upstream";
const EXTRA: u32 = PACK_INSTRUCTION_FLAG | 5;
const OTHER: u32 = PACK_INSTRUCTION_FLAG | 6;

/// Writes a pack for (`name`, `version`) into `dir`: (id, text, rows) per instruction.
fn write_pack(
    dir: &Path,
    name: &str,
    version: &str,
    shape: [usize; 2],
    items: &[(u32, &str, &[f32])],
) {
    let rows: Vec<f32> = items.iter().flat_map(|i| i.2.iter().copied()).collect();
    let instructions: Vec<(u32, &str)> = items.iter().map(|i| (i.0, i.1)).collect();
    InstructionPack {
        label: "extra",
        name,
        version,
        min_runtime_version: "0.1.0",
        shape,
        instructions: &instructions,
        rows: &rows,
    }
    .write(dir);
}

fn temp(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("vla-policy-packs-{}-{tag}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

#[test]
fn a_pack_instruction_by_id_or_text_gives_the_actions_of_the_same_rows_fixed() {
    let Some(backend) = common::backend() else {
        return;
    };
    let bundle = Bundle::open(common::fixture(BUNDLE)).unwrap();
    let chain = bundle.manifest.fastwam().unwrap().chain.clone().unwrap();
    let (m, e) = (chain.text_tokens, chain.context_width);
    let tables = Npz::open(bundle.path(&chain.tables)).unwrap();
    let text_rows = tables.array("text_rows").unwrap().to_f32().unwrap();
    let row = |i: usize| &text_rows[i * m * e..(i + 1) * m * e];
    let (name, version) = (
        bundle.manifest.name.clone(),
        bundle.manifest.version.clone(),
    );

    // The pack: instruction 1's rows under a new text, instruction 0's under another.
    let dir = temp("good");
    write_pack(
        &dir,
        &name,
        &version,
        [m, e],
        &[
            (EXTRA, "open the drawer on top", row(1)),
            (OTHER, "put the bowl down", row(0)),
        ],
    );
    let mut policy = Policy::load(&bundle, &backend).unwrap();

    // Packs that do not fit are refused in one line, attaching nothing.
    let refusals = [
        (
            "other-bundle",
            "other-bundle",
            version.as_str(),
            EXTRA,
            "is for bundle other-bundle",
        ),
        ("plain-id", name.as_str(), version.as_str(), 7, "bit 30 set"),
        (
            "text-id",
            name.as_str(),
            version.as_str(),
            TEXT_INSTRUCTION_FLAG | PACK_INSTRUCTION_FLAG,
            "bit 31 clear",
        ),
    ];
    for (tag, pack_name, pack_version, id, reason) in refusals {
        let bad = temp(tag);
        write_pack(
            &bad,
            pack_name,
            pack_version,
            [m, e],
            &[(id, "anything", row(0))],
        );
        let msg = policy.attach_pack(&bad, None).unwrap_err().to_string();
        assert!(msg.contains(reason) && !msg.contains('\n'), "{tag}: {msg}");
        let _ = std::fs::remove_dir_all(&bad);
    }
    let bad = temp("wide");
    write_pack(
        &bad,
        &name,
        &version,
        [m, e - 1],
        &[(EXTRA, "too narrow", &row(0)[..m * (e - 1)])],
    );
    let msg = policy.attach_pack(&bad, None).unwrap_err().to_string();
    assert!(msg.contains("the bundle's context takes"), "{msg}");
    let _ = std::fs::remove_dir_all(&bad);

    assert_eq!(
        policy.attach_pack(&dir, None).unwrap(),
        ("extra".to_string(), 2)
    );
    // The same ids again: refused whole.
    let msg = policy.attach_pack(&dir, None).unwrap_err().to_string();
    assert!(msg.contains("already taken"), "{msg}");

    // By text: normalized as upstream's whitespace cleaning, on another thread (the
    // daemon's text thread) and here; a fixed text names its fixed id.
    assert_eq!(
        policy
            .instruction_from_text(b"  open the drawer\ton top ")
            .unwrap(),
        EXTRA
    );
    assert_eq!(
        policy
            .instruction_from_text(chain.instructions[1].as_bytes())
            .unwrap(),
        1
    );
    let renderer = policy.text_renderer().unwrap();
    let looked_up = std::thread::spawn(move || renderer.render(b"put  the bowl down"))
        .join()
        .unwrap()
        .unwrap();
    let RenderedText::Existing(id) = looked_up else {
        panic!("Fast-WAM looks texts up");
    };
    let (installed, replaced) = policy
        .install_text(Vec::new(), RenderedText::Existing(id))
        .unwrap();
    assert_eq!(installed, OTHER);
    assert!(replaced.is_none());
    // Not in any pack: one line naming why; invalid UTF-8 likewise.
    for (text, reason) in [
        (&b"fly to the moon"[..], "instruction pack"),
        (b"open the \xff drawer", "invalid UTF-8"),
    ] {
        let msg = policy.instruction_from_text(text).unwrap_err().to_string();
        assert!(msg.contains(reason) && !msg.contains('\n'), "{msg}");
    }

    // Actions: the pack id holding instruction 1's rows first (the context starts with
    // zero rows, so nothing left by an earlier instruction can stand in for the pack's),
    // then fixed 1: bit for bit the same.
    let obs_file = ObservationFile::load(&bundle.path("golden/end_to_end.npz")).unwrap();
    let g = policy.geometry();
    let mut run = |id: u32| {
        let mut obs = obs_file.observation();
        obs.instruction_id = id;
        let mut actions = vec![0f32; g.chunk_len * g.action_dims];
        policy.infer(&obs, &mut actions).unwrap();
        actions
    };
    let packed = run(EXTRA);
    let fixed1 = run(1);
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(
        bits(&packed),
        bits(&fixed1),
        "pack rows vs the same rows fixed"
    );

    // An id no pack holds is refused before any context runs.
    let mut obs = obs_file.observation();
    obs.instruction_id = PACK_INSTRUCTION_FLAG | 99;
    let mut actions = vec![0f32; g.chunk_len * g.action_dims];
    let msg = policy.infer(&obs, &mut actions).unwrap_err().to_string();
    assert!(msg.contains("pack instructions"), "{msg}");

    // While running (renderers handed out): attach_pack refuses, an attacher on another
    // thread builds the new set and install_packs swaps it in; the packs attached before
    // keep their ids; a set built on packs the policy no longer has is refused.
    const HOT: u32 = PACK_INSTRUCTION_FLAG | 99;
    let hot = temp("hot");
    write_pack(
        &hot,
        &name,
        &version,
        [m, e],
        &[(HOT, "close the drawer", row(1))],
    );
    let renderer = policy.text_renderer().unwrap();
    let msg = policy.attach_pack(&hot, None).unwrap_err().to_string();
    assert!(msg.contains("before any text renderer"), "{msg}");
    let mut attacher = policy.pack_attacher().unwrap();
    let msg = attacher.attach(&dir, None).err().unwrap().to_string();
    assert!(msg.contains("already taken"), "{msg}");
    let stale = {
        let mut other = policy.pack_attacher().unwrap();
        other.attach(&hot, None).unwrap().0
    };
    let hot_dir = hot.clone();
    let (attacher, (set, label, n)) = std::thread::spawn(move || {
        let attached = attacher.attach(&hot_dir, None).unwrap();
        (attacher, attached)
    })
    .join()
    .unwrap();
    assert_eq!((label.as_str(), n), ("extra", 1));
    assert!(attacher.packs().holds_dir(&hot) && attacher.packs().holds_dir(&dir));
    assert!(!policy.has_pack_instruction(HOT));
    let Ok(replaced) = policy.install_packs(set) else {
        panic!("not installed over the set it was built on");
    };
    assert_eq!(replaced.packs().instructions(), 2);
    assert!(policy.has_pack_instruction(HOT) && policy.has_pack_instruction(EXTRA));
    let looked_up = attacher.renderer().render(b"close  the drawer").unwrap();
    assert!(matches!(looked_up, RenderedText::Existing(HOT)));
    // Built on the packs before the install: not installed, handed back whole.
    let Err(refused) = policy.install_packs(stale) else {
        panic!("a set built on packs the policy no longer has was installed");
    };
    assert_eq!(refused.packs().instructions(), 3);
    // The renderer handed out before the attach still sees the packs it was made with.
    assert!(renderer.render(b"close the drawer").is_err());
    let _ = std::fs::remove_dir_all(&hot);
    let _ = std::fs::remove_dir_all(&dir);
}
