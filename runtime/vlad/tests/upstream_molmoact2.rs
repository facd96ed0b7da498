//! vlad against upstream MolmoAct2's own inference: the tiny model built from
//! lerobot 0.6.1's `MolmoAct2ForConditionalGeneration`, exported at the seeds' split points
//! and imported by `scripts/vla-import` (golden/upstream-molmoact2, golden/bundles/
//! molmoact2-upstream-*). `predict_action(inference_action_mode="continuous")` ran on each
//! observation with its noise patched to vlad's noise for the observation's seed; here vlad
//! runs the same observations on the HTP emulator and must give upstream's actions. The
//! observations checked are the held-out ones (1..): observation 0 made the per-context
//! goldens. Three deliberate export mistakes must each fail that check.

mod common;

use common::qnn as qnn_available;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use vla_npz::{write_npz, Array, Npz};
use vla_test_support::copy_dir;

const VARIANTS: [&str; 3] = ["original", "sd", "drift-keystone"];
/// Against upstream's fp32 predict_action, on the HTP emulator (fp16): measured cosine
/// 0.99999 or more and max abs up to 0.0145 over every held-out observation of the three
/// variants. The bounds are ten times the measured 1 - cosine and 1.7 times the max abs:
/// tighter than the seeds' 0.999 gate, because a RoPE shift of every position by one
/// (nearly invisible to attention, which sees relative positions; only the keys handed to
/// the action expert turn) moves the actions by cosine 0.99983-0.99989, max abs 0.03-0.04.
const COSINE: f64 = 0.9999;
const MAX_ABS: f64 = 0.025;

fn golden() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../golden")
}

fn bundle(variant: &str) -> PathBuf {
    golden().join(format!("bundles/molmoact2-upstream-{variant}"))
}

fn vlad(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_vlad"))
        .args(args)
        .output()
        .expect("run vlad")
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("vlad-upstream-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Cosine and max abs difference: the project's parity metric.
fn cosine(a: &[f32], b: &[f32]) -> f64 {
    vla_tensor::compare(a, b, 0.0, 0.0).cosine
}

fn max_abs(a: &[f32], b: &[f32]) -> f64 {
    vla_tensor::compare(a, b, 0.0, 0.0).max_abs_diff
}

/// Upstream's observations and results for one variant: `obs{o}_{frames,state,
/// instruction_id,seed,actions[,keystone_choice]}`.
struct Upstream(Npz);

impl Upstream {
    fn load(variant: &str) -> Upstream {
        let path = golden().join(format!("upstream-molmoact2/upstream/{variant}.npz"));
        Upstream(Npz::open(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display())))
    }

    fn count(&self) -> usize {
        self.0.array("observations").unwrap().to_i32().unwrap()[0] as usize
    }

    fn observation_file(&self, o: usize, dir: &Path) -> PathBuf {
        let arrays: Vec<Array> = ["frames", "state", "instruction_id", "seed"]
            .iter()
            .map(|k| self.0.array(&format!("obs{o}_{k}")).unwrap().renamed(*k))
            .collect();
        let path = dir.join(format!("obs{o}.npz"));
        write_npz(&path, &arrays.iter().collect::<Vec<_>>()).unwrap();
        path
    }

    fn actions(&self, o: usize) -> Vec<f32> {
        self.0
            .array(&format!("obs{o}_actions"))
            .unwrap()
            .to_f32()
            .unwrap()
    }

    fn choice(&self, o: usize) -> Option<i32> {
        let name = format!("obs{o}_keystone_choice");
        self.0
            .contains(&name)
            .then(|| self.0.array(&name).unwrap().to_i32().unwrap()[0])
    }
}

/// vlad's chunk for one observation file: (actions, KeyStone choice).
fn run_once(bundle: &Path, obs: &Path, out: &Path) -> (Vec<f32>, Option<i32>) {
    let o = vlad(&[
        "run-once",
        "--bundle",
        bundle.to_str().unwrap(),
        "--obs",
        obs.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let npz = Npz::open(out).unwrap();
    let choice = npz
        .contains("keystone_choice")
        .then(|| npz.array("keystone_choice").unwrap().to_i32().unwrap()[0]);
    (npz.array("actions").unwrap().to_f32().unwrap(), choice)
}

/// Every held-out observation's (cosine, max abs, KeyStone agrees) against upstream.
fn against_upstream(variant: &str, bundle: &Path, dir: &Path) -> Vec<(f64, f64, bool)> {
    let up = Upstream::load(variant);
    assert!(up.count() >= 2, "{variant}: no held-out observation");
    (1..up.count())
        .map(|o| {
            let obs = up.observation_file(o, dir);
            let (actions, choice) = run_once(bundle, &obs, &dir.join(format!("out{o}.npz")));
            let want = up.actions(o);
            assert_eq!(actions.len(), want.len(), "{variant} observation {o}");
            (
                cosine(&actions, &want),
                max_abs(&actions, &want),
                choice == up.choice(o),
            )
        })
        .collect()
}

#[test]
fn every_upstream_variant_passes_parity_and_gives_upstreams_actions() {
    if !qnn_available() {
        return;
    }
    for variant in VARIANTS {
        let b = bundle(variant);
        let o = vlad(&["parity", "--bundle", b.to_str().unwrap()]);
        assert_eq!(o.status.code(), Some(0), "{variant}: {}", text(&o));
        let dir = scratch(variant);
        for (o, (cos, diff, same)) in against_upstream(variant, &b, &dir).into_iter().enumerate() {
            println!(
                "{variant} observation {}: cosine {cos:.6}, max abs {diff:.3e}",
                o + 1
            );
            assert!(
                cos >= COSINE && diff <= MAX_ABS && same,
                "{variant} observation {}: cosine {cos}, max abs {diff}, KeyStone agrees {same}",
                o + 1
            );
        }
        let _ = std::fs::remove_dir_all(dir);
    }
}

/// The original bundle with one mistake in it, checked both ways: `parity --bundle` must
/// fail naming `stage`, and vlad's actions must miss upstream's on some held-out observation.
fn mistake_is_caught(name: &str, stage: &str, make: impl FnOnce(&Path)) {
    let dir = scratch(name);
    let b = dir.join("bundle");
    copy_dir(&bundle("original"), &b);
    make(&b);
    let o = vlad(&["parity", "--bundle", b.to_str().unwrap()]);
    let report = text(&o);
    assert_eq!(
        o.status.code(),
        Some(3),
        "{name}: parity must fail:\n{report}"
    );
    assert!(
        report
            .lines()
            .any(|l| l.contains(stage) && l.contains("FAIL")),
        "{name}: parity must name {stage}:\n{report}"
    );
    let rows = against_upstream("original", &b, &dir);
    assert!(
        rows.iter()
            .any(|(cos, diff, _)| *cos < COSINE || *diff > MAX_ABS),
        "{name}: the end-to-end check against upstream did not notice: {rows:?}"
    );
    let _ = std::fs::remove_dir_all(dir);
}

fn swap_llm_contexts(mistake: &str, bundle: &Path) {
    let from = golden().join(format!("upstream-molmoact2/mistakes/{mistake}/ctx"));
    for e in std::fs::read_dir(&from).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), bundle.join("ctx").join(e.file_name())).unwrap();
    }
}

#[test]
fn split_layers_out_of_order_fail_the_check() {
    if !qnn_available() {
        return;
    }
    mistake_is_caught("split-order", "llm_split0", |b| {
        swap_llm_contexts("split-order", b)
    });
}

#[test]
fn rope_positions_off_by_one_fail_the_check() {
    if !qnn_available() {
        return;
    }
    mistake_is_caught("rope-offset", "llm_split0", |b| {
        swap_llm_contexts("rope-offset", b)
    });
}

#[test]
fn image_rows_written_one_row_late_fail_the_check() {
    if !qnn_available() {
        return;
    }
    mistake_is_caught("image-row-late", "hidden_states", |b| {
        let path = b.join("prompt/prompt_tables.npz");
        let npz = Npz::open(&path).unwrap();
        let arrays: Vec<Array> = npz
            .names()
            .map(|n| {
                let a = npz.array(n).unwrap();
                if n != "image_positions" {
                    return a;
                }
                let late: Vec<i32> = a.to_i32().unwrap().iter().map(|p| p + 1).collect();
                Array::from_i32(n, a.shape(), &late).unwrap()
            })
            .collect();
        drop(npz);
        write_npz(&path, &arrays.iter().collect::<Vec<_>>()).unwrap();
    });
}

/// `run-once --instruction-text` with texts the bundle was not imported with: upstream
/// predict_action's actions for them (golden/upstream-molmoact2/upstream/text_actions.npz,
/// tools/goldens/vla_goldens/upstream_text_actions.py), within this file's bounds; a text too long for the
/// exported contexts is refused in one line.
#[test]
fn run_once_with_an_instruction_text_gives_upstreams_actions_for_it() {
    if !qnn_available() {
        return;
    }
    let golden = Npz::open(golden().join("upstream-molmoact2/upstream/text_actions.npz")).unwrap();
    let bytes = |name: &str| golden.array(name).unwrap().to_u8().unwrap();
    let texts = String::from_utf8(bytes("texts")).unwrap();
    let dir = scratch("text");
    let obs = dir.join("obs.npz");
    let arrays = [
        golden.array("frames").unwrap(),
        golden.array("state").unwrap(),
        Array::from_i32("instruction_id", &[1], &[0]).unwrap(),
        golden.array("seed").unwrap(),
    ];
    write_npz(&obs, &arrays.iter().collect::<Vec<_>>()).unwrap();
    let b = bundle("original");
    let text0 = texts.lines().next().unwrap();
    let out = dir.join("out.npz");
    let o = vlad(&[
        "run-once",
        "--bundle",
        b.to_str().unwrap(),
        "--obs",
        obs.to_str().unwrap(),
        "--instruction-text",
        text0,
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let got = Npz::open(&out)
        .unwrap()
        .array("actions")
        .unwrap()
        .to_f32()
        .unwrap();
    let want = golden.array("actions0").unwrap().to_f32().unwrap();
    let (cos, diff) = (cosine(&got, &want), max_abs(&got, &want));
    println!("{text0:?}: cosine {cos:.6}, max abs {diff:.3e}");
    assert!(
        cos >= COSINE && diff <= MAX_ABS,
        "{text0:?}: cosine {cos}, max abs {diff}"
    );
    let too_long = String::from_utf8(bytes("too_long")).unwrap();
    let o = vlad(&[
        "run-once",
        "--bundle",
        b.to_str().unwrap(),
        "--obs",
        obs.to_str().unwrap(),
        "--instruction-text",
        &too_long,
    ]);
    let msg = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(
        msg.contains("too many tokens") && msg.trim_end().lines().count() == 1,
        "{msg}"
    );
    let _ = std::fs::remove_dir_all(dir);
}
