//! Field observability for `vlad run`: a flight recorder that keeps the last seconds of
//! the control loop in memory and writes them as an MCAP file on a trigger, the reader
//! `vlad replay` uses, and the Prometheus textfile a fleet scrapes.
//!
//! The loop feeds an [`Observer`] through [`vla_control::Tap`]: the inference thread
//! and the publisher thread each copy their record into their own preallocated
//! single-producer queue ([`spsc`]), never waiting and never allocating; a full queue
//! drops the record and counts it. One low-priority thread (`vla-recorder`) drains the
//! queues into a preallocated history, accumulates the latency histograms for the
//! metrics, watches for triggers (a `fault`, a `hold` longer than a limit, a request from
//! the daemon on SIGUSR1) and writes the recording ([`mcap_out`]), atomically, into a
//! directory kept under a size cap.
//!
//! This crate knows the rings and the loop, not QNN or policies: the daemon wires it.

#![forbid(unsafe_code)]

mod mcap_out;
pub mod metrics;
pub mod read;
mod record;
mod spsc;

pub use mcap_out::{SCHEMA_ACTION, SCHEMA_CHUNK, SCHEMA_OBSERVATION};
pub use metrics::LatencyMetrics;
pub use read::{read_recording, RecordedChunk, Recording, RecordingError};
pub use record::Frames;

use record::{copy_frames, decision_code, ChunkRecord, History, TickRecord};
use spsc::Spsc;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;
use vla_control::{InferenceEvent, Tap, TickEvent};
use vla_ring::Geometry;

/// The recorder's part of the configuration (`recorder.*`).
#[derive(Clone, Debug)]
pub struct RecorderSettings {
    /// Where recordings land; created by [`Observer::start`].
    pub directory: PathBuf,
    /// Seconds of history a recording covers (at most: see `max_chunks`).
    pub history: Duration,
    /// Inferences kept (each with its frames): bounds the memory.
    pub max_chunks: usize,
    /// What is kept of the camera frames.
    pub frames: Frames,
    /// The directory's recordings are kept under this many bytes (oldest removed).
    pub max_bytes: u64,
    /// Record when the loop starts publishing `fault`.
    pub on_fault: bool,
    /// Record when a `hold` (after the first `ok`) lasts longer than this.
    pub hold_limit: Option<Duration>,
}

/// What the observer records and for what loop.
#[derive(Clone, Debug)]
pub struct ObserverSettings {
    /// The robot link's shape: sizes every preallocated queue and history slot.
    pub geometry: Geometry,
    /// Time between two publisher ticks; sizes the tick queue (at least 2 s of ticks).
    pub publish_period: Duration,
    /// Per-component latency names (the engine's), for the chunk records and the metrics.
    pub components: Vec<String>,
    /// `None`: metrics only, nothing is recorded.
    pub recorder: Option<RecorderSettings>,
    /// Written into every recording's `vla.recording` metadata (bundle name, hash...).
    pub metadata: BTreeMap<String, String>,
}

/// Why a recording was written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Trigger {
    /// Asked for by the daemon (SIGUSR1), see [`Observer::request_recording`].
    Signal,
    /// The loop started publishing `fault` (with [`RecorderSettings::on_fault`]).
    Fault,
    /// A `hold` after the first `ok` lasted longer than [`RecorderSettings::hold_limit`].
    Hold,
}

impl Trigger {
    /// Lower-case name, as it appears in the recording's file name and metadata.
    pub fn name(self) -> &'static str {
        match self {
            Trigger::Signal => "signal",
            Trigger::Fault => "fault",
            Trigger::Hold => "hold",
        }
    }
}

/// Figures of the observer, readable from any thread.
#[derive(Debug, Default)]
pub struct ObserverStats {
    /// Recordings written since start.
    pub recordings: AtomicU64,
    /// Recordings that failed to write (the error is logged by the recorder thread).
    pub recording_errors: AtomicU64,
    /// Size in bytes of the last recording written.
    pub last_recording_bytes: AtomicU64,
    /// Whether the last tick saw the robot's heartbeat (1) or not (0); 2: no tick yet.
    pub robot_alive: AtomicU8,
}

/// Ticks a queue holds: enough for the recorder thread to write a recording without the
/// publisher dropping any (at least 2 s of ticks).
fn tick_queue_len(period: Duration) -> usize {
    ((2.0 / period.as_secs_f64().max(1e-6)).ceil() as usize).max(64)
}
const CHUNK_QUEUE_LEN: usize = 8;

struct Shared {
    settings: ObserverSettings,
    frames: Frames,
    chunks: Spsc<ChunkRecord>,
    ticks: Spsc<TickRecord>,
    requested: AtomicBool,
    stop: AtomicBool,
    stats: ObserverStats,
    latency: LatencyMetrics,
    /// The last recording's path (for logs and tests).
    last_path: Mutex<Option<PathBuf>>,
    /// Entries that replace the settings' metadata from now on (a reloaded bundle's
    /// name and hash). Taken by the recorder thread only while it writes a recording.
    metadata_updates: Mutex<BTreeMap<String, String>>,
}

impl Shared {
    /// The recordings' metadata now: the settings' entries with the later updates.
    fn metadata(&self) -> BTreeMap<String, String> {
        let mut all = self.settings.metadata.clone();
        let updates = self
            .metadata_updates
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        all.extend(updates.iter().map(|(k, v)| (k.clone(), v.clone())));
        all
    }
}

/// The loop's observer: give [`Observer::tap`] to [`vla_control::ControlLoop::start_with_tap`].
pub struct Observer {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

/// The [`Tap`] half (cheap to clone into the loop).
pub struct ObserverTap(Arc<Shared>);

impl Observer {
    /// Allocates every queue and history slot and starts the `vla-recorder` thread.
    pub fn start(settings: ObserverSettings) -> std::io::Result<Self> {
        let g = settings.geometry;
        let frames = settings.recorder.as_ref().map_or(Frames::Off, |r| r.frames);
        let n = settings.components.len();
        let shared = Arc::new(Shared {
            chunks: Spsc::new(CHUNK_QUEUE_LEN, || ChunkRecord::for_geometry(&g, frames, n)),
            ticks: Spsc::new(tick_queue_len(settings.publish_period), || {
                TickRecord::for_geometry(&g)
            }),
            latency: LatencyMetrics::new(&settings.components),
            frames,
            requested: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            stats: ObserverStats {
                robot_alive: AtomicU8::new(2),
                ..ObserverStats::default()
            },
            last_path: Mutex::new(None),
            metadata_updates: Mutex::new(BTreeMap::new()),
            settings,
        });
        if let Some(r) = &shared.settings.recorder {
            std::fs::create_dir_all(&r.directory)?;
        }
        let s = shared.clone();
        let thread = std::thread::Builder::new()
            .name("vla-recorder".into())
            .spawn(move || recorder_thread(s))?;
        Ok(Self {
            shared,
            thread: Some(thread),
        })
    }

    /// The tap to hand to the loop; every clone feeds this observer's queues.
    pub fn tap(&self) -> Arc<dyn Tap> {
        Arc::new(ObserverTap(self.shared.clone()))
    }

    /// Replaces metadata entries in the recordings written from now on (e.g. the
    /// bundle's name and hash after a reload). Not for a real-time thread: takes a lock
    /// the recorder thread holds while it copies the entries.
    pub fn set_metadata(&self, entries: impl IntoIterator<Item = (String, String)>) {
        self.shared
            .metadata_updates
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend(entries);
    }

    /// Asks for a recording now (SIGUSR1). Ignored without a recorder.
    pub fn request_recording(&self) {
        self.shared.requested.store(true, Ordering::Release);
    }

    /// The observer's counters.
    pub fn stats(&self) -> &ObserverStats {
        &self.shared.stats
    }

    /// The latency histograms, for the metrics textfile.
    pub fn latency(&self) -> &LatencyMetrics {
        &self.shared.latency
    }

    /// Records dropped because a queue was full: (ticks, chunks).
    pub fn dropped(&self) -> (u64, u64) {
        (self.shared.ticks.dropped(), self.shared.chunks.dropped())
    }

    /// Path of the last recording written, if any.
    pub fn last_recording(&self) -> Option<PathBuf> {
        self.shared
            .last_path
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Stops the recorder thread (after the loop has stopped).
    pub fn stop(mut self) {
        self.shared.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Tap for ObserverTap {
    fn inference(&self, e: &InferenceEvent<'_>) {
        let s = &*self.0;
        let g = &s.settings.geometry;
        let frames = s.frames;
        s.chunks.push(|r| {
            let o = e.observation;
            r.chunk_id = e.chunk_id;
            r.ok = e.ok;
            r.prefixed = e.prefixed;
            r.obs_seq = e.observation_seq;
            r.writer_epoch = o.writer_epoch;
            r.capture_ns = o.capture_time_ns;
            r.seed = o.seed;
            r.instruction_id = o.instruction_id;
            r.started_ns = e.started_ns;
            r.done_ns = e.done_ns;
            let n = e.components_ns.len().min(r.components_ns.len());
            r.components = n;
            r.components_ns[..n].copy_from_slice(&e.components_ns[..n]);
            if r.state.len() == o.state.len() {
                r.state.copy_from_slice(&o.state);
            }
            if o.frames.len() == g.frame_bytes().unwrap_or(0) {
                copy_frames(g, frames, &o.frames, &mut r.frames);
            }
            if r.actions.len() == e.actions.len() {
                r.actions.copy_from_slice(e.actions);
            }
        });
    }

    fn tick(&self, e: &TickEvent<'_>) {
        let s = &*self.0;
        s.stats
            .robot_alive
            .store(u8::from(e.robot_alive), Ordering::Relaxed);
        s.ticks.push(|r| {
            let (decision, step) = decision_code(e.decision);
            r.now_ns = e.now_ns;
            r.decision = decision;
            r.step = step;
            r.status = e.action.status as u8;
            r.chunk_id = e.action.chunk_id;
            r.source_obs_seq = e.action.source_obs_seq;
            r.made_time_ns = e.action.made_time_ns;
            r.valid_until_ns = e.action.valid_until_ns;
            r.robot_alive = e.robot_alive;
            r.missed = e.missed;
            if r.values.len() == e.action.values.len() {
                r.values.copy_from_slice(&e.action.values);
            }
        });
    }
}

/// Trigger detection over the tick stream (edge-triggered, so a lasting fault records once).
#[derive(Default)]
struct Watch {
    seen_ok: bool,
    in_fault: bool,
    hold_since: Option<u64>,
    hold_fired: bool,
}

impl Watch {
    fn see(&mut self, t: &TickRecord, r: &RecorderSettings) -> Option<Trigger> {
        use record::{DECISION_FAULT, DECISION_HOLD};
        let mut fired = None;
        if t.decision == DECISION_FAULT {
            if !self.in_fault && r.on_fault {
                fired = Some(Trigger::Fault);
            }
            self.in_fault = true;
        } else {
            self.in_fault = false;
        }
        if t.decision == DECISION_HOLD {
            let since = *self.hold_since.get_or_insert(t.now_ns);
            if let Some(limit) = r.hold_limit {
                let long = t.now_ns.saturating_sub(since) > limit.as_nanos() as u64;
                if self.seen_ok && long && !self.hold_fired {
                    self.hold_fired = true;
                    fired = fired.or(Some(Trigger::Hold));
                }
            }
        } else {
            self.hold_since = None;
            self.hold_fired = false;
            if t.decision != DECISION_FAULT {
                self.seen_ok = true;
            }
        }
        fired
    }
}

fn recorder_thread(shared: Arc<Shared>) {
    // Signals belong to the daemon's main thread (the fault signals excepted).
    vla_control::block_signals();
    // Low priority by construction: this thread stays SCHED_OTHER (it never asks for more)
    // while the publisher is SCHED_FIFO on a device, so it cannot delay a tick.
    let geometry = shared.settings.geometry;
    let recorder = shared.settings.recorder.clone();
    let component_count = shared.settings.components.len();
    let history_ns = recorder
        .as_ref()
        .map_or(0, |recorder| recorder.history.as_nanos() as u64);
    let tick_cap = recorder.as_ref().map_or(1, |recorder| {
        ((recorder.history.as_secs_f64() / shared.settings.publish_period.as_secs_f64()).ceil()
            as usize)
            .max(1)
    });
    let chunk_cap = recorder
        .as_ref()
        .map_or(1, |recorder| recorder.max_chunks.max(1));
    let mut ticks = History::new(tick_cap, || TickRecord::for_geometry(&geometry));
    let mut chunks = History::new(chunk_cap, || {
        ChunkRecord::for_geometry(&geometry, shared.frames, component_count)
    });
    let mut watch = Watch::default();
    let mut pending: Option<Trigger> = None;
    let mut counter = 0u32;
    loop {
        let stopping = shared.stop.load(Ordering::Acquire);
        while shared.chunks.pop(|chunk| {
            if chunk.ok {
                shared.latency.record(
                    chunk.done_ns.saturating_sub(chunk.started_ns),
                    &chunk.components_ns[..chunk.components],
                );
            }
            if recorder.is_some() {
                chunks.push_slot().copy_from(chunk);
            }
        }) {}
        while shared.ticks.pop(|tick| {
            if let Some(recorder) = &recorder {
                if let Some(why) = watch.see(tick, recorder) {
                    pending = pending.or(Some(why));
                }
                ticks.push_slot().copy_from(tick);
            }
        }) {}
        if shared.requested.swap(false, Ordering::AcqRel) {
            pending = Some(Trigger::Signal);
        }
        if let (Some(recorder), Some(why)) = (&recorder, pending.take()) {
            counter += 1;
            let newest = ticks.iter().last().map_or(0, |tick| tick.now_ns);
            let from = newest.saturating_sub(history_ns);
            let dropped = (shared.ticks.dropped(), shared.chunks.dropped());
            let extra = shared.metadata();
            let meta = mcap_out::Meta {
                trigger: why,
                geometry,
                frames: shared.frames,
                components: &shared.settings.components,
                extra: &extra,
                history: recorder.history,
                dropped,
            };
            match mcap_out::write_recording(recorder, counter, &meta, from, &ticks, &chunks) {
                Ok((path, bytes)) => {
                    log::warn!(
                        "flight recorder: {} recording written to {} ({bytes} bytes; dropped so far: {} ticks, {} chunks)",
                        why.name(),
                        path.display(),
                        dropped.0,
                        dropped.1
                    );
                    shared.stats.recordings.fetch_add(1, Ordering::Relaxed);
                    shared
                        .stats
                        .last_recording_bytes
                        .store(bytes, Ordering::Relaxed);
                    *shared
                        .last_path
                        .lock()
                        .unwrap_or_else(|poisoned| poisoned.into_inner()) = Some(path);
                    if let Err(error) =
                        mcap_out::enforce_cap(&recorder.directory, recorder.max_bytes)
                    {
                        log::warn!(
                            "flight recorder: size cap of {}: {error}",
                            recorder.directory.display()
                        );
                    }
                }
                Err(error) => {
                    shared
                        .stats
                        .recording_errors
                        .fetch_add(1, Ordering::Relaxed);
                    log::error!(
                        "flight recorder: cannot write a recording into {}: {error}",
                        recorder.directory.display()
                    );
                }
            }
        }
        if stopping {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use record::{DECISION_FAULT, DECISION_HOLD, DECISION_STEP};

    fn settings(hold_ms: u64) -> RecorderSettings {
        RecorderSettings {
            directory: PathBuf::from("/nonexistent"),
            history: Duration::from_secs(1),
            max_chunks: 4,
            frames: Frames::Off,
            max_bytes: 1 << 20,
            on_fault: true,
            hold_limit: Some(Duration::from_millis(hold_ms)),
        }
    }

    fn tick(ms: u64, decision: u8) -> TickRecord {
        TickRecord {
            now_ns: ms * 1_000_000,
            decision,
            ..TickRecord::default()
        }
    }

    #[test]
    fn a_fault_triggers_once_per_episode_and_a_long_hold_after_ok_triggers() {
        let r = settings(100);
        let mut w = Watch::default();
        // Holds before the first ok (start-up) never trigger.
        assert_eq!(w.see(&tick(0, DECISION_HOLD), &r), None);
        assert_eq!(w.see(&tick(500, DECISION_HOLD), &r), None);
        assert_eq!(w.see(&tick(600, DECISION_STEP), &r), None);
        assert_eq!(w.see(&tick(700, DECISION_FAULT), &r), Some(Trigger::Fault));
        assert_eq!(w.see(&tick(750, DECISION_FAULT), &r), None);
        assert_eq!(w.see(&tick(800, DECISION_STEP), &r), None);
        assert_eq!(w.see(&tick(900, DECISION_HOLD), &r), None);
        assert_eq!(w.see(&tick(990, DECISION_HOLD), &r), None);
        assert_eq!(w.see(&tick(1001, DECISION_HOLD), &r), Some(Trigger::Hold));
        assert_eq!(w.see(&tick(1500, DECISION_HOLD), &r), None);
    }

    #[test]
    fn downscaling_takes_every_nth_pixel_of_every_camera() {
        let g = Geometry {
            cameras: 2,
            height: 4,
            width: 4,
            channels: 3,
            state_dims: 1,
            action_dims: 1,
            chunk_len: 1,
        };
        let src: Vec<u8> = (0..g.frame_bytes().unwrap()).map(|i| i as u8).collect();
        let f = Frames::Downscaled(2);
        let mut dst = vec![0u8; f.bytes(&g)];
        copy_frames(&g, f, &src, &mut dst);
        assert_eq!(dst.len(), 2 * 2 * 2 * 3);
        // camera 0 pixel (0,0), (0,2), (2,0), (2,2); camera 1 starts at 48.
        assert_eq!(&dst[..3], &[0, 1, 2]);
        assert_eq!(&dst[3..6], &[6, 7, 8]);
        assert_eq!(&dst[6..9], &[24, 25, 26]);
        assert_eq!(&dst[12..15], &[48, 49, 50]);
    }
}
