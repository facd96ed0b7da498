//! The daemon's side of field observability: builds the [`vla_recorder::Observer`] from
//! the `recorder` and `metrics` config sections, and renders the Prometheus textfile from
//! the main thread (never a loop thread). SIGUSR1 asks for a recording (see `daemon.rs`).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};
use vla_control::{Health, LoopSettings};
use vla_recorder::metrics::{self, Facts};
use vla_recorder::{Frames, Observer, ObserverSettings, RecorderSettings};

/// The observer and the textfile schedule, when either section is configured.
pub struct Observability {
    pub observer: Observer,
    facts: Facts,
    textfile: Option<(PathBuf, Duration)>,
    last_write: Option<Instant>,
}

/// The bundle facts the metrics and recordings carry.
pub struct BundleFacts {
    pub name: String,
    pub version: String,
    pub hash: String,
    pub path: PathBuf,
    pub parity_cosine: f64,
    pub ota_state: &'static str,
}

pub fn start(
    config: &vla_config::Config,
    settings: &LoopSettings,
    components: Vec<String>,
    bundle: &BundleFacts,
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
    metadata.insert(
        "publish_hz".into(),
        (1.0 / settings.period.as_secs_f64()).to_string(),
    );
    metadata.insert("merge".into(), settings.merge.as_str().into());
    let where_ = recorder
        .as_ref()
        .map(|r| format!("recorder.directory {}", r.directory.display()))
        .unwrap_or_default();
    let observer = Observer::start(ObserverSettings {
        geometry: settings.geometry,
        publish_period: settings.period,
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
            ..Facts::default()
        },
        textfile: config.metrics.as_ref().map(|m| {
            (
                PathBuf::from(m.textfile.as_str()),
                Duration::from_millis(m.interval_ms.into()),
            )
        }),
        last_write: None,
    }))
}

impl Observability {
    /// Called from the daemon's main loop: rewrites the textfile when it is due (and
    /// always when `force`, at the end).
    pub fn tick(&mut self, health: &Health, force: bool) {
        let Some((path, every)) = &self.textfile else {
            return;
        };
        if !force && self.last_write.is_some_and(|t| t.elapsed() < *every) {
            return;
        }
        self.last_write = Some(Instant::now());
        let s = self.observer.stats();
        let f = &mut self.facts;
        f.robot_alive = match s.robot_alive.load(std::sync::atomic::Ordering::Relaxed) {
            0 => Some(false),
            1 => Some(true),
            _ => None,
        };
        f.recordings = Health::get(&s.recordings);
        f.recording_errors = Health::get(&s.recording_errors);
        (f.dropped_ticks, f.dropped_chunks) = self.observer.dropped();
        let text = metrics::render(health, self.observer.latency(), f);
        if let Err(e) = metrics::write_atomically(path, &text) {
            log::warn!("metrics textfile {}: {e}", path.display());
        }
    }
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
