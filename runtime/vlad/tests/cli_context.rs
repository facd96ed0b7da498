//! `vlad inspect | parity | bench-context` end to end: the binary against the real QNN
//! libraries and the golden fixtures, including every bad input the tools must survive.

mod common;

use common::{qnn as qnn_available, text, vlad};
use std::path::{Path, PathBuf};
use std::process::Command;
use vla_npz::{write_npz, Array, Npz};

fn bundle() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../golden/bundles/molmoact2-original")
}

fn ctx(c: &str) -> PathBuf {
    bundle().join(format!("ctx/{c}_socid77_archv73.bin"))
}

fn io(c: &str) -> PathBuf {
    bundle().join(format!("golden/{c}_io.npz"))
}

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("vlad-cli-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// The golden of `component` with `edit` applied to its arrays, written to `dir`.
fn edited_golden(component: &str, dir: &Path, edit: impl FnOnce(&mut Vec<Array>)) -> PathBuf {
    let npz = Npz::open(io(component)).unwrap();
    let mut arrays: Vec<Array> = npz.names().map(|n| npz.array(n).unwrap()).collect();
    edit(&mut arrays);
    let path = dir.join(format!("{component}_io.npz"));
    write_npz(&path, &arrays.iter().collect::<Vec<_>>()).unwrap();
    path
}

#[test]
fn inspect_shows_soc_blob_build_and_tensors() {
    if !qnn_available() {
        return;
    }
    let o = vlad(&["inspect", ctx("action_step").to_str().unwrap()]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    assert!(out.contains("soc model:     77 (QCS9075"), "{out}");
    assert!(
        out.contains("blob version:") && out.contains("QNN build:     v2."),
        "{out}"
    );
    for t in [
        "trajectory",
        "timestep",
        "k_ctx",
        "v_ctx",
        "encoder_attention_mask",
        "action_dim_is_pad",
        "next_trajectory",
    ] {
        assert!(out.contains(t), "missing {t}: {out}");
    }
    assert!(out.contains("[1,10,32]") && out.contains("f32"), "{out}");
}

/// The HTP emulator's libQnnHtp.so prints a `# LIBNATIVE: ...` banner on stdout when it
/// is loaded: it must not reach a command's output (it goes to the `qnn` log target),
/// while the command's own output is all there.
#[test]
fn the_emulators_load_banner_goes_to_the_qnn_log_not_to_stdout() {
    let Some(dir) = common::qnn_dir() else {
        return;
    };
    let banner = b"# LIBNATIVE: ";
    let library = std::fs::read(Path::new(&dir).join("libQnnHtp.so")).unwrap();
    let prints_banner = library.windows(banner.len()).any(|w| w == banner);
    let o = vlad(&[
        "inspect",
        ctx("action_step").to_str().unwrap(),
        "--log-level",
        "warn,qnn=debug",
    ]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    assert!(!out.contains("LIBNATIVE"), "{out}");
    assert!(
        out.starts_with("file:") && out.contains("soc model:"),
        "{out}"
    );
    if prints_banner {
        assert!(
            err.lines()
                .any(|l| l.contains(" qnn]") && l.contains("# LIBNATIVE: ")),
            "the banner is not in the qnn log: {err}"
        );
    }
}

#[test]
fn parity_passes_on_the_golden_and_fails_the_gate_on_a_wrong_one() {
    if !qnn_available() {
        return;
    }
    let o = vlad(&[
        "parity",
        ctx("vision").to_str().unwrap(),
        io("vision").to_str().unwrap(),
    ]);
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(0), "{out}{err}");
    assert!(
        out.contains("image_embeds") && out.contains("PASS"),
        "{out}"
    );

    let tmp = scratch("gate");
    let wrong = edited_golden("vision", &tmp, |arrays| {
        let a = arrays
            .iter_mut()
            .find(|a| a.name() == "image_embeds")
            .unwrap();
        let mut v = a.to_f32().unwrap();
        for (i, x) in v.iter_mut().enumerate() {
            if i % 3 == 0 {
                *x = -*x;
            }
        }
        *a = Array::from_f32("image_embeds", a.shape(), &v).unwrap();
    });
    let o = vlad(&[
        "parity",
        ctx("vision").to_str().unwrap(),
        wrong.to_str().unwrap(),
    ]);
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(3), "{out}{err}");
    assert!(out.contains("FAIL"), "{out}");
    assert!(
        err.contains("gate failed") && err.contains("lowest cosine"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&tmp);
}

#[test]
fn bad_golden_npz_is_named_in_one_line() {
    if !qnn_available() {
        return;
    }
    let tmp = scratch("npz");
    let cases: Vec<(PathBuf, &str)> = vec![
        (
            edited_golden("vision", &tmp.join("missing").tap_mkdir(), |a| {
                a.retain(|x| x.name() != "pixel_values")
            }),
            "no array for tensor `pixel_values`",
        ),
        (
            edited_golden("vision", &tmp.join("shape").tap_mkdir(), |arrays| {
                let a = arrays
                    .iter_mut()
                    .find(|a| a.name() == "pixel_values")
                    .unwrap();
                let v = a.to_f32().unwrap();
                *a = Array::from_f32("pixel_values", &[2, 16, 588], &v).unwrap();
            }),
            "tensor `pixel_values` has shape [2, 16, 588], the context needs [1, 2, 16, 588]",
        ),
        (
            edited_golden("vision", &tmp.join("dtype").tap_mkdir(), |arrays| {
                let a = arrays
                    .iter_mut()
                    .find(|a| a.name() == "pixel_values")
                    .unwrap();
                let v: Vec<i32> = a.to_f32().unwrap().iter().map(|x| *x as i32).collect();
                *a = Array::from_i32("pixel_values", a.shape(), &v).unwrap();
            }),
            "tensor `pixel_values` is",
        ),
    ];
    for (path, needle) in cases {
        let o = vlad(&[
            "parity",
            ctx("vision").to_str().unwrap(),
            path.to_str().unwrap(),
        ]);
        let (_, err) = text(&o);
        assert_eq!(o.status.code(), Some(1), "{err}");
        assert!(err.contains(needle), "expected `{needle}` in: {err}");
        let error_lines: Vec<&str> = err.lines().filter(|l| l.starts_with("vlad:")).collect();
        assert_eq!(error_lines.len(), 1, "{err}");
    }
    let o = vlad(&[
        "parity",
        ctx("vision").to_str().unwrap(),
        "/nonexistent/io.npz",
    ]);
    assert_eq!(o.status.code(), Some(1));
    assert!(text(&o).1.contains("/nonexistent/io.npz"));
    let _ = std::fs::remove_dir_all(&tmp);
}

#[test]
fn bad_binary_and_graph_name_fail_cleanly() {
    if !qnn_available() {
        return;
    }
    let tmp = scratch("bin");
    let truncated = tmp.join("vision_socid77_archv73.bin");
    let good = std::fs::read(ctx("vision")).unwrap();
    std::fs::write(&truncated, &good[..1000]).unwrap();
    for (args, needle) in [
        (
            vec!["inspect", truncated.to_str().unwrap()],
            "malformed or truncated",
        ),
        (vec!["inspect", tmp.to_str().unwrap()], "not a regular file"),
        (
            vec![
                "parity",
                ctx("vision").to_str().unwrap(),
                io("vision").to_str().unwrap(),
                "--graph",
                "nope",
            ],
            "no graph named `nope`",
        ),
    ] {
        let o = vlad(&args);
        let (_, err) = text(&o);
        assert_eq!(o.status.code(), Some(1), "{args:?}: {err}");
        assert!(
            err.contains(needle),
            "{args:?}: expected `{needle}` in {err}"
        );
    }
    let o = Command::new(env!("CARGO_BIN_EXE_vlad"))
        .args(["inspect", ctx("vision").to_str().unwrap()])
        .env("VLA_QNN_LIB_DIR", tmp.join("nolibs"))
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    assert!(
        text(&o).1.contains("QNN library directory"),
        "{}",
        text(&o).1
    );
    let _ = std::fs::remove_dir_all(&tmp);
}

#[test]
fn bench_context_prints_its_figures() {
    if !qnn_available() {
        return;
    }
    let o = vlad(&[
        "bench-context",
        ctx("vision").to_str().unwrap(),
        "--inputs",
        io("vision").to_str().unwrap(),
        "--iterations",
        "5",
    ]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    for needle in [
        "load QNN libraries",
        "create context",
        "first 3 executes",
        "steady over 5: p50",
    ] {
        assert!(out.contains(needle), "missing {needle}: {out}");
    }
    assert!(
        out.contains("I/O                            client buffers"),
        "{out}"
    );

    // On shared buffers: the emulator refuses every memRegister (1000), said in one line.
    let dir = std::env::temp_dir().join(format!("vlad-bench-shm-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let Some(standin) = vla_test_support::rpcmem_standin(&dir) else {
        return;
    };
    let o = vlad(&[
        "bench-context",
        ctx("vision").to_str().unwrap(),
        "--inputs",
        io("vision").to_str().unwrap(),
        "--iterations",
        "1",
        "--shared-buffers",
        "--rpcmem",
        standin.to_str().unwrap(),
    ]);
    let (_, err) = text(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    let line = err.lines().last().unwrap_or_default();
    assert!(
        line.contains("memRegister failed for tensor `pixel_values` of graph vision_socid77_archv73: QNN error 1000 (not supported)"),
        "{err}"
    );
    // Through the memory shim (a test-only memRegister in front of the emulator) the
    // graph runs on the registered buffer and reproduces the client-buffer outputs.
    let qnn = std::env::var_os("VLA_QNN_LIB_DIR").expect("checked by qnn_available");
    let Some(shim) = vla_test_support::qnn_mem_shim(&dir.join("qnn"), Path::new(&qnn)) else {
        return;
    };
    let o = vlad(&[
        "bench-context",
        ctx("vision").to_str().unwrap(),
        "--inputs",
        io("vision").to_str().unwrap(),
        "--iterations",
        "2",
        "--shared-buffers",
        "--rpcmem",
        standin.to_str().unwrap(),
        "--lib-dir",
        shim.to_str().unwrap(),
    ]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    assert!(
        out.contains("HTP shared buffer, ")
            && out.contains("outputs bit-identical to client buffers: yes"),
        "{out}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn usage_errors_exit_2() {
    assert_eq!(vlad(&[]).status.code(), Some(2));
    assert_eq!(vlad(&["frobnicate"]).status.code(), Some(2));
    assert_eq!(vlad(&["parity", "only-one-arg"]).status.code(), Some(2));
    assert_eq!(
        vlad(&["bench-context", "x", "--iterations", "many"])
            .status
            .code(),
        Some(2)
    );
}

trait TapMkdir {
    fn tap_mkdir(self) -> Self;
}
impl TapMkdir for PathBuf {
    fn tap_mkdir(self) -> Self {
        std::fs::create_dir_all(&self).unwrap();
        self
    }
}

fn golden_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../golden")
}

#[test]
fn fixed_point_context_runs_from_raw_and_from_float_goldens() {
    if !qnn_available() {
        return;
    }
    let bin = golden_root().join("contexts/qdq_mixed_socid77_archv73.bin");
    let raw = golden_root().join("contexts/qdq_mixed_io.npz");
    let o = vlad(&["inspect", bin.to_str().unwrap()]);
    let (out, _) = text(&o);
    assert!(
        out.contains("ufixed8(scale=0.02, offset=-128)") && out.contains("ufixed16("),
        "{out}"
    );
    let o = vlad(&["parity", bin.to_str().unwrap(), raw.to_str().unwrap()]);
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(0), "{out}{err}");

    // The same inputs as real values: vlad quantizes them with the tensors' own
    // scale/offset, so the outputs must match just as well.
    let npz = Npz::open(&raw).unwrap();
    let tmp = scratch("qdq");
    let dequantized: Vec<Array> = npz
        .names()
        .map(|n| {
            let a = npz.array(n).unwrap();
            let (scale, offset) = match n {
                "x_u8" => (0.02f32, -128f32),
                "x_u16" => (0.0005, -32768.0),
                _ => return a,
            };
            let v: Vec<f32> = a
                .to_f32()
                .unwrap()
                .iter()
                .map(|q| (q + offset) * scale)
                .collect();
            Array::from_f32(n, a.shape(), &v).unwrap()
        })
        .collect();
    let float_io = tmp.join("qdq_float_io.npz");
    write_npz(&float_io, &dequantized.iter().collect::<Vec<_>>()).unwrap();
    let o = vlad(&["parity", bin.to_str().unwrap(), float_io.to_str().unwrap()]);
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(0), "{out}{err}");
    let _ = std::fs::remove_dir_all(&tmp);
}

#[test]
fn bundle_parity_and_run_once() {
    if !qnn_available() {
        return;
    }
    let b = golden_root().join("bundles/molmoact2-lp-vtp-sd");
    let o = vlad(&["parity", "--bundle", b.to_str().unwrap()]);
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(0), "{out}{err}");
    assert!(
        out.contains("llm_split3") && out.contains("end to end") && out.contains("PASS"),
        "{out}"
    );

    let obs = b.join("golden/end_to_end.npz");
    let o = vlad(&[
        "run-once",
        "--bundle",
        b.to_str().unwrap(),
        "--obs",
        obs.to_str().unwrap(),
    ]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    assert!(
        out.contains("action chunk [10 x 7]")
            && out.contains("action_step")
            && out.contains("host glue"),
        "{out}"
    );
    let rows = out
        .lines()
        .skip_while(|l| !l.starts_with("action chunk"))
        .skip(1)
        .take(10);
    assert_eq!(
        rows.filter(|l| l.split_whitespace().count() == 7).count(),
        10,
        "{out}"
    );

    let o = vlad(&[
        "run-once",
        "--bundle",
        b.to_str().unwrap(),
        "--obs",
        obs.to_str().unwrap(),
        "--instruction",
        "99",
    ]);
    let (_, err) = text(&o);
    assert_eq!(o.status.code(), Some(1));
    assert!(err.contains("observation instruction_id"), "{err}");
}
