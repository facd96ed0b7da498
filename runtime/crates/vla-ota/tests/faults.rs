//! Fault injection: each OTA operation runs in a child process (this test binary,
//! re-executed with `VLA_OTA_FAULT_*` variables) that SIGKILLs itself at step boundary
//! number `VLA_OTA_CRASH_AT`, for every boundary the operation has. After each kill the
//! parent runs the start-up recovery (and, like the daemon, the gate of a bundle on
//! trial) and checks that `current` names a complete, verifying bundle the state agrees
//! with, that every bundle stored before is still there and verifies, and that no
//! leftover of the interrupted operation survives.
//!
//! SIGKILL stops the process between two instructions but keeps the page cache; it
//! proves the ordering of the steps, not what a power cut does to unsynced pages.

mod common;

use common::*;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use vla_ota::Store;

const SCENARIO: &str = "VLA_OTA_FAULT_SCENARIO";
const ROOT: &str = "VLA_OTA_FAULT_ROOT";
const SOURCE: &str = "VLA_OTA_FAULT_SOURCE";
const CRASH_AT: &str = "VLA_OTA_CRASH_AT";
const LOG: &str = "VLA_OTA_FAULT_LOG";

/// The child side. Without the variables (an ordinary test run) it does nothing.
#[test]
fn fault_child() {
    let Ok(scenario) = std::env::var(SCENARIO) else {
        return;
    };
    let root = PathBuf::from(std::env::var(ROOT).unwrap());
    let crash_at: u32 = std::env::var(CRASH_AT).unwrap().parse().unwrap();
    let log = PathBuf::from(std::env::var(LOG).unwrap());
    let mut store = store(&root);
    let counter = AtomicU32::new(0);
    store.set_step_hook(move |step| {
        use std::io::Write;
        let n = counter.fetch_add(1, Ordering::SeqCst) + 1;
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .open(&log)
            .unwrap();
        writeln!(f, "{step}").unwrap();
        drop(f);
        if n == crash_at {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::this(), nix::sys::signal::SIGKILL);
            loop {
                std::thread::park();
            }
        }
    });
    let source = std::env::var(SOURCE).map(PathBuf::from).ok();
    match scenario.as_str() {
        "install-activate" => {
            let installed = store.install(&source.unwrap()).unwrap();
            store.activate(&installed.hash, &mut pass).unwrap();
        }
        "install-linked-activate" => {
            let installed = store
                .install_with(&source.unwrap(), vla_ota::Placement::HardLink)
                .unwrap();
            assert!(installed.linked_files > 0);
            store.activate(&installed.hash, &mut pass).unwrap();
        }
        "activate-gate-fails" => {
            let hash = store.verify(&source.unwrap()).unwrap().content_hash;
            let refused = store.bundle_dir(&hash);
            let mut gate = |dir: &Path| {
                if dir == refused {
                    Err("end-to-end cosine 0.5 < 0.999".to_string())
                } else {
                    Ok(())
                }
            };
            let e = store.activate(&hash, &mut gate).unwrap_err();
            assert!(matches!(e, vla_ota::OtaError::GateFailed { .. }), "{e}");
        }
        "start-crash-loop" => {
            let report = store.on_start().unwrap();
            assert!(report.rolled_back.is_some());
        }
        "rollback" => {
            store.rollback("operator request", &mut pass).unwrap();
        }
        "gc" => {
            let report = store.gc().unwrap();
            assert_eq!(report.removed.len(), 1);
        }
        other => panic!("unknown scenario {other}"),
    }
}

/// A prepared store to crash into.
struct Fixture {
    /// Template root, copied fresh for each run.
    template: PathBuf,
    /// Source directory of the bundle the operation brings in, if any.
    source: Option<PathBuf>,
    /// Bundles `current` may name after recovery.
    allowed_current: Vec<String>,
    /// Bundles stored before the operation that must survive it.
    must_keep: Vec<String>,
    /// Bundles the operation may legitimately delete (gc) or add (install).
    may_vary: Vec<String>,
    /// The gate's verdict per bundle when recovery finds a trial (the daemon's start gate).
    refused: Option<String>,
    /// Where the store must end after recovery and the daemon's gate, if fixed.
    final_current: Option<String>,
}

fn hash_of(dir: &Path) -> String {
    vla_ota::verify(dir, &trusted(), &target())
        .unwrap()
        .content_hash
}

fn run_child(
    fixture: &Fixture,
    scenario: &str,
    root: &Path,
    crash_at: u32,
    log: &Path,
) -> std::process::ExitStatus {
    let _ = std::fs::remove_file(log);
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args(["--exact", "fault_child", "--nocapture", "--test-threads=1"])
        .env(SCENARIO, scenario)
        .env(ROOT, root)
        .env(CRASH_AT, crash_at.to_string())
        .env(LOG, log);
    if let Some(s) = &fixture.source {
        cmd.env(SOURCE, s);
    }
    cmd.stdout(std::process::Stdio::null());
    cmd.status().unwrap()
}

fn read_log(log: &Path) -> Vec<String> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}

/// Start-up recovery as the daemon does it: `on_start`, then the gate of a bundle on
/// trial, failing the trial if the gate refuses.
fn recover(root: &Path, fixture: &Fixture) -> Store {
    let store = store(root);
    let report = store.on_start().unwrap();
    if report.trial_start.is_some() {
        let (hash, dir) = report.current.clone().unwrap();
        if fixture.refused.as_deref() == Some(hash.as_str()) {
            let mut gate = |d: &Path| {
                if d == dir {
                    Err("refused at start".to_string())
                } else {
                    Ok(())
                }
            };
            store
                .fail_trial("parity gate failed at start", &mut gate)
                .unwrap();
        }
    }
    store
}

fn check_recovered(store: &Store, fixture: &Fixture, context: &str) {
    let root = store.root();
    let current = current_hash(root).unwrap_or_else(|| panic!("{context}: no current link"));
    assert!(
        fixture.allowed_current.contains(&current),
        "{context}: current is {current}"
    );
    if let Some(f) = &fixture.final_current {
        assert_eq!(&current, f, "{context}: final current");
    }
    let v = store
        .verify(&store.bundle_dir(&current))
        .unwrap_or_else(|e| panic!("{context}: current does not verify: {e}"));
    assert_eq!(v.content_hash, current, "{context}");
    let state = store.status().unwrap().state;
    assert_eq!(
        state.current.as_deref(),
        Some(current.as_str()),
        "{context}: state"
    );
    let previous_link = std::fs::read_link(root.join("previous"))
        .ok()
        .map(|t| t.file_name().unwrap().to_string_lossy().into_owned());
    assert_eq!(
        previous_link, state.previous,
        "{context}: previous link vs state"
    );
    for kept in &fixture.must_keep {
        store
            .verify(&store.bundle_dir(kept))
            .unwrap_or_else(|e| panic!("{context}: stored bundle {kept} lost: {e}"));
    }
    for entry in std::fs::read_dir(store.bundles_dir()).unwrap().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        assert!(
            vla_ota::hex::is_content_hash(&name),
            "{context}: leftover bundles/{name}"
        );
        assert!(
            fixture.must_keep.contains(&name)
                || fixture.may_vary.contains(&name)
                || fixture.allowed_current.contains(&name),
            "{context}: unexpected bundle {name}"
        );
        store
            .verify(&entry.path())
            .unwrap_or_else(|e| panic!("{context}: incomplete bundle {name}: {e}"));
    }
    for entry in std::fs::read_dir(root).unwrap().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        assert!(!name.contains(".tmp-"), "{context}: leftover {name}");
    }
}

/// Runs `scenario` once without a crash to learn its steps, then once per step with a
/// SIGKILL there, checking recovery each time. Returns the step names.
fn crash_at_every_step(
    scenario: &str,
    fixture: &Fixture,
    work: &Path,
    redo: impl Fn(&Store),
) -> Vec<String> {
    let log = work.join(format!("{scenario}.log"));
    let dry = work.join(format!("{scenario}-dry"));
    copy_tree(&fixture.template, &dry);
    let status = run_child(fixture, scenario, &dry, 0, &log);
    assert!(
        status.success(),
        "{scenario}: uninterrupted run failed: {status:?}"
    );
    let steps = read_log(&log);
    assert!(!steps.is_empty(), "{scenario}: no steps reported");
    let _ = std::fs::remove_dir_all(&dry);

    for (i, step) in steps.iter().enumerate() {
        let n = i as u32 + 1;
        let root = work.join(format!("{scenario}-{n}"));
        copy_tree(&fixture.template, &root);
        let status = run_child(fixture, scenario, &root, n, &log);
        let context = format!("{scenario}: killed at step {n} `{step}`");
        assert_eq!(
            status.signal(),
            Some(nix::libc::SIGKILL),
            "{context}: {status:?}"
        );
        assert_eq!(
            read_log(&log).last(),
            Some(step),
            "{context}: steps are not deterministic"
        );
        let store = recover(&root, fixture);
        check_recovered(&store, fixture, &context);
        // Outside a trial (where every start counts), a second recovery has nothing to do.
        if store.status().unwrap().state.trial.is_none() {
            let again = store.on_start().unwrap();
            assert!(
                again.rolled_back.is_none() && again.cleaned.is_empty(),
                "{context}"
            );
            assert!(again.repairs.is_empty(), "{context}: {:?}", again.repairs);
        }
        // The store is still fully usable.
        redo(&store);
        let _ = std::fs::remove_dir_all(&root);
    }
    println!("{scenario}: {} crash points, all recovered", steps.len());
    steps
}

/// A root with bundle A committed; optionally more bundles installed.
fn prepare(work: &Path, extra: &[&str]) -> (PathBuf, String, Vec<(String, PathBuf)>) {
    let template = work.join("template");
    let sources = work.join("sources");
    let store = store(&template);
    let a_src = Spec::new("a").build_signed(&sources, DEV_SECRET);
    let a = store.install(&a_src).unwrap().hash;
    store.activate(&a, &mut pass).unwrap();
    store.commit().unwrap();
    let mut others = Vec::new();
    for tag in extra {
        let src = Spec::new(tag).build_signed(&sources, DEV_SECRET);
        others.push((hash_of(&src), src));
    }
    (template, a, others)
}

#[test]
fn crash_during_install_and_activate() {
    let tmp = TempDir::new("fault-install");
    let (template, a, others) = prepare(tmp.path(), &["b"]);
    let (b, b_src) = others[0].clone();
    let fixture = Fixture {
        template,
        source: Some(b_src.clone()),
        allowed_current: vec![a.clone(), b.clone()],
        must_keep: vec![a.clone()],
        may_vary: vec![b.clone()],
        refused: None,
        final_current: None,
    };
    let steps = crash_at_every_step("install-activate", &fixture, tmp.path(), |store| {
        let installed = store.install(&b_src).unwrap();
        store.activate(&installed.hash, &mut pass).unwrap();
        assert_eq!(current_hash(store.root()).as_deref(), Some(b.as_str()));
    });
    for expected in [
        "stage ctx/vision_socid77_archv73.bin: written",
        "stage ctx/vision_socid77_archv73.bin: fsynced",
        "stage bundle.json: fsynced",
        "stage directory /ctx: fsynced",
        "stage: copy verified",
        "install: before rename of staging",
        "install: before fsync of bundles",
        "install: done",
        "write ota-state.json: before fsync",
        "write ota-state.json: before rename",
        "write ota-state.json: before directory fsync",
        "link current: before rename",
        "link current: before directory fsync",
        "link previous: before rename",
        "activate: before gate",
    ] {
        assert!(
            steps.iter().any(|s| s == expected),
            "step `{expected}` not exercised: {steps:?}"
        );
    }
    assert!(steps.len() >= 35, "{} steps", steps.len());
}

/// Installing by hard links from a RAUC artifact: the same crash points, and the
/// artifact the files are shared with is never damaged by a crash or a recovery.
#[test]
fn crash_during_linked_install_and_activate() {
    let tmp = TempDir::new("fault-link");
    let (template, a, others) = prepare(tmp.path(), &["b"]);
    let (b, b_src) = others[0].clone();
    let artifact = snapshot(&b_src);
    let fixture = Fixture {
        template,
        source: Some(b_src.clone()),
        allowed_current: vec![a.clone(), b.clone()],
        must_keep: vec![a.clone()],
        may_vary: vec![b.clone()],
        refused: None,
        final_current: None,
    };
    let steps = crash_at_every_step("install-linked-activate", &fixture, tmp.path(), |store| {
        assert_eq!(snapshot(&b_src), artifact, "the artifact changed");
        let installed = store
            .install_with(&b_src, vla_ota::Placement::HardLink)
            .unwrap();
        store.activate(&installed.hash, &mut pass).unwrap();
        assert_eq!(current_hash(store.root()).as_deref(), Some(b.as_str()));
    });
    assert!(steps.len() >= 35, "{} steps", steps.len());
    assert_eq!(snapshot(&b_src), artifact);
}

#[test]
fn crash_during_activation_with_a_failing_gate() {
    let tmp = TempDir::new("fault-gate");
    let (template, a, others) = prepare(tmp.path(), &["b"]);
    let (b, b_src) = others[0].clone();
    store(&template).install(&b_src).unwrap();
    let fixture = Fixture {
        template,
        source: Some(b_src),
        allowed_current: vec![a.clone(), b.clone()],
        must_keep: vec![a.clone(), b.clone()],
        may_vary: vec![],
        refused: Some(b.clone()),
        // Wherever it was killed, B never stays current: its gate fails at the next start.
        final_current: Some(a.clone()),
    };
    let steps = crash_at_every_step("activate-gate-fails", &fixture, tmp.path(), |store| {
        assert_eq!(current_hash(store.root()).as_deref(), Some(a.as_str()));
    });
    assert!(steps.iter().any(|s| s == "activate: gate failed"));
    assert!(steps.iter().any(|s| s == "rollback: links moved"));
}

#[test]
fn crash_during_crash_loop_rollback_at_start() {
    let tmp = TempDir::new("fault-loop");
    let (template, a, others) = prepare(tmp.path(), &["b"]);
    let (b, b_src) = others[0].clone();
    let s = store(&template);
    s.install(&b_src).unwrap();
    s.activate(&b, &mut pass).unwrap();
    assert_eq!(s.on_start().unwrap().trial_start, Some(2)); // max_trial_starts reached
    let fixture = Fixture {
        template,
        source: None,
        allowed_current: vec![a.clone(), b.clone()],
        must_keep: vec![a.clone(), b.clone()],
        may_vary: vec![],
        refused: None,
        final_current: Some(a.clone()),
    };
    crash_at_every_step("start-crash-loop", &fixture, tmp.path(), |store| {
        let state = store.status().unwrap().state;
        assert_eq!(state.trial, None);
    });
}

#[test]
fn crash_during_manual_rollback() {
    let tmp = TempDir::new("fault-rollback");
    let (template, a, others) = prepare(tmp.path(), &["b"]);
    let (b, b_src) = others[0].clone();
    let s = store(&template);
    s.install(&b_src).unwrap();
    s.activate(&b, &mut pass).unwrap();
    s.commit().unwrap();
    let fixture = Fixture {
        template,
        source: None,
        allowed_current: vec![a.clone(), b.clone()],
        must_keep: vec![a.clone(), b.clone()],
        may_vary: vec![],
        refused: None,
        final_current: None,
    };
    crash_at_every_step("rollback", &fixture, tmp.path(), |store| {
        // Both stay available: rolling back again returns to the other one.
        let before = current_hash(store.root()).unwrap();
        let rolled = store.rollback("again", &mut pass).unwrap();
        assert_eq!(rolled.from, before);
    });
}

#[test]
fn crash_during_gc() {
    let tmp = TempDir::new("fault-gc");
    let (template, a, others) = prepare(tmp.path(), &["c"]);
    let (c, c_src) = others[0].clone();
    store(&template).install(&c_src).unwrap();
    let fixture = Fixture {
        template,
        source: None,
        allowed_current: vec![a.clone()],
        must_keep: vec![a.clone()],
        may_vary: vec![c.clone()],
        refused: None,
        final_current: Some(a.clone()),
    };
    crash_at_every_step("gc", &fixture, tmp.path(), |store| {
        store.gc().unwrap();
        assert!(!store.bundle_dir(&c).exists());
    });
}
