//! The store without crashes: install, rejections leave the current bundle untouched,
//! activation with a failing gate, trial commit, crash-loop rollback, manual rollback,
//! gc, and the CLI gate that signals the daemon.

mod common;

use common::*;
use std::cell::RefCell;
use std::path::{Path, PathBuf};
use vla_ota::{OtaError, Placement, Store, TrialProgress, Verdict};

/// A store with bundle A installed, activated and committed; returns (store, A's hash).
fn with_committed(root: &Path, sources: &Path) -> (Store, String) {
    let store = store(root);
    let a = Spec::new("a").build_signed(sources, DEV_SECRET);
    let installed = store.install(&a).unwrap();
    assert!(!installed.already_installed);
    store.activate(&installed.hash, &mut pass).unwrap();
    assert_eq!(store.commit().unwrap(), Some(installed.hash.clone()));
    (store, installed.hash)
}

#[test]
fn install_activate_commit_and_idempotence() {
    let tmp = TempDir::new("store-basic");
    let root = tmp.join("root");
    let (store, a) = with_committed(&root, &tmp.join("src"));
    assert_eq!(current_hash(&root).as_deref(), Some(a.as_str()));
    assert_eq!(
        std::fs::read_link(root.join("current")).unwrap(),
        PathBuf::from("bundles").join(&a)
    );
    // The installed copy verifies on its own and its name is its content hash.
    let v = store.verify(&store.bundle_dir(&a)).unwrap();
    assert_eq!(v.content_hash, a);

    // Installing the same bundle again writes nothing.
    let before = snapshot(&root);
    let again = store.install(&tmp.join("src/synthetic-a")).unwrap();
    assert!(again.already_installed);
    assert_eq!(snapshot(&root), before);
    // Activating the current bundle changes nothing.
    assert!(store.activate(&a[..8], &mut pass).unwrap().already_current);
    assert_eq!(snapshot(&root), before);

    let state = store.status().unwrap().state;
    assert_eq!(state.current.as_deref(), Some(a.as_str()));
    assert_eq!((state.previous, state.trial), (None, None));
}

#[test]
fn every_rejected_install_leaves_the_store_untouched() {
    let tmp = TempDir::new("store-reject");
    let root = tmp.join("root");
    let (store, a) = with_committed(&root, &tmp.join("src"));
    let before = snapshot(&root);

    type Damage = fn(&Path);
    let cases: Vec<(&str, Spec, Damage, &str)> = vec![
        (
            "bad signature",
            Spec::new("b"),
            |d| {
                let p = d.join(vla_ota::SIGNATURE_FILE);
                let s = std::fs::read_to_string(&p).unwrap();
                let flipped: String = s
                    .chars()
                    .enumerate()
                    .map(|(i, c)| {
                        if i == 10 {
                            if c == 'a' {
                                'b'
                            } else {
                                'a'
                            }
                        } else {
                            c
                        }
                    })
                    .collect();
                std::fs::write(&p, flipped).unwrap();
            },
            "does not verify",
        ),
        (
            "wrong hash",
            Spec::new("b"),
            |d| {
                let p = d.join("ctx/action_step_socid77_archv73.bin");
                let mut b = std::fs::read(&p).unwrap();
                b[0] ^= 1;
                std::fs::write(&p, b).unwrap();
            },
            "SHA-256",
        ),
        (
            "truncated file",
            Spec::new("b"),
            |d| {
                let p = d.join("ctx/action_step_socid77_archv73.bin");
                let b = std::fs::read(&p).unwrap();
                std::fs::write(&p, &b[..b.len() / 2]).unwrap();
            },
            "(truncated)",
        ),
        (
            "extra file",
            Spec::new("b"),
            |d| {
                std::fs::write(d.join("ctx/extra.bin"), b"payload").unwrap();
            },
            "not listed",
        ),
        (
            "missing file",
            Spec::new("b"),
            |d| {
                std::fs::remove_file(d.join("prompt/prompt_tables.npz")).unwrap();
            },
            "missing",
        ),
        (
            "wrong soc",
            {
                let mut s = Spec::new("b");
                s.soc_model = 69;
                s
            },
            |_| {},
            "soc_model 69",
        ),
        (
            "wrong arch",
            {
                let mut s = Spec::new("b");
                s.htp_arch = 79;
                s
            },
            |_| {},
            "htp_arch 79",
        ),
        (
            "runtime too old",
            {
                let mut s = Spec::new("b");
                s.min_runtime_version = "1.0.0".into();
                s
            },
            |_| {},
            "needs runtime 1.0.0",
        ),
    ];
    for (i, (what, spec, damage, expect)) in cases.into_iter().enumerate() {
        let dir = spec.build_signed(&tmp.join(format!("bad{i}")), DEV_SECRET);
        damage(&dir);
        let e = store.install(&dir).unwrap_err();
        let text = e.to_string();
        assert!(
            text.contains(expect),
            "{what}: `{text}` should mention `{expect}`"
        );
        assert!(!text.contains('\n'), "{what}: one line: {text}");
        assert_eq!(snapshot(&root), before, "{what}: the store changed");
        println!("{what}: {text}");
    }

    // A full disk (free space probe reporting 10 KiB): refused before anything is written.
    let mut full = vla_ota::Store::new(settings(&root));
    full.set_free_space_probe(|_| Ok(10 * 1024));
    let dir = Spec::new("b").build_signed(&tmp.join("full"), DEV_SECRET);
    let e = full.install(&dir).unwrap_err();
    assert!(
        matches!(e, OtaError::InsufficientSpace { free: 10240, needed, .. } if needed > 10240),
        "{e}"
    );
    assert!(
        e.to_string().contains("needs") && e.to_string().contains("10240 bytes free"),
        "{e}"
    );
    println!("full disk: {e}");
    assert_eq!(snapshot(&root), before);
    assert_eq!(current_hash(&root).as_deref(), Some(a.as_str()));
}

#[test]
fn gate_failure_rolls_back_to_the_previous_bundle() {
    let tmp = TempDir::new("store-gate");
    let root = tmp.join("root");
    let (store, a) = with_committed(&root, &tmp.join("src"));
    let b = store
        .install(&Spec::new("b").build_signed(&tmp.join("src"), DEV_SECRET))
        .unwrap()
        .hash;

    let calls: RefCell<Vec<(PathBuf, Option<String>)>> = RefCell::new(Vec::new());
    let b_dir = store.bundle_dir(&b);
    let mut gate = |dir: &Path| -> Result<(), String> {
        // What `current` says while the gate runs.
        calls
            .borrow_mut()
            .push((dir.to_owned(), current_hash(&root)));
        if dir == b_dir {
            Err("end-to-end cosine 0.91 < 0.999".into())
        } else {
            Ok(())
        }
    };
    let e = store.activate(&b, &mut gate).unwrap_err();
    match &e {
        OtaError::GateFailed {
            hash,
            reason,
            rolled_back_to,
            rollback_error,
            refusal,
        } => {
            assert_eq!(hash, &b);
            assert!(reason.contains("0.91"));
            assert_eq!(rolled_back_to.as_deref(), Some(a.as_str()));
            assert!(rollback_error.is_none());
            // The gate's own error comes back typed, not only as text; named in the
            // message, it is not handed out again as the source.
            assert_eq!(refusal.to_string(), *reason);
            assert!(std::error::Error::source(&e).is_none());
        }
        other => panic!("expected GateFailed, got {other}"),
    }
    println!("{e}");
    // The gate saw B as current, then was called again for A after the swap back.
    let calls = calls.into_inner();
    assert_eq!(calls.len(), 2);
    assert_eq!(calls[0], (b_dir, Some(b.clone())));
    assert_eq!(calls[1], (store.bundle_dir(&a), Some(a.clone())));
    assert_eq!(current_hash(&root).as_deref(), Some(a.as_str()));
    let state = store.status().unwrap().state;
    assert_eq!(state.current.as_deref(), Some(a.as_str()));
    assert_eq!(state.trial, None);
    let record = state.last_rollback.unwrap();
    assert_eq!(
        (record.from.as_str(), record.to.as_deref()),
        (b.as_str(), Some(a.as_str()))
    );
    // The failed bundle is no rollback target; gc may remove it.
    assert_eq!(state.previous, None);
    assert!(!root.join("previous").exists());
    let gc = store.gc().unwrap();
    assert_eq!(gc.removed, vec![b.clone()]);
    assert!(!store.bundle_dir(&b).exists());
    assert!(store.bundle_dir(&a).exists());
}

#[test]
fn first_bundle_failing_its_gate_leaves_nothing_active() {
    let tmp = TempDir::new("store-first");
    let root = tmp.join("root");
    let store = store(&root);
    let a = store
        .install(&Spec::new("a").build_signed(&tmp.join("src"), DEV_SECRET))
        .unwrap()
        .hash;
    let e = store
        .activate(&a, &mut |_: &Path| {
            Err("context vision cosine 0.2".to_string())
        })
        .unwrap_err();
    assert!(
        matches!(
            e,
            OtaError::GateFailed {
                rolled_back_to: None,
                ..
            }
        ),
        "{e}"
    );
    assert!(e.to_string().contains("nothing is active"), "{e}");
    assert!(std::fs::symlink_metadata(root.join("current")).is_err());
    let report = store.on_start().unwrap();
    assert!(report.current.is_none());
}

#[test]
fn trial_commits_after_enough_healthy_inferences() {
    let tmp = TempDir::new("store-trial");
    let root = tmp.join("root");
    let (store, a) = with_committed(&root, &tmp.join("src"));
    let b = store
        .install(&Spec::new("b").build_signed(&tmp.join("src"), DEV_SECRET))
        .unwrap()
        .hash;
    let activated = store.activate(&b, &mut pass).unwrap();
    assert_eq!(activated.previous.as_deref(), Some(a.as_str()));
    assert_eq!(store.verdict(&b).unwrap(), Verdict::Pending);
    assert_eq!(
        store.verdict(&a).unwrap(),
        Verdict::Superseded {
            current: Some(b.clone())
        }
    );
    assert_eq!(
        std::fs::read_link(root.join("previous")).unwrap(),
        PathBuf::from("bundles").join(&a)
    );
    // Inferences of a bundle other than the trial one never count.
    assert_eq!(
        store.record_healthy(&a, 100).unwrap(),
        TrialProgress::NotOnTrial
    );
    assert_eq!(
        store.record_healthy(&b, 2).unwrap(),
        TrialProgress::OnTrial {
            healthy: 2,
            needed: 3
        }
    );
    assert_eq!(
        store.verdict(&b).unwrap(),
        Verdict::Running {
            healthy: 2,
            needed: 3
        }
    );
    assert_eq!(
        store.record_healthy(&b, 1).unwrap(),
        TrialProgress::Committed(b.clone())
    );
    assert_eq!(store.verdict(&b).unwrap(), Verdict::Committed);
    assert_eq!(
        store.record_healthy(&b, 1).unwrap(),
        TrialProgress::NotOnTrial
    );
    let state = store.status().unwrap().state;
    assert_eq!(
        (state.current.as_deref(), state.trial.as_deref()),
        (Some(b.as_str()), None)
    );
    assert_eq!(state.previous.as_deref(), Some(a.as_str()));

    // Manual rollback of a committed bundle swaps the two, so it can be undone.
    let rolled = store.rollback("operator request", &mut pass).unwrap();
    assert_eq!(
        (rolled.from.as_str(), rolled.to.as_deref()),
        (b.as_str(), Some(a.as_str()))
    );
    let state = store.status().unwrap().state;
    assert_eq!(state.current.as_deref(), Some(a.as_str()));
    assert_eq!(state.previous.as_deref(), Some(b.as_str()));
    assert_eq!(current_hash(&root).as_deref(), Some(a.as_str()));
    assert_eq!(
        store.verdict(&b).unwrap(),
        Verdict::RolledBack {
            to: Some(a.clone()),
            reason: "operator request".into()
        }
    );
}

#[test]
fn linked_install_shares_the_source_files_and_outlives_the_source() {
    use std::os::unix::fs::MetadataExt;
    let tmp = TempDir::new("store-link");
    let root = tmp.join("root");
    let (store, _a) = with_committed(&root, &tmp.join("src"));
    let source = Spec::new("b").build_signed(&tmp.join("artifact"), DEV_SECRET);
    let files = vla_ota::verify(&source, &trusted(), &target())
        .unwrap()
        .manifest
        .files;
    let installed = store.install_with(&source, Placement::HardLink).unwrap();
    assert_eq!(installed.linked_files, files.len());
    for f in &files {
        let (ours, theirs) = (
            std::fs::metadata(installed.dir.join(&f.path)).unwrap(),
            std::fs::metadata(source.join(&f.path)).unwrap(),
        );
        assert_eq!(
            (ours.dev(), ours.ino()),
            (theirs.dev(), theirs.ino()),
            "{}",
            f.path
        );
    }
    // The source (a RAUC artifact replaced by the next update) goes away: the installed
    // bundle keeps its data, verifies and activates.
    std::fs::remove_dir_all(&source).unwrap();
    store.verify(&installed.dir).unwrap();
    store.activate(&installed.hash, &mut pass).unwrap();
    assert_eq!(current_hash(&root), Some(installed.hash.clone()));
    // Installing it again (from a copy) is a no-op.
    let again = Spec::new("b").build_signed(&tmp.join("again"), DEV_SECRET);
    assert!(
        store
            .install_with(&again, Placement::HardLink)
            .unwrap()
            .already_installed
    );
}

/// Run as root (a RAUC handler), the store leaves everything it creates owned by the
/// owner of the OTA root, so the daemon's user can later replace the state, move the
/// links and delete old bundles. Linked files keep their owner (they are the artifact's).
#[test]
fn root_run_operations_leave_files_to_the_owner_of_the_root() {
    use std::os::unix::fs::MetadataExt;
    if !nix::unistd::geteuid().is_root() {
        vla_test_support::cannot_run("not root: cannot check the root-run ownership");
        return;
    }
    let (uid, gid) = (4321, 4322);
    let tmp = TempDir::new("store-owner");
    let root = tmp.join("root");
    std::fs::create_dir_all(&root).unwrap();
    std::os::unix::fs::chown(&root, Some(uid), Some(gid)).unwrap();
    let store = store(&root);
    let copied = store
        .install(&Spec::new("a").build_signed(&tmp.join("src"), DEV_SECRET))
        .unwrap();
    store.activate(&copied.hash, &mut pass).unwrap();
    let linked = store
        .install_with(
            &Spec::new("b").build_signed(&tmp.join("artifact"), DEV_SECRET),
            Placement::HardLink,
        )
        .unwrap();
    assert!(linked.linked_files > 0);
    store.activate(&linked.hash, &mut pass).unwrap();
    let mut checked = 0;
    let mut stack = vec![root.clone()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let meta = std::fs::symlink_metadata(&path).unwrap();
            let shared = meta.is_file() && meta.nlink() > 1;
            if !shared {
                assert_eq!((meta.uid(), meta.gid()), (uid, gid), "{}", path.display());
                checked += 1;
            }
            if meta.is_dir() {
                stack.push(path);
            }
        }
    }
    // lock, state, current, previous, bundles/, two bundle dirs and their files
    assert!(checked >= 10, "{checked}");
}

#[test]
fn linked_install_of_a_damaged_source_is_refused_and_links_nothing() {
    let tmp = TempDir::new("store-link-bad");
    let root = tmp.join("root");
    let (store, _a) = with_committed(&root, &tmp.join("src"));
    let before = snapshot(&root);
    let source = Spec::new("b").build_signed(&tmp.join("artifact"), DEV_SECRET);
    let victim = source.join("bundle.json");
    let mut bytes = std::fs::read(&victim).unwrap();
    bytes.push(b' ');
    std::fs::write(&victim, bytes).unwrap();
    let e = store
        .install_with(&source, Placement::HardLink)
        .unwrap_err();
    assert!(e.to_string().contains("bundle.json"), "{e}");
    assert_eq!(snapshot(&root), before);
}

#[test]
fn crash_loop_during_trial_rolls_back_on_the_next_start() {
    let tmp = TempDir::new("store-loop");
    let root = tmp.join("root");
    let (store, a) = with_committed(&root, &tmp.join("src"));
    let b = store
        .install(&Spec::new("b").build_signed(&tmp.join("src"), DEV_SECRET))
        .unwrap()
        .hash;
    store.activate(&b, &mut pass).unwrap();
    // max_trial_starts = 2: activation was start 1, this restart is start 2.
    let report = store.on_start().unwrap();
    assert_eq!(report.trial_start, Some(2));
    assert!(report.rolled_back.is_none());
    assert_eq!(
        report.current.as_ref().map(|c| c.0.as_str()),
        Some(b.as_str())
    );
    store.record_healthy(&b, 1).unwrap();
    // It crashed again before 3 healthy inferences: the next start rolls back first.
    let report = store.on_start().unwrap();
    let rolled = report.rolled_back.expect("a rollback");
    assert_eq!(
        (rolled.from.as_str(), rolled.to.as_deref()),
        (b.as_str(), Some(a.as_str()))
    );
    assert!(
        rolled.reason.contains("crash loop: 2 starts"),
        "{}",
        rolled.reason
    );
    assert_eq!(
        report.current.as_ref().map(|c| c.0.as_str()),
        Some(a.as_str())
    );
    assert_eq!(current_hash(&root).as_deref(), Some(a.as_str()));
    // Later starts are ordinary.
    let report = store.on_start().unwrap();
    assert!(report.rolled_back.is_none() && report.trial_start.is_none());
}

#[test]
fn a_current_bundle_damaged_on_disk_is_rolled_back_at_start() {
    let tmp = TempDir::new("store-rot");
    let root = tmp.join("root");
    let (store, a) = with_committed(&root, &tmp.join("src"));
    let b = store
        .install(&Spec::new("b").build_signed(&tmp.join("src"), DEV_SECRET))
        .unwrap()
        .hash;
    store.activate(&b, &mut pass).unwrap();
    store.record_healthy(&b, 3).unwrap();
    // Bit rot in the committed current bundle.
    let p = store.bundle_dir(&b).join("ctx/vision_socid77_archv73.bin");
    let mut perms = std::fs::metadata(&p).unwrap().permissions();
    #[allow(clippy::permissions_set_readonly_false)]
    perms.set_readonly(false);
    std::fs::set_permissions(&p, perms).unwrap();
    let mut bytes = std::fs::read(&p).unwrap();
    bytes[7] ^= 0xff;
    std::fs::write(&p, bytes).unwrap();
    let report = store.on_start().unwrap();
    let rolled = report.rolled_back.expect("rollback");
    assert!(
        rolled.reason.contains("does not verify"),
        "{}",
        rolled.reason
    );
    assert_eq!(report.current.map(|c| c.0), Some(a));
}

#[test]
fn gc_keeps_referenced_and_mapped_bundles() {
    let tmp = TempDir::new("store-gc");
    let root = tmp.join("root");
    let (mut store, a) = with_committed(&root, &tmp.join("src"));
    let mut hashes = Vec::new();
    for tag in ["b", "c", "d"] {
        let h = store
            .install(&Spec::new(tag).build_signed(&tmp.join("src"), DEV_SECRET))
            .unwrap()
            .hash;
        hashes.push(h);
    }
    let (b, c, d) = (hashes[0].clone(), hashes[1].clone(), hashes[2].clone());
    store.activate(&b, &mut pass).unwrap(); // current = trial = b, previous = a
                                            // A fake /proc in which process 4242 maps a context binary of c.
    let proc_root = tmp.join("proc");
    std::fs::create_dir_all(proc_root.join("4242")).unwrap();
    let bundles = std::fs::canonicalize(store.bundles_dir()).unwrap();
    std::fs::write(
        proc_root.join("4242/maps"),
        format!(
            "7f0000000000-7f0000100000 r--s 00000000 08:01 99 {}/{c}/ctx/vision_socid77_archv73.bin\n",
            bundles.display()
        ),
    )
    .unwrap();
    store.set_proc_root(&proc_root);
    let report = store.gc().unwrap();
    assert_eq!(report.removed, vec![d.clone()]);
    assert!(report.freed_bytes > 8000);
    assert_eq!(report.kept.len(), 1);
    assert_eq!(report.kept[0].0, c);
    for kept in [&a, &b, &c] {
        store.verify(&store.bundle_dir(kept)).unwrap();
    }
    assert!(!store.bundle_dir(&d).exists());
    let status = store.status().unwrap();
    assert!(status.bundles.iter().any(|i| i.hash == c && i.mapped));
    assert!(status.leftovers.is_empty());
}

/// Whether SIGHUP is (ignored, blocked) in process `pid`, from /proc/<pid>/status, read
/// once the process has exec'd `sleep` (its comm tells).
fn sighup_ignored_or_blocked(pid: u32) -> (bool, bool) {
    let started = std::time::Instant::now();
    loop {
        let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
        if comm.trim() == "sleep" {
            break;
        }
        assert!(
            started.elapsed() < vla_test_support::HANG_GUARD,
            "the stand-in daemon never exec'd sleep"
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let mask = |key: &str| {
        let hex = status
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .unwrap_or_else(|| panic!("no {key} in /proc/{pid}/status"));
        u64::from_str_radix(hex.trim(), 16).unwrap() & (1 << (nix::libc::SIGHUP - 1)) != 0
    };
    (mask("SigIgn:"), mask("SigBlk:"))
}

#[test]
fn cli_gate_signals_the_daemon_named_in_the_pid_file() {
    let tmp = TempDir::new("store-signal");
    let root = tmp.join("root");
    let (store, _a) = with_committed(&root, &tmp.join("src"));
    let b = store
        .install(&Spec::new("b").build_signed(&tmp.join("src"), DEV_SECRET))
        .unwrap()
        .hash;
    let c = store
        .install(&Spec::new("c").build_signed(&tmp.join("src"), DEV_SECRET))
        .unwrap()
        .hash;

    // A stand-in daemon: SIGHUP's default action ends it, which the test observes. The
    // disposition is reset explicitly (`env --default-signal`): under `nohup` or a CI
    // runner that ignores SIGHUP, an inherited SIG_IGN would survive the exec and `sleep`
    // would never see the signal. A blocked SIGHUP cannot be undone by env: say so.
    let mut daemon = std::process::Command::new("env")
        .args(["--default-signal=HUP", "sleep", "30"])
        .spawn()
        .unwrap();
    let (ignored, blocked) = sighup_ignored_or_blocked(daemon.id());
    assert!(!ignored, "SIGHUP still ignored in the stand-in daemon");
    assert!(
        !blocked,
        "SIGHUP is blocked in the signal mask this test inherited; run it with SIGHUP unblocked"
    );
    std::fs::write(root.join(vla_ota::PID_FILE), format!("{}\n", daemon.id())).unwrap();

    // A pid file naming another program is stale: not signalled.
    let mut gate = vla_ota::SignalDaemon::new(&store, "vlad");
    store.activate(&b, &mut gate).unwrap();
    let outcome = gate.outcome.clone().unwrap();
    assert!(
        outcome.contains("stale pid file, not signalled"),
        "{outcome}"
    );
    assert!(daemon.try_wait().unwrap().is_none(), "sleep must still run");

    // The full record: pid, boot id, start time. A record from another boot, or whose
    // pid now names a process started at another time (pid reuse), is stale even though
    // the comm matches.
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap();
    let stat = std::fs::read_to_string(format!("/proc/{}/stat", daemon.id())).unwrap();
    let start: u64 = stat[stat.rfind(')').unwrap() + 1..]
        .split_whitespace()
        .nth(19)
        .unwrap()
        .parse()
        .unwrap();
    let daemon_pid = daemon.id();
    let write = |boot: &str, start: u64| {
        std::fs::write(
            root.join(vla_ota::PID_FILE),
            format!("{daemon_pid} {} {start}\n", boot.trim()),
        )
        .unwrap()
    };
    // (Each activation changes `current`: activating the current bundle calls no gate.)
    for (bundle, record_boot, record_start, why) in [
        (
            &c,
            "00000000-0000-0000-0000-000000000000",
            start,
            "earlier boot",
        ),
        (&b, boot.as_str(), start + 1, "started after"),
    ] {
        write(record_boot, record_start);
        let mut gate = vla_ota::SignalDaemon::new(&store, "sleep");
        store.activate(bundle, &mut gate).unwrap();
        let outcome = gate.outcome.clone().unwrap();
        assert!(
            outcome.contains(why) && outcome.contains("not signalled"),
            "{outcome}"
        );
        assert!(daemon.try_wait().unwrap().is_none(), "sleep must still run");
    }
    write(&boot, start);
    let mut gate = vla_ota::SignalDaemon::new(&store, "sleep");
    store.activate(&c, &mut gate).unwrap();
    assert!(gate.outcome.clone().unwrap().contains("sent SIGHUP"));
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(daemon.wait().unwrap().signal(), Some(nix::libc::SIGHUP));

    // No daemon: the bundle is loaded at the next start.
    std::fs::remove_file(root.join(vla_ota::PID_FILE)).unwrap();
    let mut gate = vla_ota::SignalDaemon::new(&store, "vlad");
    store.activate(&b, &mut gate).unwrap();
    assert!(gate.outcome.unwrap().contains("next start"));
}

/// Whether signal `sig` is in the `key` mask (`SigCgt:`, `SigBlk:`) of a `/proc` status.
fn in_mask(status: &str, key: &str, sig: i32) -> bool {
    status
        .lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|h| u64::from_str_radix(h.trim(), 16).ok())
        .is_some_and(|m| m & (1 << (sig - 1)) != 0)
}

/// Waits until process `pid` runs `comm` and (if `catching`) has a handler for SIGUSR2.
fn wait_for_stand_in(pid: u32, comm: &str, catching: bool) {
    let started = std::time::Instant::now();
    loop {
        let name = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        if name.trim() == comm && (in_mask(&status, "SigCgt:", nix::libc::SIGUSR2) || !catching) {
            return;
        }
        assert!(
            started.elapsed() < vla_test_support::HANG_GUARD,
            "the stand-in daemon never ran {comm}"
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

#[test]
fn a_pack_install_sends_sigusr2_only_to_a_daemon_that_catches_it_else_sighup() {
    use std::os::unix::process::ExitStatusExt;
    // The stand-ins inherit this thread's signal mask (a shell blocks signals for moments
    // of its own, so theirs is not looked at): refuse to run with the signals blocked.
    let mask = std::fs::read_to_string("/proc/thread-self/status").unwrap();
    for sig in [nix::libc::SIGUSR2, nix::libc::SIGHUP] {
        assert!(
            !in_mask(&mask, "SigBlk:", sig),
            "signal {sig} is blocked in the mask this test inherited; run it unblocked"
        );
    }
    let tmp = TempDir::new("store-packs-signal");
    let root = tmp.join("root");
    let (store, _a) = with_committed(&root, &tmp.join("src"));

    // A daemon that catches SIGUSR2 (its handler exits 7): it gets SIGUSR2. Dispositions
    // reset explicitly, whatever this test inherited.
    let mut catching = std::process::Command::new("env")
        .args([
            "--default-signal=HUP,USR2",
            "sh",
            "-c",
            "trap 'exit 7' USR2; while :; do sleep 0.05; done",
        ])
        .spawn()
        .unwrap();
    wait_for_stand_in(catching.id(), "sh", true);
    std::fs::write(root.join(vla_ota::PID_FILE), format!("{}\n", catching.id())).unwrap();
    let mut gate = vla_ota::SignalDaemon::new(&store, "sh");
    gate.packs_changed().unwrap();
    let outcome = gate.outcome.clone().unwrap();
    assert!(outcome.contains("sent SIGUSR2"), "{outcome}");
    assert_eq!(catching.wait().unwrap().code(), Some(7));

    // One that does not (an older daemon): SIGHUP, never SIGUSR2 (its default ends it).
    let mut older = std::process::Command::new("env")
        .args(["--default-signal=HUP,USR2", "sleep", "30"])
        .spawn()
        .unwrap();
    wait_for_stand_in(older.id(), "sleep", false);
    std::fs::write(root.join(vla_ota::PID_FILE), format!("{}\n", older.id())).unwrap();
    let mut gate = vla_ota::SignalDaemon::new(&store, "sleep");
    gate.packs_changed().unwrap();
    let outcome = gate.outcome.clone().unwrap();
    assert!(
        outcome.contains("does not catch SIGUSR2") && outcome.contains("sent SIGHUP"),
        "{outcome}"
    );
    assert_eq!(older.wait().unwrap().signal(), Some(nix::libc::SIGHUP));

    // No daemon: nothing signalled, attached at the next start.
    std::fs::remove_file(root.join(vla_ota::PID_FILE)).unwrap();
    let mut gate = vla_ota::SignalDaemon::new(&store, "vlad");
    gate.packs_changed().unwrap();
    assert!(gate.outcome.unwrap().contains("next start"));
}

#[test]
fn the_daemon_record_names_this_process_in_this_boot_and_replaces_the_old_one() {
    let tmp = TempDir::new("store-record");
    let root = tmp.join("root");
    let (store, _a) = with_committed(&root, &tmp.join("src"));
    std::fs::write(root.join(vla_ota::PID_FILE), "").unwrap();
    store.record_daemon(None).unwrap();
    let text = std::fs::read_to_string(root.join(vla_ota::PID_FILE)).unwrap();
    let fields: Vec<&str> = text.split_whitespace().collect();
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap();
    assert_eq!(fields.len(), 3, "{text:?}");
    assert_eq!(fields[0], std::process::id().to_string());
    assert_eq!(fields[1], boot.trim());
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap();
    let start = stat[stat.rfind(')').unwrap() + 1..]
        .split_whitespace()
        .nth(19)
        .unwrap();
    assert_eq!(fields[2], start);
    assert!(text.ends_with('\n'));
    let leftovers: Vec<_> = std::fs::read_dir(&root)
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().contains(".tmp"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

/// What `vlad ota verdict --wait` keys on: the record names this (live) process, and once
/// it has gated a bundle, that bundle and its gate's inference time; a record naming
/// another program, or a process that is gone, is no live daemon.
#[test]
fn the_daemon_record_says_whether_it_lives_and_what_it_has_gated() {
    let tmp = TempDir::new("store-daemon");
    let root = tmp.join("root");
    let (store, a) = with_committed(&root, &tmp.join("src"));
    assert_eq!(store.daemon("vlad").unwrap(), vla_ota::Daemon::Absent);
    let comm = std::fs::read_to_string("/proc/self/comm").unwrap();
    let comm = comm.trim();
    let me = std::process::id() as i32;
    store.record_daemon(None).unwrap();
    assert_eq!(
        store.daemon(comm).unwrap(),
        vla_ota::Daemon::Alive {
            pid: me,
            gated: None
        }
    );
    let inference = std::time::Duration::from_millis(88_908);
    store.record_daemon(Some((&a, inference))).unwrap();
    let text = std::fs::read_to_string(root.join(vla_ota::PID_FILE)).unwrap();
    assert_eq!(text.split_whitespace().count(), 5, "{text:?}");
    assert_eq!(
        store.daemon(comm).unwrap(),
        vla_ota::Daemon::Alive {
            pid: me,
            gated: Some(vla_ota::Gated {
                hash: a.clone(),
                inference
            })
        }
    );
    match store.daemon("vlad").unwrap() {
        vla_ota::Daemon::Gone { why, .. } => assert!(why.contains("not vlad"), "{why}"),
        other => panic!("another program's pid is no daemon: {other:?}"),
    }
    // A process that has exited.
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let pid = child.id();
    child.wait().unwrap();
    std::fs::write(root.join(vla_ota::PID_FILE), format!("{pid}\n")).unwrap();
    match store.daemon(comm).unwrap() {
        vla_ota::Daemon::Gone { why, .. } => assert!(why.contains("not running"), "{why}"),
        other => panic!("an exited pid is no daemon: {other:?}"),
    }
}

#[test]
fn links_without_a_state_file_are_adopted_and_foreign_links_protected() {
    let tmp = TempDir::new("store-adopt");
    let root = tmp.join("root");
    let (store, a) = with_committed(&root, &tmp.join("src"));
    // A factory image ships bundles/<hash> and the `current` link, but no state.
    std::fs::remove_file(root.join(vla_ota::STATE_FILE)).unwrap();
    let report = store.on_start().unwrap();
    assert_eq!(report.current.map(|c| c.0), Some(a.clone()));
    assert!(
        report.repairs.iter().any(|r| r.contains("rebuilt")),
        "{:?}",
        report.repairs
    );
    let state = store.status().unwrap().state;
    assert_eq!(
        (state.current.as_deref(), state.trial.as_deref()),
        (Some(a.as_str()), None)
    );
    // Written back: the next start has nothing to repair.
    assert!(store.on_start().unwrap().repairs.is_empty());

    // A `current` link pointing outside the store is never replaced or removed.
    let other_root = tmp.join("other");
    let other = vla_ota::Store::new(settings(&other_root));
    let b = other
        .install(&Spec::new("b").build_signed(&tmp.join("src"), DEV_SECRET))
        .unwrap()
        .hash;
    std::os::unix::fs::symlink("/usr/share/vla/factory", other_root.join("current")).unwrap();
    assert!(other.on_start().unwrap().current.is_none());
    let e = other.activate(&b, &mut pass).unwrap_err();
    assert!(e.to_string().contains("outside the store"), "{e}");
    assert_eq!(
        std::fs::read_link(other_root.join("current")).unwrap(),
        std::path::PathBuf::from("/usr/share/vla/factory")
    );
}
