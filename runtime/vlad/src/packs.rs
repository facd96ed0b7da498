//! The Fast-WAM instruction packs of the bundle vlad runs: at every load (start, SIGHUP
//! reload) the OTA store's packs naming the bundle are verified again and attached to the
//! policy; `vlad ota install` of a pack for the current bundle sends SIGUSR2 and the daemon
//! attaches the new ones while it runs, without a reload (the text thread, see
//! `daemon::text`). Each file's SHA-256 is computed as it is read, once, and the policy uses
//! exactly those bytes (`pack.json` parsed from them, the rows kept in private memory, never
//! read again by path; [`crate::verified::HashedFiles`]). A pack that fails is skipped with
//! one warning line; the bundle runs with its fixed instructions and the other packs.

use vla_ota::Store;

// The ring's naming of pack instruction ids is the policy's.
const _: () = assert!(vla_policy::PACK_INSTRUCTION_FLAG == vla_ring::PACK_ID_FLAG);
use vla_policy::{AttachedPacks, Bundle, PackAttacher, Policy, PolicyKind};

/// `(name, version, policy)` of `bundle`: what a pack names it by.
pub fn names(bundle: &Bundle) -> (&str, &str, &'static str) {
    let m = &bundle.manifest;
    (&m.name, &m.version, m.policy.kind().name())
}

/// Attaches the store's packs of `bundle` to `policy` (before any text renderer is
/// handed out); returns how many instructions they add.
pub fn attach_installed(store: &Store, bundle: &Bundle, policy: &mut Policy) -> usize {
    let (name, version, kind) = names(bundle);
    let scan = match store.packs_for_deferring((name, version, kind)) {
        Ok(scan) => scan,
        Err(e) => {
            log::warn!("instruction packs: {}", crate::error_line(&e));
            return 0;
        }
    };
    for e in &scan.refused {
        log::warn!("instruction pack refused: {}", crate::error_line(e));
    }
    let mut added = 0;
    for (pack, digests) in scan.packs.iter().zip(scan.digests) {
        let files = crate::verified::HashedFiles { digests };
        match policy.attach_pack(&pack.dir, Some(&files)) {
            Ok((label, n)) => {
                log::info!(
                    "instruction pack {} ({label}): {n} instructions of {name} {version}",
                    &pack.content_hash[..12]
                );
                added += n;
            }
            Err(e) => log::warn!("{}; not attached", crate::error_line(&e)),
        }
    }
    added
}

/// Attaches the store's packs of the bundle `attacher` runs that it does not hold yet
/// (the daemon's SIGUSR2, on the text thread: never the inference thread), each verified
/// again with the store's keys and checked against the bundle; returns the new sets of
/// packs in order, for the inference thread to install. A pack that fails is one warning
/// line and is not attached (the ones attached before stay); one the bundle refused is
/// added to `refused` and not tried again (its directory is named by its content).
pub fn attach_new(
    store: &Store,
    attacher: &mut PackAttacher,
    refused: &mut Vec<std::path::PathBuf>,
) -> Vec<AttachedPacks> {
    let (name, version) = {
        let (n, v) = attacher.bundle();
        (n.to_owned(), v.to_owned())
    };
    let scan = match store.packs_for_deferring((&name, &version, PolicyKind::Fastwam.name())) {
        Ok(scan) => scan,
        Err(e) => {
            log::warn!(
                "instruction packs: {}; nothing attached",
                crate::error_line(&e)
            );
            return Vec::new();
        }
    };
    for e in &scan.refused {
        log::warn!(
            "instruction pack refused: {}; not attached",
            crate::error_line(e)
        );
    }
    let mut sets = Vec::new();
    let mut tried = !scan.refused.is_empty();
    for (pack, digests) in scan.packs.iter().zip(scan.digests) {
        if attacher.packs().holds_dir(&pack.dir) || refused.contains(&pack.dir) {
            continue;
        }
        tried = true;
        let files = crate::verified::HashedFiles { digests };
        match attacher.attach(&pack.dir, Some(&files)) {
            Ok((set, label, n)) => {
                log::info!(
                    "instruction pack {} ({label}): {n} instructions of {name} {version}, attached while running (no reload)",
                    &pack.content_hash[..12]
                );
                sets.push(set);
            }
            Err(e) => {
                log::warn!("{}; not attached", crate::error_line(&e));
                refused.push(pack.dir.clone());
            }
        }
    }
    if !tried {
        log::info!("instruction packs of {name} {version}: none new to attach");
    }
    sets
}

/// `vlad ota install` of a pack (installed under `packs/`): says so and, when the pack
/// goes with the current bundle, tells the running daemon (SIGUSR2: attached without a
/// reload; SIGHUP to an older daemon); with no daemon running it is attached at the next
/// start.
pub fn installed(store: &Store, installed: &vla_ota::Installed) -> Result<(), crate::Failure> {
    if installed.already_installed {
        println!("instruction pack already installed: {}", installed.hash);
    } else {
        println!(
            "installed instruction pack {} in {}",
            installed.hash,
            installed.dir.display()
        );
    }
    let pack = store.verify(&installed.dir)?;
    let current = match store.current()? {
        Some((_, dir)) => Some(store.verify(&dir)?),
        None => None,
    };
    match current {
        Some(bundle) if pack.manifest.goes_with(bundle.manifest.names()) => {
            let mut gate = vla_ota::SignalDaemon::new(store, "vlad");
            gate.packs_changed()
                .map_err(|e| crate::Failure::Error(format!("signalling the daemon: {e}")))?;
            println!(
                "it goes with the current bundle; {}",
                gate.outcome.unwrap_or_default()
            );
        }
        _ => {
            let (name, version, _) = pack.manifest.names();
            println!("it goes with {name} {version}, not the current bundle: attached when that bundle runs");
        }
    }
    Ok(())
}

/// `vlad ota status`'s lines for the installed packs.
pub fn print_status(status: &vla_ota::Status, current: Option<&str>) {
    println!("instruction packs:");
    if status.packs.is_empty() {
        println!("  (none)");
    }
    let current = current.and_then(|h| status.bundles.iter().find(|b| b.hash == h));
    for p in &status.packs {
        let with_current =
            current.is_some_and(|b| (b.name.as_str(), b.version.as_str()) == (&p.name, &p.version));
        println!(
            "  {}  for {:<28} {:<10} {:>12} bytes  {}",
            &p.hash[..12.min(p.hash.len())],
            p.name,
            p.version,
            p.bytes,
            match (with_current, p.mapped) {
                (true, true) => "current,mapped",
                (true, false) => "current",
                (false, true) => "mapped",
                (false, false) => "",
            }
        );
    }
}
