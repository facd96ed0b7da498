//! Prometheus metrics as a textfile for node_exporter's textfile collector: the file is
//! rendered in full and renamed over the previous one (`*.prom`, written as `.*.tmp` in
//! the same directory), so the collector never reads half a file.
//!
//! The latency histograms are accumulated by the `vla-recorder` thread from the chunk
//! records (atomics, read by whoever renders); the counters come from the loop's
//! [`vla_control::Health`], the rest from the daemon ([`Facts`]).

use std::fmt::Write as _;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use vla_control::Health;

/// Upper bucket bounds in seconds (the last, `+Inf`, is implicit).
pub const BUCKETS_S: [f64; 14] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

/// One cumulative histogram (Prometheus semantics once rendered).
#[derive(Debug, Default)]
struct Hist {
    buckets: [AtomicU64; BUCKETS_S.len()],
    count: AtomicU64,
    sum_ns: AtomicU64,
}

impl Hist {
    fn record(&self, ns: u64) {
        let s = ns as f64 / 1e9;
        if let Some(b) = BUCKETS_S.iter().position(|&le| s <= le) {
            self.buckets[b].fetch_add(1, Ordering::Relaxed);
        }
        self.count.fetch_add(1, Ordering::Relaxed);
        self.sum_ns.fetch_add(ns, Ordering::Relaxed);
    }
}

/// Inference latency, total and per component.
#[derive(Debug)]
pub struct LatencyMetrics {
    names: Vec<String>,
    total: Hist,
    components: Vec<Hist>,
}

impl LatencyMetrics {
    /// Empty histograms for the total and for each named component, in the engine's order.
    pub fn new(names: &[String]) -> Self {
        Self {
            names: names.to_vec(),
            total: Hist::default(),
            components: names.iter().map(|_| Hist::default()).collect(),
        }
    }

    /// Adds one inference: `total_ns` and per-component `components_ns` (ns, in the order
    /// given to [`LatencyMetrics::new`]; extra entries are ignored). Lock-free.
    pub fn record(&self, total_ns: u64, components_ns: &[u64]) {
        self.total.record(total_ns);
        for (h, &ns) in self.components.iter().zip(components_ns) {
            h.record(ns);
        }
    }

    /// Inferences recorded so far.
    pub fn count(&self) -> u64 {
        self.total.count.load(Ordering::Relaxed)
    }
}

/// What only the daemon knows.
#[derive(Clone, Debug, Default)]
pub struct Facts {
    /// Name of the running bundle (the `vlad_bundle_info` label).
    pub bundle_name: String,
    /// Version of the running bundle (the `vlad_bundle_info` label).
    pub bundle_version: String,
    /// Content hash of the running bundle (the `vlad_bundle_info` label).
    pub bundle_hash: String,
    /// 1: the running bundle passed its parity gate (it cannot run otherwise).
    pub parity_passed: bool,
    /// End-to-end cosine the parity gate measured (`vlad_parity_cosine`).
    pub parity_cosine: f64,
    /// `none` (no OTA store), `trial` or `committed`.
    pub ota_state: String,
    /// The running bundle's signed expiry (Unix seconds); `None`: no OTA manifest.
    pub bundle_expires: Option<u64>,
    /// How the NPU's I/O is handed over: `shared` (HTP shared buffers) or `client`
    /// (`vlad_npu_io`); empty: not said.
    pub npu_io: String,
    /// 0/1; `None`: no tick yet.
    pub robot_alive: Option<bool>,
    /// Flight recordings written (`vlad_recordings_total`).
    pub recordings: u64,
    /// Flight recordings that failed to write (`vlad_recording_errors_total`).
    pub recording_errors: u64,
    /// Tick records the recorder dropped because it fell behind.
    pub dropped_ticks: u64,
    /// Chunk records the recorder dropped because it fell behind.
    pub dropped_chunks: u64,
    /// The running bundle's DSP memory plan, one entry per cDSP session (empty: none).
    pub dsp_sessions: Vec<DspSession>,
    /// The per-session budget the plan was checked against, in bytes.
    pub dsp_budget_bytes: u64,
}

/// One cDSP session of the running bundle's memory plan.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DspSession {
    /// The NSP it is on.
    pub nsp: u32,
    /// Its contexts, `+`-joined, in pipeline order.
    pub contexts: String,
    /// What the plan puts in it.
    pub bytes: u64,
}

fn label(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

fn histogram(out: &mut String, name: &str, component: Option<&str>, h: &Hist) {
    let lab = component.map_or(String::new(), |c| format!("component=\"{}\",", label(c)));
    let mut cumulative = 0;
    for (le, b) in BUCKETS_S.iter().zip(&h.buckets) {
        cumulative += b.load(Ordering::Relaxed);
        let _ = writeln!(out, "{name}_bucket{{{lab}le=\"{le}\"}} {cumulative}");
    }
    let count = h.count.load(Ordering::Relaxed);
    let _ = writeln!(out, "{name}_bucket{{{lab}le=\"+Inf\"}} {count}");
    let lab = lab.trim_end_matches(',');
    let braces = if lab.is_empty() {
        String::new()
    } else {
        format!("{{{lab}}}")
    };
    let _ = writeln!(
        out,
        "{name}_sum{braces} {}",
        h.sum_ns.load(Ordering::Relaxed) as f64 / 1e9
    );
    let _ = writeln!(out, "{name}_count{braces} {count}");
}

/// The whole textfile.
pub fn render(health: &Health, latency: &LatencyMetrics, f: &Facts) -> String {
    let mut o = String::new();
    let g = Health::get;
    let _ = writeln!(o, "# HELP vlad_inference_seconds Inference latency (one observation to its chunk).\n# TYPE vlad_inference_seconds histogram");
    histogram(&mut o, "vlad_inference_seconds", None, &latency.total);
    let _ = writeln!(o, "# HELP vlad_component_seconds Latency of each bundle component per inference.\n# TYPE vlad_component_seconds histogram");
    for (name, h) in latency.names.iter().zip(&latency.components) {
        histogram(&mut o, "vlad_component_seconds", Some(name), h);
    }
    let _ = writeln!(o, "# HELP vlad_published_actions_total Actions published, by status.\n# TYPE vlad_published_actions_total counter");
    for (status, v) in [
        ("ok", &health.published_ok),
        ("hold", &health.published_hold),
        ("fault", &health.published_fault),
    ] {
        let _ = writeln!(
            o,
            "vlad_published_actions_total{{status=\"{status}\"}} {}",
            g(v)
        );
    }
    for (name, help, v) in [
        ("vlad_ticks_total", "Publisher ticks.", &health.ticks),
        (
            "vlad_missed_ticks_total",
            "Publisher deadlines skipped (overrun).",
            &health.missed_ticks,
        ),
        (
            "vlad_inferences_total",
            "Inferences completed.",
            &health.inferences,
        ),
        (
            "vlad_inference_failures_total",
            "Inferences failed.",
            &health.inference_failures,
        ),
        (
            "vlad_stale_observations_total",
            "Observations skipped as too old.",
            &health.stale_observations,
        ),
        (
            "vlad_reloads_total",
            "Bundle reloads (SIGHUP).",
            &health.reloads,
        ),
        (
            "vlad_instruction_texts_rendered_total",
            "Instructions given as text rendered.",
            &health.instruction_texts_rendered,
        ),
        (
            "vlad_instruction_texts_refused_total",
            "Instructions given as text refused (one log line each names why).",
            &health.instruction_texts_refused,
        ),
        (
            "vlad_instruction_waits_total",
            "Observations held for an instruction not rendered yet or refused.",
            &health.instruction_waits,
        ),
        (
            "vlad_instruction_switch_drops_total",
            "Chunks stopped or refused as computed for another instruction than the robot's.",
            &health.instruction_switch_drops,
        ),
    ] {
        let _ = writeln!(
            o,
            "# HELP {name} {help}\n# TYPE {name} counter\n{name} {}",
            g(v)
        );
    }
    let _ = writeln!(
        o,
        "# HELP vlad_latency_estimate_seconds p95 capture-to-chunk latency the loop plans with.\n# TYPE vlad_latency_estimate_seconds gauge\nvlad_latency_estimate_seconds {}",
        g(&health.latency_estimate_ns) as f64 / 1e9
    );
    let _ = writeln!(
        o,
        "# HELP vlad_robot_alive Whether the robot's heartbeat was seen at the last tick (-1: no tick yet).\n# TYPE vlad_robot_alive gauge\nvlad_robot_alive {}",
        f.robot_alive.map_or(-1, i32::from)
    );
    let _ = writeln!(
        o,
        "# HELP vlad_bundle_info The running bundle.\n# TYPE vlad_bundle_info gauge\nvlad_bundle_info{{name=\"{}\",version=\"{}\",hash=\"{}\"}} 1",
        label(&f.bundle_name),
        label(&f.bundle_version),
        label(&f.bundle_hash)
    );
    if !f.dsp_sessions.is_empty() {
        let _ = writeln!(
            o,
            "# HELP vlad_dsp_session_bytes What the memory plan puts in each cDSP session (weights, I/O, shared spill-fill).\n# TYPE vlad_dsp_session_bytes gauge"
        );
        for (i, s) in f.dsp_sessions.iter().enumerate() {
            let _ = writeln!(
                o,
                "vlad_dsp_session_bytes{{session=\"{i}\",nsp=\"{}\",contexts=\"{}\"}} {}",
                s.nsp,
                label(&s.contexts),
                s.bytes
            );
        }
        let _ = writeln!(
            o,
            "# HELP vlad_dsp_session_budget_bytes The per-session budget the memory plan was checked against.\n# TYPE vlad_dsp_session_budget_bytes gauge\nvlad_dsp_session_budget_bytes {}",
            f.dsp_budget_bytes
        );
    }
    if let Some(expires) = f.bundle_expires {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let _ = writeln!(
            o,
            "# HELP vlad_bundle_expiry_timestamp_seconds Signed expiry of the running bundle's OTA manifest.\n# TYPE vlad_bundle_expiry_timestamp_seconds gauge\nvlad_bundle_expiry_timestamp_seconds {expires}"
        );
        let _ = writeln!(
            o,
            "# HELP vlad_bundle_stale Whether the running bundle's signed expiry has passed (it keeps driving).\n# TYPE vlad_bundle_stale gauge\nvlad_bundle_stale {}",
            u8::from(now >= expires)
        );
    }
    let _ = writeln!(
        o,
        "# HELP vlad_parity_passed Whether the running bundle passed its parity gate.\n# TYPE vlad_parity_passed gauge\nvlad_parity_passed {}",
        u8::from(f.parity_passed)
    );
    let _ = writeln!(
        o,
        "# HELP vlad_parity_cosine End-to-end cosine of the parity gate.\n# TYPE vlad_parity_cosine gauge\nvlad_parity_cosine {}",
        f.parity_cosine
    );
    let _ = writeln!(
        o,
        "# HELP vlad_ota_state OTA state of the running bundle.\n# TYPE vlad_ota_state gauge"
    );
    for s in ["none", "trial", "committed"] {
        let _ = writeln!(
            o,
            "vlad_ota_state{{state=\"{s}\"}} {}",
            u8::from(f.ota_state == s)
        );
    }
    if !f.npu_io.is_empty() {
        let _ = writeln!(
            o,
            "# HELP vlad_npu_io How the NPU's inputs and outputs are handed over (npu.shared_buffers resolved).\n# TYPE vlad_npu_io gauge"
        );
        for s in ["shared", "client"] {
            let _ = writeln!(o, "vlad_npu_io{{io=\"{s}\"}} {}", u8::from(f.npu_io == s));
        }
    }
    for (name, help, v) in [
        (
            "vlad_recordings_total",
            "Flight recordings written.",
            f.recordings,
        ),
        (
            "vlad_recording_errors_total",
            "Flight recordings that failed to write.",
            f.recording_errors,
        ),
        (
            "vlad_recorder_dropped_ticks_total",
            "Tick records the recorder dropped (it fell behind).",
            f.dropped_ticks,
        ),
        (
            "vlad_recorder_dropped_chunks_total",
            "Chunk records the recorder dropped (it fell behind).",
            f.dropped_chunks,
        ),
    ] {
        let _ = writeln!(o, "# HELP {name} {help}\n# TYPE {name} counter\n{name} {v}");
    }
    o
}

/// Writes `text` to `path` atomically (temporary file in the same directory, renamed).
pub fn write_atomically(path: &Path, text: &str) -> std::io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .map_or_else(Default::default, |n| n.to_string_lossy().into_owned());
    let tmp = dir.join(format!(".{name}.tmp"));
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_cumulative_and_components_labelled() {
        let l = LatencyMetrics::new(&["vit".to_owned()]);
        l.record(3_000_000, &[2_000_000]);
        l.record(40_000_000, &[30_000_000]);
        let text = render(&Health::default(), &l, &Facts::default());
        assert!(
            text.contains("vlad_inference_seconds_bucket{le=\"0.005\"} 1\n"),
            "{text}"
        );
        assert!(text.contains("vlad_inference_seconds_bucket{le=\"0.05\"} 2\n"));
        assert!(text.contains("vlad_inference_seconds_count 2\n"));
        assert!(text.contains("vlad_component_seconds_bucket{component=\"vit\",le=\"0.0025\"} 1\n"));
        assert!(text.contains("vlad_component_seconds_count{component=\"vit\"} 2\n"));
        assert!(text.contains("vlad_robot_alive -1\n"));
    }

    #[test]
    fn the_memory_plan_is_one_gauge_per_session_and_the_budget() {
        let l = LatencyMetrics::new(&[]);
        let text = render(&Health::default(), &l, &Facts::default());
        assert!(!text.contains("vlad_dsp_session"), "{text}");
        let f = Facts {
            dsp_sessions: vec![
                DspSession {
                    nsp: 0,
                    contexts: "vision+llm_split0".into(),
                    bytes: 2_884_632_576,
                },
                DspSession {
                    nsp: 1,
                    contexts: "llm_split1".into(),
                    bytes: 1_913_651_200,
                },
            ],
            dsp_budget_bytes: 3_758_096_384,
            ..Facts::default()
        };
        let text = render(&Health::default(), &l, &f);
        assert!(text.contains(
            "vlad_dsp_session_bytes{session=\"0\",nsp=\"0\",contexts=\"vision+llm_split0\"} 2884632576\n"
        ), "{text}");
        assert!(text.contains(
            "vlad_dsp_session_bytes{session=\"1\",nsp=\"1\",contexts=\"llm_split1\"} 1913651200\n"
        ), "{text}");
        assert!(
            text.contains("vlad_dsp_session_budget_bytes 3758096384\n"),
            "{text}"
        );
    }

    #[test]
    fn a_bundle_past_its_signed_expiry_is_reported_stale() {
        let l = LatencyMetrics::new(&[]);
        let at = |expires| {
            render(
                &Health::default(),
                &l,
                &Facts {
                    bundle_expires: Some(expires),
                    ..Facts::default()
                },
            )
        };
        let past = at(1_000_000_000);
        assert!(past.contains("vlad_bundle_stale 1\n"), "{past}");
        assert!(past.contains("vlad_bundle_expiry_timestamp_seconds 1000000000\n"));
        assert!(at(u64::MAX).contains("vlad_bundle_stale 0\n"));
        // No OTA manifest: nothing said about expiry.
        let none = render(&Health::default(), &l, &Facts::default());
        assert!(!none.contains("vlad_bundle_stale"));
    }
}
