//! The policy as the control loop's engine: inference with the performance vote and the
//! OTA trial's count, and SIGHUP's reload, which falls back to the bundle that ran before
//! (or, under OTA, lets the store roll back) when the new one fails to load or gate.

use super::ring_geometry;
use crate::gate::{load_gated, InferError, LoadError, Loaded, Recovery, ReloadError};
use crate::Failure;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use vla_control::{Engine, EngineError};
use vla_ota::Store;
use vla_policy::{Bundle, Policy};
use vla_qnn::Backend;

/// The OTA store's view of the running bundle (when `bundle.path` is `<ota.root>/current`).
pub(super) struct OtaLink {
    pub(super) store: Arc<Store>,
    /// The running bundle's hash and its trial: healthy inferences are counted in memory
    /// and recorded in the store by the recorder's own (non-real-time) thread, so the
    /// inference thread never waits for the store's lock (an installer holds it while it
    /// copies and hashes gigabytes) and does no file I/O.
    pub(super) trial: vla_ota::TrialRecorder,
}

impl OtaLink {
    pub(super) fn start(store: &Arc<Store>, hash: String, on_trial: bool) -> Result<Self, Failure> {
        let trial = vla_ota::TrialRecorder::start(store.clone(), hash, on_trial)
            .map_err(|e| Failure::Error(format!("starting the OTA trial recorder: {e}")))?;
        Ok(Self {
            store: store.clone(),
            trial,
        })
    }
}

/// The policy as the control loop's engine.
pub(super) struct PolicyEngine {
    /// None only while the NPU session is being re-created (or failed to be).
    pub(super) backend: Option<Backend>,
    pub(super) ota: Option<OtaLink>,
    /// The configured path (often the OTA `current` symlink), re-resolved on reload.
    pub(super) configured: PathBuf,
    /// The directory that passed its gate last.
    pub(super) good: PathBuf,
    pub(super) policy: Option<Policy>,
    /// The running policy's bundle, held so the OTA store sees it in use (its manifest
    /// stays open; the context binaries are unmapped once loaded).
    pub(super) bundle: Option<Bundle>,
    pub(super) geometry: vla_ring::Geometry,
    /// HTP performance votes (None: `qnn.performance` off, or refused at start).
    pub(super) votes: Option<vla_qnn::PerfGovernor>,
    /// `control.extra_latency_ms` (tests and benchmarks only).
    pub(super) extra_latency: Duration,
    /// How a prefix conditions the flow loop (`control.merge` prefix or inpaint).
    pub(super) prefix_method: vla_policy::PrefixMethod,
    /// Reloads start the policy's helper threads as the first load did.
    pub(super) load_options: crate::gate::LoadSettings,
    /// Where a reload's gated bundle is posted for the metrics textfile.
    pub(super) running: crate::observe::RunningBundle,
    /// The end-to-end cosine of the running bundle's gate.
    pub(super) gate_cosine: f64,
    /// NPU faults: the re-creation policy and its counters.
    pub(super) npu: super::npu::Npu,
    /// Instructions given as text (`rings.instruction_path` configured).
    pub(super) text: Option<super::text::TextLink>,
}

impl PolicyEngine {
    /// What the metrics say about the running bundle, `cosine` its gate's.
    pub(super) fn facts(&self, cosine: f64) -> crate::observe::BundleFacts {
        let (name, version) = self
            .bundle
            .as_ref()
            .map(|b| (b.manifest.name.clone(), b.manifest.version.clone()))
            .unwrap_or_default();
        let (hash, ota_state) = match &self.ota {
            None => (crate::observe::manifest_hash(&self.good), "none"),
            Some(o) if o.trial.on_trial() => (o.trial.running_hash(), "trial"),
            Some(o) => (o.trial.running_hash(), "committed"),
        };
        let (npu_io, npu_io_detail) = self.load_options.npu.status().get();
        crate::observe::BundleFacts {
            name,
            version,
            hash,
            path: self.good.clone(),
            parity_cosine: cosine,
            ota_state,
            memory_plan: crate::dsp_plan::running(),
            expires: crate::observe::manifest_expiry(&self.good),
            npu_io,
            npu_io_detail,
        }
    }

    pub(super) fn try_load(&mut self, dir: &Path) -> Result<(), LoadError> {
        // Every caller has freed the running contexts: until a bundle is taken, no plan
        // is the running one (a bundle refused after its gate recorded its own).
        crate::dsp_plan::clear_running();
        let backend = self.backend.as_ref().ok_or_else(|| {
            LoadError::Backend(vla_qnn::QnnError::NotAvailable {
                what: "QNN backend",
                reason: "its re-creation failed".into(),
            })
        })?;
        let Loaded {
            bundle,
            policy,
            gated,
        } = load_gated(backend, dir, &self.load_options)?;
        let needs = ring_geometry(&policy.geometry());
        if needs != self.geometry {
            crate::dsp_plan::clear_running();
            return Err(LoadError::Geometry {
                dir: dir.to_owned(),
                needs,
                rings: self.geometry,
            });
        }
        self.policy = Some(policy);
        if let Some(text) = &mut self.text {
            text.reset(self.policy.as_ref());
        }
        self.bundle = Some(bundle);
        self.good = dir.to_owned();
        self.gate_cosine = gated.cosine;
        self.npu.reference = gated.actions;
        Ok(())
    }
}

impl Engine for PolicyEngine {
    fn infer(
        &mut self,
        obs: &vla_ring::Observation,
        actions: &mut [f32],
    ) -> Result<(), EngineError> {
        Ok(self.run(obs, None, actions)?)
    }

    fn conditions_on_prefix(&self) -> bool {
        true
    }

    fn instruction_ready(&mut self, obs: &vla_ring::Observation) -> bool {
        let resolved = match &mut self.text {
            Some(text) => {
                text.take(self.policy.as_mut());
                text.resolve(obs.instruction_id)
            }
            // No instruction segment: a text id names nothing.
            None => Some(obs.instruction_id).filter(|&id| vla_ring::text_id_of(id).is_none()),
        };
        // A pack instruction (by id) holds until a pack of the running bundle has it, as
        // an unrendered text does: never an inference error counted towards a fault.
        match resolved {
            Some(id) if id & vla_policy::PACK_INSTRUCTION_FLAG != 0 => self
                .policy
                .as_ref()
                .is_some_and(|p| p.has_pack_instruction(id)),
            Some(_) => true,
            None => false,
        }
    }

    fn discrete_dims(&self) -> Vec<bool> {
        self.policy
            .as_ref()
            .map(Policy::discrete_dims)
            .unwrap_or_default()
    }

    fn infer_with_prefix(
        &mut self,
        obs: &vla_ring::Observation,
        prefix: &vla_control::Prefix<'_>,
        actions: &mut [f32],
    ) -> Result<(), EngineError> {
        let p = vla_policy::ActionPrefix {
            actions: prefix.actions,
            frozen: prefix.frozen,
            overlap: prefix.overlap,
            method: self.prefix_method,
        };
        Ok(self.run(obs, Some(&p), actions)?)
    }

    fn after_failure(&mut self) {
        self.recover_if_due();
    }

    fn reload(&mut self) -> Result<String, EngineError> {
        self.unhold_for_reload()?;
        let result = self.reload_policy();
        if self.policy.is_none() {
            // Neither bundle loaded: the next failed inference re-creates the session and
            // loads the one that ran, within the re-creation limit.
            self.npu.rebuild_due();
        }
        // Whatever runs now (the new bundle, or the one it fell back to), once the OTA
        // trial recorder knows its hash: the metrics and recordings name it.
        if self.policy.is_some() {
            self.running.post(self.facts(self.gate_cosine));
        }
        Ok(result?)
    }

    fn component_names(&self) -> Vec<String> {
        self.policy.as_ref().map_or_else(Vec::new, |p| {
            p.timings().components.iter().map(|c| c.0.clone()).collect()
        })
    }

    fn component_latencies(&self, out: &mut [u64]) -> usize {
        let Some(p) = &self.policy else { return 0 };
        let mut n = 0;
        for (slot, c) in out.iter_mut().zip(&p.timings().components) {
            *slot = c.1.as_nanos() as u64;
            n += 1;
        }
        n
    }
}

impl PolicyEngine {
    fn run(
        &mut self,
        obs: &vla_ring::Observation,
        prefix: Option<&vla_policy::ActionPrefix<'_>>,
        actions: &mut [f32],
    ) -> Result<(), InferError> {
        if let Some(rebuilds) = self.npu.held() {
            return Err(InferError::NpuHeld { rebuilds });
        }
        let policy = self.policy.as_mut().ok_or(InferError::NoPolicy)?;
        let g = self.geometry;
        // A text id not rendered is refused here, never handed on: the policy would read
        // its low bits as one of its own text slots.
        let instruction_id = match &self.text {
            Some(t) => t.resolve(obs.instruction_id),
            None => Some(obs.instruction_id),
        }
        .ok_or_else(|| {
            InferError::Policy(vla_policy::PolicyError::Observation {
                field: "instruction_id",
                expected: "a fixed instruction or a rendered text's id".into(),
                found: format!("{:#x} (not rendered)", obs.instruction_id),
            })
        })?;
        let o = vla_policy::Observation {
            cameras: g.cameras as usize,
            height: g.height as usize,
            width: g.width as usize,
            frames: &obs.frames,
            state: &obs.state,
            instruction_id,
            seed: obs.seed,
        };
        let vote = self.votes.as_ref().map(|v| v.inference());
        let result = match prefix {
            Some(p) => policy.infer_with_prefix(&o, p, actions),
            None => policy.infer(&o, actions),
        };
        drop(vote);
        if let Err(e) = result {
            self.npu.failed(&e);
            return Err(InferError::Policy(e));
        }
        self.npu.healthy();
        if !self.extra_latency.is_zero() {
            // Reproduces a slower NPU's operating point on the emulator (tests, benchmarks).
            std::thread::sleep(self.extra_latency);
        }
        if let Some(ota) = &self.ota {
            ota.trial.healthy();
        }
        Ok(())
    }

    fn reload_policy(&mut self) -> Result<String, ReloadError> {
        if let Some(store) = self.ota.as_ref().map(|o| o.store.clone()) {
            return self.reload_from_store(&store);
        }
        let target = std::fs::canonicalize(&self.configured).map_err(|source| {
            ReloadError::Target(LoadError::Resolve {
                path: self.configured.clone(),
                source,
            })
        })?;
        let previous = self.good.clone();
        // The NPU cannot hold two sets of contexts: free the old ones first.
        self.policy = None;
        match self.try_load_through_restart(&target) {
            Ok(()) => Ok(format!("bundle {}", target.display())),
            Err(rejected) => {
                log::error!(
                    "new bundle rejected: {rejected}; reloading {}",
                    previous.display()
                );
                match self.try_load(&previous) {
                    Ok(()) => Err(ReloadError::Rejected {
                        rejected: Box::new(rejected),
                        recovery: Box::new(Recovery::RunningAgain(previous)),
                    }),
                    Err(again) => Err(ReloadError::PreviousFailed {
                        rejected: Box::new(rejected),
                        previous: Box::new(again),
                    }),
                }
            }
        }
    }
}

impl PolicyEngine {
    /// SIGHUP under OTA: load what `current` names now; a bundle that fails to load or
    /// to pass its gate is rolled back by the store (which reloads the previous one here).
    fn reload_from_store(&mut self, store: &Arc<Store>) -> Result<String, ReloadError> {
        let (hash, dir) = store
            .current()
            .map_err(ReloadError::Store)?
            .ok_or(ReloadError::NoCurrent)?;
        self.policy = None;
        // Verified as it loads (`load_gated`), with the daemon's own keys, whatever the CLI
        // that installed and activated it trusted (`--trusted-key`): a reload never widens
        // what drives.
        let loaded = self.try_load_through_restart(&dir);
        match loaded {
            Ok(()) => {
                if let Some(o) = &self.ota {
                    o.trial.running(hash.clone(), true);
                }
                self.record_gated(store);
                Ok(format!("bundle {hash}"))
            }
            Err(rejected) => {
                log::error!("bundle {hash} rejected: {rejected}");
                let rolled =
                    store.fail_trial(&rejected.to_string(), &mut |d: &Path| self.try_load(d));
                let running = store.current().ok().flatten();
                if let (Some(o), Some((h, _))) = (&self.ota, &running) {
                    o.trial.running(h.clone(), false);
                }
                if let Err(again) = self.load_previous_if_none() {
                    return Err(ReloadError::PreviousFailed {
                        rejected: Box::new(rejected),
                        previous: Box::new(again),
                    });
                }
                self.record_gated(store);
                let recovery = match rolled {
                    Ok(Some(r)) => Recovery::RolledBack(r),
                    Ok(None) => Recovery::RunningAgain(self.good.clone()),
                    Err(e) => Recovery::RollbackFailed(e),
                };
                Err(ReloadError::Rejected {
                    rejected: Box::new(rejected),
                    recovery: Box::new(recovery),
                })
            }
        }
    }
}

impl PolicyEngine {
    /// Not on trial (no rollback target) or the rollback failed: load what ran before
    /// (under OTA verified again with the store's keys as it loads), whatever the store
    /// says.
    fn load_previous_if_none(&mut self) -> Result<(), LoadError> {
        if self.policy.is_none() {
            let good = self.good.clone();
            self.try_load(&good)?;
        }
        Ok(())
    }

    /// Names the bundle now running, and its gate's inference time, in the pid file.
    pub(super) fn record_gated(&self, store: &Store) {
        if let (Some(o), Some(p)) = (&self.ota, &self.policy) {
            record_gated(
                store,
                &o.trial.running_hash(),
                p.timings().total + self.extra_latency,
            );
        }
    }
}

/// What `vlad ota verdict --wait` keys its wait on: the bundle this daemon gated and how
/// long an inference takes here now (see `vla_ota::Daemon`).
pub(super) fn record_gated(store: &Store, hash: &str, inference: Duration) {
    if let Err(e) = store.record_daemon(Some((hash, inference))) {
        log::warn!("cannot record the gated bundle in the pid file: {e}");
    }
}
