//! The recorder on the real control loop: a recording on request (what SIGUSR1 does in
//! the daemon) and one on a fault, both complete, while the publisher thread allocates
//! nothing (vla-alloc-count's counting global allocator watches the `vla-publisher`
//! thread by kernel tid, as `vla-bench loop` does).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use vla_control::{ControlLoop, Engine, EngineError, LoopSettings};
use vla_recorder::{Frames, Observer, ObserverSettings, RecorderSettings};
use vla_ring::{monotonic_ns, Geometry, Observation, RingWriter};

const G: Geometry = Geometry {
    cameras: 2,
    height: 16,
    width: 16,
    channels: 3,
    state_dims: 3,
    action_dims: 2,
    chunk_len: 8,
};

/// Fills the chunk from the observation's seed; fails while `failing` is set.
struct Fake {
    failing: Arc<AtomicBool>,
}

impl Engine for Fake {
    fn infer(&mut self, obs: &Observation, actions: &mut [f32]) -> Result<(), EngineError> {
        std::thread::sleep(Duration::from_millis(3));
        if self.failing.load(Ordering::Relaxed) {
            return Err("injected failure".into());
        }
        for (i, a) in actions.iter_mut().enumerate() {
            *a = (obs.seed % 97) as f32 * 0.01 + i as f32 * 0.001;
        }
        Ok(())
    }
    fn reload(&mut self) -> Result<String, EngineError> {
        Ok("fake".into())
    }
    fn component_names(&self) -> Vec<String> {
        vec!["fake".into()]
    }
    fn component_latencies(&self, out: &mut [u64]) -> usize {
        out[0] = 3_000_000;
        1
    }
}

fn publisher_tid() -> i32 {
    for e in std::fs::read_dir("/proc/self/task").unwrap() {
        let p = e.unwrap().path();
        if std::fs::read_to_string(p.join("comm"))
            .unwrap_or_default()
            .trim()
            == "vla-publisher"
        {
            return p.file_name().unwrap().to_str().unwrap().parse().unwrap();
        }
    }
    panic!("no vla-publisher thread");
}

/// Waits until `f` holds (class E in docs/testing.md): the loop and the recorder run in
/// this process and the wait ends as soon as the event happened; the suite's hang guard
/// only turns one that never comes into a failure (a fixed 20 s was a guess of this
/// machine's speed under load).
fn wait_for(mut f: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + vla_test_support::HANG_GUARD;
    while Instant::now() < end {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    false
}

#[test]
fn recordings_on_request_and_on_fault_leave_the_publish_path_allocation_free() {
    let tag = std::process::id();
    let dir = std::env::temp_dir().join(format!("vla-recorder-test-{tag}"));
    let _ = std::fs::remove_dir_all(&dir);
    let mut settings = LoopSettings {
        fault_after_failures: 2,
        ..LoopSettings::new(
            G,
            format!("/dev/shm/vla-rec-test-{tag}-obs").into(),
            format!("/dev/shm/vla-rec-test-{tag}-act").into(),
        )
    };
    const MS: u64 = 1_000_000;
    let l = &mut settings.limits;
    l.period_ns = 10 * MS;
    l.max_observation_age_ns = 500 * MS;
    l.max_chunk_age_ns = 2000 * MS;
    l.hold_after_chunk_end_ns = 20 * MS;
    l.action_valid_ns = 30 * MS;
    l.chunk_period_ns = 10 * MS;
    let observer = Observer::start(ObserverSettings {
        geometry: G,
        publish_period: Duration::from_nanos(settings.limits.period_ns),
        components: vec!["fake".into()],
        recorder: Some(RecorderSettings {
            directory: dir.clone(),
            history: Duration::from_secs(2),
            max_chunks: 64,
            frames: Frames::Full,
            max_bytes: 50_000_000,
            on_fault: true,
            hold_limit: None,
        }),
        metadata: [("bundle_name".to_owned(), "first".to_owned())].into(),
    })
    .unwrap();
    let mut writer = RingWriter::<Observation>::create(&settings.observation_path, G, 8).unwrap();
    let failing = Arc::new(AtomicBool::new(false));
    let lp = ControlLoop::start_with_tap(
        settings.clone(),
        Box::new(Fake {
            failing: failing.clone(),
        }),
        Some(observer.tap()),
    )
    .unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let camera = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut obs = Observation::for_geometry(&G).unwrap();
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                n += 1;
                obs.seed = n;
                for (i, b) in obs.frames.iter_mut().enumerate() {
                    *b = (i as u64 + n) as u8;
                }
                obs.capture_time_ns = monotonic_ns();
                writer.publish(&obs).unwrap();
                std::thread::sleep(Duration::from_millis(20));
            }
        })
    };
    let recordings = || observer.stats().recordings.load(Ordering::Relaxed);
    // Warm-up: chunks land and the publisher has run its first ticks.
    assert!(wait_for(|| {
        vla_control::Health::get(&lp.health().published_ok) > 20
    }));
    vla_alloc_count::watch(publisher_tid());
    let before = vla_alloc_count::watched_allocations();
    let ticks_before = vla_control::Health::get(&lp.health().ticks);
    // Plain ticks first, then the two recordings, all watched.
    std::thread::sleep(Duration::from_millis(300));

    observer.request_recording();
    assert!(wait_for(|| recordings() == 1));
    // A reload: the next recording names the new bundle.
    observer.set_metadata([("bundle_name".to_owned(), "reloaded".to_owned())]);
    failing.store(true, Ordering::Relaxed);
    assert!(wait_for(|| recordings() == 2));
    failing.store(false, Ordering::Relaxed);
    std::thread::sleep(Duration::from_millis(200));

    let allocations = vla_alloc_count::watched_allocations() - before;
    let ticks = vla_control::Health::get(&lp.health().ticks) - ticks_before;
    vla_alloc_count::watch(0);
    stop.store(true, Ordering::Relaxed);
    camera.join().unwrap();
    let report = lp.stop();
    let (dropped_ticks, dropped_chunks) = observer.dropped();
    observer.stop();
    assert!(ticks > 20, "{ticks} ticks watched");
    assert_eq!(allocations, 0, "the publisher allocated over {ticks} ticks");
    assert!(report.published_fault > 0);

    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(names.len(), 2, "{names:?}");
    assert!(
        names.iter().any(|n| n.ends_with("-signal.mcap")),
        "{names:?}"
    );
    let fault = names
        .iter()
        .find(|n| n.ends_with("-fault.mcap"))
        .expect("a fault recording");
    let rec = vla_recorder::read_recording(&dir.join(fault)).unwrap();
    assert_eq!(rec.metadata["trigger"], "fault");
    assert_eq!(rec.metadata["bundle_name"], "reloaded");
    let signal = names.iter().find(|n| n.ends_with("-signal.mcap")).unwrap();
    let first = vla_recorder::read_recording(&dir.join(signal)).unwrap();
    assert_eq!(first.metadata["bundle_name"], "first");
    assert!(
        rec.decisions.get("fault").copied().unwrap_or(0) >= 1,
        "{:?}",
        rec.decisions
    );
    assert!(
        rec.chunks.iter().any(|c| !c.ok),
        "the failed inferences are recorded"
    );
    let good: Vec<_> = rec.chunks.iter().filter(|c| c.ok).collect();
    assert!(!good.is_empty());
    for c in good {
        let n = c.seed;
        let expect: Vec<u8> = (0..G.frame_bytes().unwrap())
            .map(|i| (i as u64 + n) as u8)
            .collect();
        assert_eq!(c.frames, expect, "frames of observation seed {n}");
        assert_eq!(c.actions[0], (n % 97) as f32 * 0.01);
    }
    eprintln!(
        "watched {ticks} ticks: {allocations} publisher allocations; dropped {dropped_ticks} ticks, {dropped_chunks} chunks; {fault}: {} bytes",
        std::fs::metadata(dir.join(fault)).unwrap().len()
    );
    let _ = std::fs::remove_dir_all(&dir);
}
