"""A flight recording and the metrics textfile read by the tools fleets use: the `mcap`
package (what Foxglove's and ROS 2's Python tooling build on) and the Prometheus
text-format parser. The daemon runs on the Fast-WAM fixture with `vlad simulate` as the
robot; SIGUSR1 asks for a recording (docs/observability.md)."""

import base64
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
from mcap.reader import make_reader
from prometheus_client.parser import text_string_to_metric_families

REPO = Path(__file__).resolve().parents[2]
# The closed-loop fixture: its observations carry camera frames (the open-loop one has none).
BUNDLE = REPO / "golden" / "bundles" / "fastwam-closed-loop"


def vlad_binary() -> Path:
    for profile in ("debug", "release"):
        path = REPO / "target" / profile / "vlad"
        if path.exists():
            return path
    pytest.fail("no vlad binary: build it first (cargo build -p vlad; scripts/test.sh does)")


def qnn_lib_dir() -> str:
    lib = os.environ.get("VLA_QNN_LIB_DIR", "")
    if not lib:
        if os.environ.get("VLA_REQUIRE_QNN") == "1":
            pytest.fail("VLA_REQUIRE_QNN=1 but VLA_QNN_LIB_DIR is not set")
        pytest.skip("VLA_QNN_LIB_DIR is not set (the HTP emulator is needed)")
    return lib


def metrics(path: Path) -> dict:
    """Prometheus families by name, parsed by the reference parser (raises on bad text)."""
    text = path.read_text() if path.exists() else ""
    return {f.name: f for f in text_string_to_metric_families(text)}


def value(families: dict, family: str, **labels) -> float:
    fam = families.get(family)
    for sample in fam.samples if fam else []:
        if all(sample.labels.get(k) == v for k, v in labels.items()):
            return sample.value
    return -1.0


# The bound on a wait for something the daemon reports: the wait ends as soon as the
# daemon or the robot exits, so this only turns a hang into a failure; it is no estimate
# of how fast this machine gates and infers.
HANG_GUARD_S = 900


def wait_until(what: str, procs: list, ok) -> None:
    end = time.monotonic() + HANG_GUARD_S
    while time.monotonic() < end:
        if ok():
            return
        ended = [p.args[1] for p in procs if p.poll() is not None]
        if ended:
            if ok():
                return
            pytest.fail(f"waiting for {what}: vlad {' and '.join(ended)} exited first")
        time.sleep(0.1)
    pytest.fail(f"waiting for {what}: not there after the hang guard ({HANG_GUARD_S} s)")


def test_a_recording_reads_back_with_the_mcap_package_and_the_textfile_parses(tmp_path):
    lib = qnn_lib_dir()
    vlad = vlad_binary()
    config = json.loads((REPO / "config" / "dev.json").read_text())
    tag = f"{os.getpid()}"
    config["bundle"]["path"] = str(BUNDLE)
    config["rings"]["observation_path"] = f"/dev/shm/vlad-pyrec-{tag}-obs"
    config["rings"]["action_path"] = f"/dev/shm/vlad-pyrec-{tag}-act"
    # `synchronous`: each chunk plays from its first row when it lands, whatever its latency
    # (up to max_chunk_age_ms). With the default back-to-back trigger an inference slower than
    # the chunk's span lands with every row in the past and the loop rightly publishes only
    # hold: on a loaded 2-core machine no action was ever ok.
    config["control"].update({"publish_hz": 20.0, "max_chunk_age_ms": 60000, "max_observation_age_ms": 5000,
                              "action_valid_ms": 1000, "writer_heartbeat_timeout_ms": 2000,
                              "trigger": "synchronous"})
    recordings, textfile = tmp_path / "recordings", tmp_path / "vlad.prom"
    config["recorder"] = {"directory": str(recordings), "history_s": 30, "frames": "full", "max_chunks": 32,
                          "hold_limit_ms": 0}
    config["metrics"] = {"textfile": str(textfile), "interval_ms": 200}
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(config))
    env = dict(os.environ, VLA_QNN_LIB_DIR=lib)
    # Default dispositions for the signals the daemon relies on, whatever CI inherited.
    restore = lambda: [signal.signal(s, signal.SIG_DFL) for s in (signal.SIGHUP, signal.SIGUSR1)]  # noqa: E731
    # Both run until this test stops them, however long gating takes here.
    daemon = subprocess.Popen([str(vlad), "run", "--config", str(cfg)], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, preexec_fn=restore)
    sim = subprocess.Popen([str(vlad), "simulate", "--config", str(cfg), "--duration", str(HANG_GUARD_S),
                            "--camera-hz", "20"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_until("5 inferences, 60 ticks and an ok action in the textfile", [daemon, sim], lambda: (
            value(metrics(textfile), "vlad_inferences") >= 5 and value(metrics(textfile), "vlad_ticks") >= 60
            and value(metrics(textfile), "vlad_published_actions", status="ok") > 0))
        # Ask for the recording just after a chunk lands, so the newest chunk is inside the
        # recorder's 30 s window however long an inference takes on this machine.
        done = value(metrics(textfile), "vlad_inferences")
        wait_until("one more inference", [daemon, sim], lambda: value(metrics(textfile), "vlad_inferences") > done)
        daemon.send_signal(signal.SIGUSR1)
        wait_until("a recording", [daemon, sim], lambda: any(recordings.glob("*.mcap")))
        families = metrics(textfile)
    finally:
        sim.kill()
        sim.wait()
        daemon.send_signal(signal.SIGTERM)
        assert daemon.wait(timeout=HANG_GUARD_S) == 0

    # The textfile: what a scrape sees, typed as documented.
    assert families["vlad_ticks"].type == "counter" and value(families, "vlad_ticks") >= 60
    assert families["vlad_inference_seconds"].type == "histogram"
    assert value(families, "vlad_published_actions", status="ok") > 0
    assert value(families, "vlad_parity_passed") == 1
    assert value(families, "vlad_bundle_info", name="fastwam-closed-loop-tiny") == 1

    # The recording: every camera message is a foxglove.RawImage holding the frame the
    # simulator wrote (the bundle's golden observation), byte for byte.
    (file,) = list(recordings.glob("*.mcap"))
    golden = np.load(BUNDLE / "golden" / "end_to_end.npz")
    frames = golden["frames"]
    seen = {}
    with file.open("rb") as f:
        reader = make_reader(f)
        assert reader.get_summary() is not None, "complete file: summary section present"
        for schema, channel, message in reader.iter_messages():
            seen[channel.topic] = seen.get(channel.topic, 0) + 1
            assert channel.message_encoding == "json"
            body = json.loads(message.data)
            if channel.topic.startswith("/vla/camera/"):
                assert schema.name == "foxglove.RawImage"
                cam = int(channel.topic.rsplit("/", 1)[1])
                pixels = np.frombuffer(base64.b64decode(body["data"]), np.uint8)
                img = pixels.reshape(body["height"], body["width"], 3)
                assert body["encoding"] == "rgb8" and body["step"] == body["width"] * 3
                np.testing.assert_array_equal(img, frames[cam])
    # Actions: one a tick, and the run had 60 ticks before the trigger. Chunks: how many
    # landed in the window depends on the inference time; the one just before the trigger did.
    assert seen.get("/vla/chunk", 0) >= 1 and seen.get("/vla/action", 0) >= 20, seen
    assert any(t.startswith("/vla/camera/") for t in seen), seen
