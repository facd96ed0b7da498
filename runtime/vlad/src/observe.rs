//! The daemon's side of field observability: builds the [`vla_recorder::Observer`] from
//! the `recorder` and `metrics` config sections, and renders the Prometheus textfile from
//! the main thread (never a loop thread). SIGUSR1 asks for a recording (see `daemon.rs`).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use vla_control::{Health, LoopSettings};
use vla_recorder::metrics::{self, Facts};
use vla_recorder::{Frames, Observer, ObserverSettings, RecorderSettings};

/// The observer and the textfile schedule, when either section is configured.
pub struct Observability {
    pub observer: Observer,
    facts: Facts,
    /// A bundle that passed its gate since the last textfile (a reload).
    running: RunningBundle,
    /// The OTA trial's state (trial until committed), when the bundle comes from a store.
    trial: Option<vla_ota::TrialView>,
    textfile: Option<(PathBuf, Duration)>,
    last_write: Option<Instant>,
    /// The NPU's state and fault counters (`vlad_npu_*`).
    npu: crate::daemon::NpuStatus,
}

/// The newest bundle that passed its gate, handed from the engine (which reloads on the
/// inference thread, off its critical path) to the main thread's textfile. A slot, not a
/// queue: only the latest bundle matters.
#[derive(Clone, Default)]
pub struct RunningBundle(Arc<Mutex<Option<BundleFacts>>>);

impl RunningBundle {
    /// Called by the engine after a reload's bundle passed its gate.
    pub fn post(&self, facts: BundleFacts) {
        *self.0.lock().unwrap_or_else(|p| p.into_inner()) = Some(facts);
    }

    fn take(&self) -> Option<BundleFacts> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).take()
    }
}

/// The bundle facts the metrics and recordings carry.
pub struct BundleFacts {
    pub name: String,
    pub version: String,
    pub hash: String,
    pub path: PathBuf,
    pub parity_cosine: f64,
    pub ota_state: &'static str,
    /// Its DSP memory plan.
    pub memory_plan: Option<vla_qnn::MemoryPlan>,
    /// The signed expiry of its OTA manifest (Unix seconds); `None`: no OTA manifest.
    pub expires: Option<u64>,
    /// `shared` or `client`: the NPU I/O this bundle got.
    pub npu_io: &'static str,
    /// Its NPU I/O in one line (the recordings' `npu_io_detail`, following reloads).
    pub npu_io_detail: String,
}

pub fn start(
    config: &vla_config::Config,
    settings: &LoopSettings,
    components: Vec<String>,
    bundle: &BundleFacts,
    running: RunningBundle,
    trial: Option<vla_ota::TrialView>,
    npu: crate::daemon::NpuStatus,
) -> Result<Option<Observability>, String> {
    if config.recorder.is_none() && config.metrics.is_none() {
        return Ok(None);
    }
    let recorder = config.recorder.as_ref().map(|r| RecorderSettings {
        directory: PathBuf::from(r.directory.as_str()),
        history: Duration::from_secs_f64(r.history_s),
        max_chunks: r.max_chunks as usize,
        frames: match r.frames {
            vla_config::RecorderFrames::Off => Frames::Off,
            vla_config::RecorderFrames::Downscaled => Frames::Downscaled(r.downscale),
            vla_config::RecorderFrames::Full => Frames::Full,
        },
        max_bytes: u64::from(r.max_mb) * 1_000_000,
        on_fault: r.on_fault,
        hold_limit: (r.hold_limit_ms > 0).then(|| Duration::from_millis(r.hold_limit_ms.into())),
    });
    let mut metadata = BTreeMap::new();
    metadata.insert("bundle_name".into(), bundle.name.clone());
    metadata.insert("bundle_version".into(), bundle.version.clone());
    metadata.insert("bundle_hash".into(), bundle.hash.clone());
    metadata.insert("bundle_path".into(), bundle.path.display().to_string());
    metadata.insert("vlad_version".into(), env!("CARGO_PKG_VERSION").into());
    if let Some(plan) = &bundle.memory_plan {
        metadata.insert("dsp_memory_plan".into(), plan.summary());
    }
    metadata.insert(
        "publish_hz".into(),
        (1.0 / settings.limits.period().as_secs_f64()).to_string(),
    );
    metadata.insert("merge".into(), settings.limits.merge.as_str().into());
    metadata.insert("npu_io".into(), bundle.npu_io.into());
    metadata.insert("npu_io_detail".into(), bundle.npu_io_detail.clone());
    let where_ = recorder
        .as_ref()
        .map(|r| format!("recorder.directory {}", r.directory.display()))
        .unwrap_or_default();
    let observer = Observer::start(ObserverSettings {
        geometry: settings.geometry,
        publish_period: settings.limits.period(),
        components,
        recorder,
        metadata,
    })
    .map_err(|e| format!("flight recorder: {where_}: {e}"))?;
    Ok(Some(Observability {
        observer,
        facts: Facts {
            bundle_name: bundle.name.clone(),
            bundle_version: bundle.version.clone(),
            bundle_hash: bundle.hash.clone(),
            parity_passed: true,
            parity_cosine: bundle.parity_cosine,
            ota_state: bundle.ota_state.into(),
            dsp_sessions: bundle
                .memory_plan
                .as_ref()
                .map(crate::dsp_plan::metric_sessions)
                .unwrap_or_default(),
            dsp_budget_bytes: bundle.memory_plan.as_ref().map_or(0, |p| p.budget),
            bundle_expires: bundle.expires,
            npu_io: bundle.npu_io.into(),
            ..Facts::default()
        },
        running,
        trial,
        textfile: config.metrics.as_ref().map(|m| {
            (
                PathBuf::from(m.textfile.as_str()),
                Duration::from_millis(m.interval_ms.into()),
            )
        }),
        last_write: None,
        npu,
    }))
}

impl Observability {
    /// Called from the daemon's main loop: rewrites the textfile when it is due (and
    /// always when `force`, at the end).
    pub fn tick(&mut self, health: &Health, force: bool) {
        self.follow_reload();
        let Some((path, every)) = &self.textfile else {
            return;
        };
        if !force && self.last_write.is_some_and(|t| t.elapsed() < *every) {
            return;
        }
        self.last_write = Some(Instant::now());
        let s = self.observer.stats();
        let f = &mut self.facts;
        if let Some(t) = &self.trial {
            // The trial ends (committed), or the store rolled back: the recorder knows.
            f.ota_state = if t.on_trial() { "trial" } else { "committed" }.into();
        }
        f.robot_alive = match s.robot_alive.load(std::sync::atomic::Ordering::Relaxed) {
            0 => Some(false),
            1 => Some(true),
            _ => None,
        };
        f.recordings = Health::get(&s.recordings);
        f.recording_errors = Health::get(&s.recording_errors);
        (f.dropped_ticks, f.dropped_chunks) = self.observer.dropped();
        let text = metrics::render(health, self.observer.latency(), f) + &self.npu.render();
        if let Err(e) = metrics::write_atomically(path, &text) {
            log::warn!("metrics textfile {}: {e}", path.display());
        }
    }

    /// A reload's bundle, once posted: the textfile's facts and the recordings'
    /// metadata name it from now on.
    fn follow_reload(&mut self) {
        let Some(b) = self.running.take() else {
            return;
        };
        self.observer.set_metadata([
            (
                "dsp_memory_plan".to_owned(),
                b.memory_plan
                    .as_ref()
                    .map(|p| p.summary())
                    .unwrap_or_default(),
            ),
            ("bundle_name".to_owned(), b.name.clone()),
            ("bundle_version".to_owned(), b.version.clone()),
            ("bundle_hash".to_owned(), b.hash.clone()),
            ("bundle_path".to_owned(), b.path.display().to_string()),
            ("npu_io".to_owned(), b.npu_io.to_owned()),
            ("npu_io_detail".to_owned(), b.npu_io_detail.clone()),
        ]);
        let f = &mut self.facts;
        f.bundle_name = b.name;
        f.bundle_version = b.version;
        f.bundle_hash = b.hash;
        f.parity_cosine = b.parity_cosine;
        f.ota_state = b.ota_state.into();
        f.dsp_sessions = b
            .memory_plan
            .as_ref()
            .map(crate::dsp_plan::metric_sessions)
            .unwrap_or_default();
        f.dsp_budget_bytes = b.memory_plan.as_ref().map_or(0, |p| p.budget);
        f.bundle_expires = b.expires;
        f.npu_io = b.npu_io.into();
    }
}

/// The signed expiry of the running bundle (Unix seconds, 0: none), for `STATUS=`: set
/// whenever the engine names its bundle, read by the supervisor once a second.
static RUNNING_EXPIRY: AtomicU64 = AtomicU64::new(0);

/// The signed expiry (Unix seconds) in `dir`'s OTA manifest, if it has one; also
/// remembered as the running bundle's for [`staleness`].
pub fn manifest_expiry(dir: &std::path::Path) -> Option<u64> {
    let path = dir.join(vla_ota::MANIFEST_FILE);
    let expires = std::fs::metadata(&path)
        .ok()
        .filter(|m| m.len() <= vla_ota::MAX_MANIFEST_BYTES)
        .and_then(|_| std::fs::read(&path).ok())
        .and_then(|bytes| vla_ota::OtaManifest::parse(&path, &bytes).ok())
        .map(|m| m.expires);
    RUNNING_EXPIRY.store(expires.unwrap_or(0), Ordering::Relaxed);
    expires
}

/// `STATUS=`'s note on a running bundle whose signed expiry has passed: it keeps driving
/// (a committed, verified bundle does not stop for a calendar date; Uptane's advice for
/// vehicles) and says so until the fleet delivers a freshly signed release.
pub fn staleness() -> Option<String> {
    let expires = RUNNING_EXPIRY.load(Ordering::Relaxed);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    (expires != 0 && now >= expires).then(|| {
        format!(
            "bundle STALE: its signed expiry passed {} h ago, still driving; the fleet has sent no fresh release",
            (now - expires) / 3600
        )
    })
}

/// A short content hash of the bundle's manifest (when no OTA hash names it).
pub fn manifest_hash(dir: &std::path::Path) -> String {
    use sha2::Digest;
    match std::fs::read(dir.join("bundle.json")) {
        Ok(bytes) => sha2::Sha256::digest(&bytes)
            .iter()
            .take(8)
            .map(|b| format!("{b:02x}"))
            .collect(),
        Err(_) => String::new(),
    }
}
