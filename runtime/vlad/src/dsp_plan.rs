//! The DSP memory plan of a bundle: its contexts' footprints (from the binaries, or from a
//! published sizes table), the configured placement, and the refusal of one that cannot
//! fit. vla-qnn's [`MemoryPlan`] does the arithmetic; this module feeds it the bundle and
//! the `npu` section, and is what `vlad plan` and the daemon's start share. The daemon
//! plans each bundle it loads before creating its contexts, and keeps the running one's
//! plan for STATUS, the metrics and the recordings.

use crate::Failure;
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Mutex, OnceLock};
use vla_qnn::{
    Backend, ContextPlacement, Footprint, Group, MemoryPlan, Placement, QnnLibrary, MIB,
};

/// NSPs QCS9075 has (Linux remoteproc for SA8775p lists CDSP0 and CDSP1): the count a plan
/// made off the board assumes.
pub const BOARD_NSPS: u32 = 2;

/// A failure's one line, for a message that carries it on.
pub fn text(f: Failure) -> String {
    match f {
        Failure::Usage(s) | Failure::Error(s) | Failure::Gate(s) | Failure::Pending(s) => s,
    }
}

/// The placement the `npu` section asks for.
pub fn placement(npu: &vla_config::NpuConfig) -> Placement {
    match npu.placement {
        vla_config::NpuPlacement::Auto => Placement::Auto,
        vla_config::NpuPlacement::Groups => Placement::Groups(
            npu.groups
                .iter()
                .map(|g| Group {
                    nsp: g.nsp.into(),
                    contexts: g.contexts.iter().map(|c| c.to_string()).collect(),
                })
                .collect(),
        ),
    }
}

/// The NSPs a plan under the `npu` section can put sessions on, of a platform with
/// `nsps` of them: with `auto` every one, with groups the ones they name (a group on an
/// NSP the platform lacks is refused by the plan, not voted for).
pub fn placeable_nsps(npu: &vla_config::NpuConfig, nsps: u32) -> Vec<u32> {
    match npu.placement {
        vla_config::NpuPlacement::Auto => (0..nsps.max(1)).collect(),
        vla_config::NpuPlacement::Groups => {
            let mut used: Vec<u32> = npu
                .groups
                .iter()
                .map(|g| u32::from(g.nsp))
                .filter(|&n| n < nsps.max(1))
                .collect();
            used.sort_unstable();
            used.dedup();
            used
        }
    }
}

/// The per-session budget of the `npu` section, in bytes.
pub fn budget(npu: &vla_config::NpuConfig) -> u64 {
    u64::from(npu.budget_mb()) * MIB
}

/// The footprints of a bundle's contexts in pipeline order. With the QNN system library,
/// each binary states its spill-fill and I/O sizes; without it (`lib` `None`) only the
/// file sizes are known, and spill-fill and I/O count as 0.
pub fn bundle_footprints(
    bundle: &vla_policy::Bundle,
    lib: Option<&QnnLibrary>,
) -> Result<Vec<Footprint>, Failure> {
    let mut out = Vec::new();
    for name in bundle.manifest.required_components() {
        let c = bundle.manifest.components.get(&name).ok_or_else(|| {
            Failure::Error(format!(
                "bundle {}: component `{name}` is not in its manifest",
                bundle.dir.display()
            ))
        })?;
        let path = bundle.path(&c.binary);
        let footprint = match lib {
            Some(lib) => Footprint::of(&name, &vla_qnn::ContextBinary::open(lib, &path)?),
            None => Footprint {
                name: name.clone(),
                weights: std::fs::metadata(&path)
                    .map_err(|e| Failure::Error(format!("{}: {e}", path.display())))?
                    .len(),
                spill_fill: 0,
                io: 0,
            },
        };
        out.push(footprint);
    }
    Ok(out)
}

/// Plans `footprints` as `npu` asks on `nsps` NSPs; a placement that cannot be planned is
/// the one-line error naming the session, its sum and the budget.
pub fn compute(
    what: &str,
    footprints: Vec<Footprint>,
    npu: &vla_config::NpuConfig,
    nsps: u32,
) -> Result<MemoryPlan, Failure> {
    MemoryPlan::compute(footprints, &placement(npu), nsps, budget(npu))
        .map_err(|e| Failure::Error(format!("{what}: placement refused: {e}")))
}

/// One release of a sizes table: its name, source and footprints (weights only).
pub struct Release {
    /// The release's name.
    pub name: String,
    /// Where its sizes were read.
    pub source: String,
    /// Its contexts, in pipeline order.
    pub footprints: Vec<Footprint>,
}

/// Reads a sizes table (golden/releases/context-sizes.json): `{"releases": [{"name",
/// "source", "contexts": [{"name", "mb", "io_bytes"}, ...]}]}`, MB read as MiB,
/// `io_bytes` optional (0).
pub fn read_sizes(path: &Path) -> Result<Vec<Release>, Failure> {
    let bad = |why: String| Failure::Error(format!("{}: {why}", path.display()));
    let text = std::fs::read(path).map_err(|e| bad(e.to_string()))?;
    let v: serde_json::Value = serde_json::from_slice(&text).map_err(|e| bad(e.to_string()))?;
    let releases = v["releases"]
        .as_array()
        .ok_or_else(|| bad("no \"releases\" list".into()))?;
    let mut out = Vec::new();
    for (i, r) in releases.iter().enumerate() {
        let name = r["name"]
            .as_str()
            .ok_or_else(|| bad(format!("releases[{i}] has no \"name\"")))?;
        let contexts = r["contexts"]
            .as_array()
            .ok_or_else(|| bad(format!("release `{name}` has no \"contexts\" list")))?;
        let mut footprints = Vec::new();
        for (j, c) in contexts.iter().enumerate() {
            let (Some(cname), Some(mb)) = (c["name"].as_str(), c["mb"].as_f64()) else {
                return Err(bad(format!(
                    "release `{name}` contexts[{j}]: expected {{\"name\", \"mb\"}}"
                )));
            };
            if !(mb.is_finite() && mb > 0.0) {
                return Err(bad(format!(
                    "release `{name}` context `{cname}`: {mb} MB is not a size"
                )));
            }
            let io = match &c["io_bytes"] {
                serde_json::Value::Null => 0,
                n => n.as_u64().ok_or_else(|| {
                    bad(format!(
                        "release `{name}` context `{cname}`: io_bytes {n} is not a byte count"
                    ))
                })?,
            };
            footprints.push(Footprint {
                name: cname.to_owned(),
                weights: (mb * MIB as f64).round() as u64,
                spill_fill: 0,
                io,
            });
        }
        out.push(Release {
            name: name.to_owned(),
            source: r["source"].as_str().unwrap_or("").to_owned(),
            footprints,
        });
    }
    Ok(out)
}

/// What the daemon plans with: its `npu` section and the NSPs the platform has. Set once
/// by `vlad run` from its configuration before the first bundle loads; a load before
/// that (none in vlad) plans with the defaults on one NSP.
static SETTINGS: OnceLock<(vla_config::NpuConfig, u32)> = OnceLock::new();

/// The plan of the bundle that last passed its gate (the running one).
static RUNNING: Mutex<Option<MemoryPlan>> = Mutex::new(None);

/// Sets the daemon's `npu` section and NSP count (the first call wins).
pub fn configure(npu: vla_config::NpuConfig, nsps: u32) {
    let _ = SETTINGS.set((npu, nsps));
}

/// The memory plan of `bundle` under the daemon's settings, from its binaries' own
/// info, before any of its contexts is created; the refusal names the session, its sum
/// and the budget.
pub fn plan_bundle(bundle: &vla_policy::Bundle, lib: &QnnLibrary) -> Result<MemoryPlan, String> {
    let default = (vla_config::NpuConfig::default(), 1);
    let (npu, nsps) = SETTINGS.get().unwrap_or(&default);
    let footprints = bundle_footprints(bundle, Some(lib)).map_err(text)?;
    MemoryPlan::compute(footprints, &placement(npu), *nsps, budget(npu))
        .map_err(|e| format!("placement refused: {e}"))
}

/// Records `plan` as the running bundle's (its gate passed).
pub fn set_running(plan: MemoryPlan) {
    *RUNNING.lock().unwrap_or_else(|p| p.into_inner()) = Some(plan);
}

/// No bundle's contexts are resident (a reload freed them, or refused the new bundle
/// after its gate): STATUS, the metrics and the recordings state no plan until one is.
pub fn clear_running() {
    *RUNNING.lock().unwrap_or_else(|p| p.into_inner()) = None;
}

/// The running bundle's plan, if one passed its gate.
pub fn running() -> Option<MemoryPlan> {
    RUNNING.lock().unwrap_or_else(|p| p.into_inner()).clone()
}

/// The plan's sessions as the metrics textfile states them.
pub fn metric_sessions(plan: &MemoryPlan) -> Vec<vla_recorder::metrics::DspSession> {
    plan.sessions
        .iter()
        .map(|s| vla_recorder::metrics::DspSession {
            nsp: s.nsp,
            contexts: s
                .contexts
                .iter()
                .map(|&c| plan.footprints[c].name.as_str())
                .collect::<Vec<_>>()
                .join("+"),
            bytes: s.bytes,
        })
        .collect()
}

/// `backend` with `plan`'s placement: a device per NSP the plan uses (as the platform
/// reports it) and each binary of `bundle` in its session on its NSP's device. A backend
/// that reports no platform info keeps its own device (the plan has one NSP then).
pub fn place(
    backend: &Backend,
    bundle: &vla_policy::Bundle,
    plan: &MemoryPlan,
) -> Result<Backend, String> {
    let Some(info) = backend.platform_info().map_err(|e| e.to_string())? else {
        return Ok(backend.clone());
    };
    let mut on: BTreeMap<u32, Backend> = BTreeMap::new();
    for nsp in plan.nsps_used() {
        let device = info
            .device(nsp)
            .ok_or_else(|| format!("NSP {nsp} is not among the platform's: {}", info.describe()))?;
        match backend.on_device(device) {
            Ok(b) => {
                on.insert(nsp, b);
            }
            // NSP 0 is where the backend's own device runs what vlad loaded before the
            // plan: a platform that refuses the selection keeps that, said once.
            Err(e) if nsp == 0 => {
                log::warn!(
                    "HTP device 0 not selectable ({e}); its sessions use the default device"
                );
                on.insert(nsp, backend.clone());
            }
            Err(e) => return Err(format!("NSP {nsp}: {e}")),
        }
    }
    let mut placement = ContextPlacement::default();
    for (i, s) in plan.sessions.iter().enumerate() {
        for &c in &s.contexts {
            let name = &plan.footprints[c].name;
            let component = bundle
                .manifest
                .components
                .get(name)
                .ok_or_else(|| format!("component `{name}` is not in the manifest"))?;
            placement.place(bundle.path(&component.binary), i, &on[&s.nsp]);
        }
    }
    Ok(backend.with_placement(placement))
}

#[cfg(test)]
mod tests {
    use super::{bundle_footprints, place, placeable_nsps};
    use std::sync::Arc;
    use vla_config::{NpuConfig, NpuGroup, NpuPlacement};
    use vla_qnn::{Backend, Group, LoadOptions, MemoryPlan, Placement, QnnLibrary};

    /// Against vla-qnn's stand-in QNN library (it reports NSPs 0 and 1; the emulator
    /// reports one): each session's binaries go to the device of the session's NSP, and
    /// an NSP the platform does not report is refused by name.
    #[test]
    fn each_session_is_placed_on_its_nsps_device() {
        let root = vla_test_support::repo_root();
        let dir = std::env::temp_dir().join(format!("vlad-dsp-place-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let source = root.join("runtime/crates/vla-qnn/tests/c/fake_qnn.c");
        let lib_path = dir.join("libfakeqnn.so");
        let flags = ["-shared".as_ref(), "-fPIC".as_ref()];
        let Some(_) = vla_test_support::compile_c(&source, &lib_path, &flags) else {
            return;
        };
        let opts = LoadOptions {
            backend_lib: "libfakeqnn.so".into(),
            system_lib: "libfakeqnn.so".into(),
            ..LoadOptions::htp(&dir)
        };
        let lib = Arc::new(QnnLibrary::load(&opts).unwrap());
        let backend = Backend::new(lib.clone()).unwrap();
        let bundle =
            vla_policy::Bundle::open(root.join("golden/bundles/molmoact2-original")).unwrap();
        let names: Vec<String> = bundle_footprints(&bundle, Some(&lib))
            .unwrap()
            .into_iter()
            .map(|f| f.name)
            .collect();
        assert!(names.len() > 2, "{names:?}");
        let plan_on = |first: u32, rest: u32, nsps: u32| {
            let groups = Placement::Groups(vec![
                Group {
                    nsp: first,
                    contexts: names[..2].to_vec(),
                },
                Group {
                    nsp: rest,
                    contexts: names[2..].to_vec(),
                },
            ]);
            let footprints = bundle_footprints(&bundle, Some(&lib)).unwrap();
            MemoryPlan::compute(footprints, &groups, nsps, u64::MAX).unwrap()
        };
        let placed = place(&backend, &bundle, &plan_on(1, 0, 2)).unwrap();
        for (i, name) in names.iter().enumerate() {
            let binary = &bundle.manifest.components.get(name).unwrap().binary;
            let want = if i < 2 { (0, Some(1)) } else { (1, Some(0)) };
            assert_eq!(placed.placed(&bundle.path(binary)), Some(want), "{name}");
        }
        drop(placed);
        let e = place(&backend, &bundle, &plan_on(0, 2, 3))
            .err()
            .expect("NSP 2 placed");
        assert!(e.starts_with("NSP 2 is not among the platform's: "), "{e}");
        drop(backend);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn the_votes_cover_every_nsp_a_plan_can_use() {
        let auto = NpuConfig::default();
        assert_eq!(placeable_nsps(&auto, 2), vec![0, 1]);
        assert_eq!(placeable_nsps(&auto, 1), vec![0]);
        assert_eq!(placeable_nsps(&auto, 0), vec![0]);
        let mut groups = NpuConfig {
            placement: NpuPlacement::Groups,
            ..NpuConfig::default()
        };
        for nsp in [1, 1, 3] {
            let group = NpuGroup {
                nsp,
                contexts: Default::default(),
            };
            assert!(groups.groups.push(group).is_ok());
        }
        // NSP 3 is beyond the platform: the plan refuses it, nothing votes for it.
        assert_eq!(placeable_nsps(&groups, 2), vec![1]);
    }
}
