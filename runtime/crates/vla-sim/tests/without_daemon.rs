//! The simulator with no daemon on the other side: it refuses a source of the wrong size
//! before touching a ring, and otherwise writes its observations, leaves its JSON report
//! and ends with the error naming the action ring that never appeared.

use std::path::PathBuf;
use std::time::Duration;
use vla_ring::{Geometry, Observation, RingReader};
use vla_sim::{Gaps, Settings, SimError};

fn scratch(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("vla-sim-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn settings(dir: &std::path::Path) -> Settings {
    let geometry = Geometry {
        cameras: 1,
        height: 4,
        width: 4,
        channels: 3,
        state_dims: 3,
        action_dims: 2,
        chunk_len: 4,
    };
    Settings {
        geometry,
        source: Observation::for_geometry(&geometry).unwrap(),
        observation_ring: dir.join("obs.ring"),
        action_ring: dir.join("act.ring"),
        action_valid: Duration::from_millis(100),
        writer_heartbeat_timeout: Duration::from_millis(500),
        camera_hz: 50.0,
        duration: 0.2,
        gaps: Gaps::default(),
        json: Some(dir.join("report.json")),
        timeline: None,
    }
}

#[test]
fn a_source_of_the_wrong_size_is_refused_before_any_ring_is_made() {
    let dir = scratch("size");
    let mut s = settings(&dir);
    s.source.state.push(0.0);
    let e = vla_sim::run(&s).unwrap_err();
    assert!(matches!(e, SimError::SourceSize { state: 4, .. }), "{e:?}");
    assert_eq!(
        e.to_string(),
        "observation file has 48 frame bytes and 4 state values; the bundle needs 48 and 3"
    );
    assert!(!s.observation_ring.exists());
}

#[test]
fn without_a_daemon_it_writes_observations_and_names_the_missing_action_ring() {
    let dir = scratch("alone");
    let s = settings(&dir);
    let e = vla_sim::run(&s).unwrap_err();
    assert_eq!(
        e.to_string(),
        format!(
            "no action ring appeared at {} (is `vlad run` up?)",
            s.action_ring.display()
        )
    );
    assert!(std::error::Error::source(&e).is_none());
    let ring = RingReader::<Observation>::open(&s.observation_ring, s.geometry).unwrap();
    assert!(ring.published() >= 1);
    let report: serde_json::Value =
        serde_json::from_slice(&std::fs::read(s.json.as_ref().unwrap()).unwrap()).unwrap();
    assert_eq!(report["finished"], true);
    assert_eq!(report["observations_written"], ring.published());
    assert_eq!(report["actions_received"], 0);
}
