"""LIBERO as the robot behind vlad, run by the LIBERO venv (scripts/setup_libero.sh):
one short episode at the closed-loop fixture's frame size (2 cameras 40x48) through the
daemon on the HTP emulator, asserting the boundary checks (not success: the fixture is an
untrained tiny model), that the checks can fail, and the bad-input refusals."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[3]

from vla_libero import checks, conventions, recording, ring  # noqa: E402

FIXTURE = REPO / "golden" / "bundles" / "fastwam-closed-loop"


def require(what: str) -> None:
    if os.environ.get("VLA_REQUIRE_ALL_TESTS") == "1":
        pytest.fail(f"cannot run here: {what} (VLA_REQUIRE_ALL_TESTS=1)")
    pytest.skip(what)


def tool(*args, timeout=900):
    env = dict(os.environ, MUJOCO_GL=os.environ.get("MUJOCO_GL", "egl"))
    return subprocess.run([sys.executable, "-m", "vla_libero", *args], env=env, capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    """The fixture as a LIBERO robot drives it (the raw 9-value state)."""
    return conventions.fixture_bundle(tmp_path_factory.mktemp("bundle") / "fastwam-closed-loop-libero")


@pytest.fixture(scope="module")
def episode(tmp_path_factory):
    vlads = [p for p in (REPO / "target" / prof / "vlad" for prof in ("release", "debug")) if p.exists()]
    if not vlads:
        require("no vlad binary (cargo build -p vlad)")
    if not os.environ.get("VLA_QNN_LIB_DIR") and not (REPO / "build" / "qnn-lib-dir").exists():
        require("no QNN library directory (VLA_QNN_LIB_DIR or build/qnn-lib-dir)")
    out = tmp_path_factory.mktemp("episode")
    # The demo: libero_spatial task 0, 20 policy steps at 4 Hz, instruction 0 of the fixture.
    r = tool("demo", "--out", str(out))
    assert r.returncode == 0, f"exit {r.returncode}\n{r.stdout[-4000:]}\n{r.stderr[-4000:]}"
    return out / "episode", out / "bundle", r.stdout


def test_one_episode_through_vlad_passes_every_boundary_check(episode):
    ep, bundle, stdout = episode
    report = json.loads((ep / "report.json").read_text())
    assert report["checks_passed"], "\n".join(report["checks"])
    assert len(report["checks"]) >= 12 and all(c.startswith("PASS") for c in report["checks"])
    # 20 policy steps in lockstep: two chunks of execute_steps 10, each from row 0, after
    # upstream's 30 no-op steps; the arm held while each inference ran.
    assert report["steps"] == 20 and report["chunks"] == 2 and report["cut_chunks"] == 0
    assert report["noop_steps"] == 30 and report["ticks"]["ok"] == 20 and report["ticks"]["hold"] >= 1
    # The run's header: the upstream stack, its settings with their sources, what differs.
    run = json.loads((ep.parent / "run.json").read_text())
    assert run["installed"]["mujoco"] == "3.3.2" and run["settings"]["seed"]["value"] == 42
    assert not run["as_upstream"] and any("render size 40x48" in d for d in run["differences"])
    assert report["env_seed"] == {"at_creation": 42, "at_reset": None}
    assert "NOT as upstream" in stdout and "configs/sim_libero.yaml:24" in stdout
    # The video: every env step's frame after the no-op steps (the first observation and 20 steps).
    import imageio.v2 as imageio
    with imageio.get_reader(ep / "video.mp4") as v:
        assert v.count_frames() == 21 and v.get_meta_data()["fps"] == 20
    assert 0 < report["hold_share"] < 1
    assert "boundary checks:" in stdout and "FAIL" not in stdout
    # vlad's own Rust preprocessing and gripper mapping, rerun on the recorded observation.
    names = " ".join(report["checks"])
    assert "PASS vlad's image input to the first context (its own Rust pipeline)" in names
    assert "PASS vlad's state input to the first context (its own Rust pipeline) = upstream _extract_sim_state" \
        in names
    assert "PASS gripper mapping = upstream's sign(-(g*2-1)) of vlad's de-normalized g" in names
    assert "PASS vlad run-once on the recorded observation = the recorded chunk" in names
    from PIL import Image
    with Image.open(ep / "contact-sheet.png") as sheet:
        assert sheet.width > 2 * 48 and sheet.height >= 3 * 40
    # The recording holds the policy's whole input: vlad replays it to the same chunks.
    vlad = max((p for p in (REPO / "target" / prof / "vlad" for prof in ("release", "debug")) if p.exists()),
               key=lambda p: p.stat().st_mtime)
    env = dict(os.environ)
    env.setdefault("VLA_QNN_LIB_DIR", (REPO / "build" / "qnn-lib-dir").read_text().strip())
    assert report["recordings"] == [str(ep / "recording-000.mcap")], "one recording for a short episode"
    r = subprocess.run([str(vlad), "replay", report["recordings"][0], "--bundle", str(bundle)], env=env,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr


def test_the_checks_fail_on_a_wrong_state_a_skipped_row_and_a_short_warmup_in_the_saved_log(episode):
    ep, bundle, _ = episode
    conv = conventions.from_bundle(bundle)
    rec = recording.read_all(sorted(ep.glob("recording-*.mcap")))
    good = dict(np.load(ep / "robot.npz"))
    assert all(c.ok for c in checks.run(good, rec, conv, 0))

    def failing(log, chain=None):
        c = conv if chain is None else conventions.Conventions(**{**conv.__dict__, "chain": chain})
        return {x.name for x in checks.run(log, rec, c, 0) if not x.ok}

    assert "policy image input = upstream's (crop-resize, side by side, x*2/255-1)" in \
        failing(good, {**conv.chain, "rotate_180": [False, False]})
    # vlad's state input (its run-once --stages dump) against upstream's, and a bent one.
    published = {int(s): int(p) for s, p, _ in good["published"]}
    point = published[next(i for i in rec.inferences if i.obs_seq in published and i.ok).obs_seq]
    policy_state = np.load(ep / "glue" / "stages-live.npz")["policy_state"]
    assert checks.fastwam_state_input(good, point, policy_state).ok
    bent = good["point_upstream_state"].copy()
    bent[:, 3:6] += 1e-3
    assert not checks.fastwam_state_input(dict(good, point_upstream_state=bent), point, policy_state).ok
    assert not checks.fastwam_state_input(good, point, policy_state[:-1]).ok
    rows = "lockstep: each chunk published and applied from row 0, in order, at most execute_steps rows"
    assert rows in failing(dict(good, applied=good["applied"][1:], applied_values=good["applied_values"][1:]))
    # vlad publishing a chunk's rows out of order fails it from its own ticks.
    swapped = [list(t) for t in rec.ticks]
    oks = [i for i, t in enumerate(swapped) if t[1] == "ok"]
    swapped[oks[0]][3], swapped[oks[1]][3] = swapped[oks[1]][3], swapped[oks[0]][3]
    assert rows in {x.name for x in checks.run(good, recording.Recording(rec.path, rec.inferences, swapped,
                                                                         rec.metadata), conv, 0) if not x.ok}


NOOP = "no-op warm-up: upstream's num_steps_wait steps of [0,0,0,0,0,0,-1], counted from the env's actions"


def test_a_flipped_frame_a_missing_gripper_inversion_and_a_short_warmup_on_the_live_path_fail_their_checks(tmp_path):
    """The robot writes camera 0 upside down and steps one no-op fewer, and vlad runs the
    bundle without the gripper inversion (`--fault flip-frame,no-gripper-inversion,
    short-warmup`): the episode runs through vlad as any other; the orientation, both
    image-input, the gripper-mapping and the no-op checks, and only they, fail."""
    r = tool("demo", "--out", str(tmp_path), "--fault", "flip-frame,no-gripper-inversion,short-warmup")
    assert r.returncode == 3, f"exit {r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    report = json.loads((tmp_path / "episode" / "report.json").read_text())
    failed = [c.split(":")[0] for c in report["checks"] if c.startswith("FAIL")]
    assert failed == ["FAIL orientation", "FAIL policy image input = upstream's (crop-resize, side by side, x*2/255-1)",
                      "FAIL no-op warm-up",
                      "FAIL vlad's image input to the first context (its own Rust pipeline) = upstream's "
                      "preprocessing of the env observation",
                      "FAIL gripper mapping = upstream's sign(-(g*2-1)) of vlad's de-normalized g"], failed
    assert "29 no-op steps received by the env, upstream 30" in " ".join(report["checks"])
    assert "fault injected on purpose: flip-frame, no-gripper-inversion, short-warmup" in r.stdout


def test_recordings_taken_between_chunks_together_hold_every_inference(episode):
    ep, bundle, _ = episode
    # A long episode outlasts one recording's history: the tool takes one between chunks
    # every --record-every-s (0 here: after every chunk's rows) and one at the end, and
    # checks their merge.
    out = ep.parent / "again"
    r = tool("episode", "--bundle", str(bundle), "--suite", "libero_spatial", "--task", "0", "--max-steps", "20",
             "--instruction-id", "0", "--publish-hz", "4", "--record-every-s", "0", "--out", str(out))
    assert r.returncode == 0, f"exit {r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    again = json.loads((out / "episode" / "report.json").read_text())
    assert len(again["recordings"]) == 3 and again["checks_passed"], again["checks"]
    assert again["steps"] == 20 and again["chunks"] == 2


def test_an_unknown_task_lists_the_suite_and_nothing_starts(bundle, tmp_path):
    r = tool("episode", "--bundle", str(bundle), "--suite", "libero_spatial", "--task", "stack the plates",
             "--out", str(tmp_path / "out"), timeout=300)
    assert r.returncode == 1
    err = [line for line in r.stderr.splitlines() if line.startswith("vla-libero:")]
    assert len(err) == 1, r.stderr
    assert "'stack the plates' is not in suite libero_spatial (10 tasks: 0: pick_up_the_black_bowl_between" in err[0]
    assert not (tmp_path / "out").exists(), "refused before vlad or the simulator started"
    r = tool("tasks", "--suite", "libero_nothing", timeout=300)
    assert r.returncode == 1 and "suite 'libero_nothing' does not exist; suites: " in r.stderr
    # A bundle the robot cannot feed the raw state to is refused by name.
    r = tool("episode", "--bundle", str(FIXTURE), "--task", "0", "--out", str(tmp_path / "out"), timeout=300)
    assert r.returncode == 1 and "`fastwam.chain.state_input` is 'state'" in r.stderr


def test_the_ring_end_refuses_a_frame_or_state_of_another_size(tmp_path):
    g = ring.Geometry(cameras=2, height=40, width=48, state_dims=9, action_dims=7, chunk_len=32)
    path = Path(f"/dev/shm/vla-libero-test-{os.getpid()}-obs")
    w = ring.ObservationWriter(path, g)
    try:
        frames = np.zeros((2, 40, 48, 3), np.uint8)
        with pytest.raises(ring.RingError, match="state has 8 values, the ring's state_dims is 9"):
            w.publish(np.zeros(8, np.float32), frames, 0)
        with pytest.raises(ring.RingError, match=r"frames are 9216 bytes, the ring takes 2 cameras of 40x48x3 = 11520"):
            w.publish(np.zeros(9, np.float32), np.zeros((2, 32, 48, 3), np.uint8), 0)
        assert w.publish(np.zeros(9, np.float32), frames, 0) == 1, "nothing was written by the refusals"
        # The observation ring is not an action ring: the reader's check names the field.
        with pytest.raises(ring.RingError, match="wrong magic"):
            ring.ActionReader(path, g).try_open()
    finally:
        w.close()
        path.unlink()
    # The same refusals through the bridge (its ring end is the shim), and its action
    # reader waits for a ring that is not there yet.
    from vla_libero import bridge
    b = bridge.Bridge(str(bridge.local_bridge()), str(path), f"{path}-act", g)
    try:
        remote = bridge.RemoteObservationWriter(b)
        with pytest.raises(ring.RingError, match="state has 8 values, the ring's state_dims is 9"):
            remote.publish(np.zeros(8, np.float32), np.zeros((2, 40, 48, 3), np.uint8), 0)
        assert remote.publish(np.zeros(9, np.float32), np.zeros((2, 40, 48, 3), np.uint8), 0) >= 1
        assert remote.last_capture_ns > 0
        assert bridge.RemoteActionReader(b).try_open() is False
    finally:
        b.close()
        path.unlink()


@pytest.fixture
def sshd(tmp_path):
    """A loopback sshd for root with a fresh key: the board's end of an SSH bridge."""
    import shutil as sh
    import socket
    import time
    binary = sh.which("sshd") or "/usr/sbin/sshd"
    if not Path(binary).exists() or not sh.which("ssh") or os.geteuid() != 0:
        require("sshd, ssh and root are needed for the SSH bridge")
    d = tmp_path / "sshd"
    d.mkdir()
    for key in ("host", "user"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(d / key)], check=True)
    (d / "authorized_keys").write_text((d / "user.pub").read_text())
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    (d / "config").write_text(
        f"Port {port}\nListenAddress 127.0.0.1\nHostKey {d / 'host'}\nAuthorizedKeysFile {d / 'authorized_keys'}\n"
        "PasswordAuthentication no\nKbdInteractiveAuthentication no\nPermitRootLogin prohibit-password\n"
        f"UsePAM no\nStrictModes no\nPidFile {d / 'sshd.pid'}\n")
    Path("/run/sshd").mkdir(exist_ok=True)
    proc = subprocess.Popen([binary, "-D", "-e", "-f", str(d / "config")], stderr=subprocess.DEVNULL)
    ssh = (f"ssh -p {port} -i {d / 'user'} -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null "
           "-o BatchMode=yes -o LogLevel=ERROR root@127.0.0.1")
    try:
        end = time.monotonic() + 30
        while subprocess.run(ssh.split() + ["true"], capture_output=True).returncode != 0:
            assert time.monotonic() < end and proc.poll() is None, "loopback sshd did not come up"
            time.sleep(0.2)
        yield ssh
    finally:
        proc.terminate()
        proc.wait()


def test_a_board_over_ssh_vlad_there_the_rings_through_the_bridge_round_trips_reported(bundle, sshd, tmp_path):
    """The bring-up path: the simulator here; vlad and the rings on the 'board' (this machine
    through a loopback sshd): vlad started, signalled and stopped over ssh, its recording
    copied back, the rings reached only through vla-ring-bridge over ssh's stdin/stdout."""
    bridge = Path(sys.prefix) / "lib" / "vla-ring-bridge"
    assert bridge.exists(), "scripts/setup_libero.sh builds it"
    vlad = max((p for p in (REPO / "target" / prof / "vlad" for prof in ("release", "debug")) if p.exists()),
               key=lambda p: p.stat().st_mtime)
    qnn = os.environ.get("VLA_QNN_LIB_DIR") or (REPO / "build" / "qnn-lib-dir").read_text().strip()
    board = tmp_path / "board"
    r = tool("episode", "--bundle", str(bundle), "--suite", "libero_spatial", "--task", "0", "--max-steps", "20",
             "--instruction-id", "0", "--publish-hz", "4", "--bridge", f"{sshd} {bridge}", "--board", sshd,
             "--board-vlad", str(vlad), "--board-dir", str(board), "--board-qnn-lib-dir", qnn,
             "--out", str(tmp_path / "out"))
    assert r.returncode == 0, f"exit {r.returncode}\n{r.stdout[-4000:]}\n{r.stderr[-4000:]}"
    report = json.loads((tmp_path / "out" / "episode" / "report.json").read_text())
    assert report["checks_passed"] and report["steps"] == 20 and report["chunks"] == 2, report["checks"]
    assert len(list((board / "recordings").glob("*.mcap"))) == 1, "recorded on the board, copied back"
    assert "operating point" in (tmp_path / "out" / "vlad.log").read_text(), "the board's vlad log, streamed back"
    rtt = report["bridge_rtt_ms"]
    assert rtt["publish"]["n"] >= 2 and rtt["read"]["n"] >= 20 and rtt["publish"]["p50"] > 0
    assert "bridge publish   round trip" in r.stdout


def test_eval_on_two_workers_writes_one_table_and_videos_and_a_resumed_rerun_skips_what_was_done(bundle, tmp_path):
    """`eval --workers 2` over two tasks: each worker its own vlad and rings, per-episode
    reports and videos, one per-suite table with Wilson intervals and the published column
    and the per-task table; `--resume` keeps every finished episode (no new recording; with
    nothing left, no vlad started) and writes the same table."""
    out = tmp_path / "eval"
    args = ["eval", "--bundle", str(bundle), "--suite", "libero_spatial", "--task", "0,1", "--episodes", "1",
            "--max-steps", "10", "--instruction-id", "0", "--publish-hz", "4", "--workers", "2", "--out", str(out)]
    r = tool(*args)
    assert r.returncode == 0, f"exit {r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    configs = [json.loads((out / f"worker-{k}" / "vlad-config.json").read_text()) for k in (0, 1)]
    assert configs[0]["rings"]["observation_path"] != configs[1]["rings"]["observation_path"]
    table = (out / "success-rates.md").read_text()
    assert "| libero_spatial | 2 | 0.0 % | 0.0-65.8 % | 98.2 % |" in table, table
    assert "| libero_spatial | 0: pick up the black bowl between the plate and the ramekin" in table
    assert "NOT as upstream" in table and "published: Fast-WAM" in table
    assert r.stderr.count("1/1 episodes") == 2 and "ETA" in r.stderr
    eps = [out / "worker-0" / "libero_spatial-0-0", out / "worker-1" / "libero_spatial-1-0"]
    assert all((e / "video.mp4").exists() and (e / "report.json").exists() for e in eps)
    done = {p: p.stat().st_mtime_ns for p in out.glob("worker-*/libero_spatial-*/recording-*.mcap")}
    assert len(done) == 2
    logs = {p: p.stat().st_mtime_ns for p in out.glob("worker-*/vlad.log")}
    assert len(logs) == 2
    r = tool(*args, "--resume")
    assert r.returncode == 0, f"exit {r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    assert r.stderr.count("done before, kept (--resume); vlad not started") == 2
    assert {p: p.stat().st_mtime_ns for p in out.glob("worker-*/vlad.log")} == logs, "nothing left: no vlad"
    assert {p: p.stat().st_mtime_ns for p in out.glob("worker-*/libero_spatial-*/recording-*.mcap")} == done
    assert "| libero_spatial | 2 | 0.0 % | 0.0-65.8 % | 98.2 % |" in (out / "success-rates.md").read_text()


def test_the_wilson_interval_and_the_published_column():
    from vla_libero import report
    lo, hi = report.wilson(45, 50)
    assert abs(lo - 78.6) < 0.1 and abs(hi - 95.7) < 0.1
    rows = [{"suite": "libero_goal", "success": i < 49, "task_index": 0, "task": "t", "steps": 100, "checks": [],
             "checks_passed": True} for i in range(50)]
    table = report.suite_table(rows, "molmoact2")
    assert "| libero_goal | 50 | 98.0 % | 89.5-99.6 % | 97.8 % |" in table, table
    assert "molmoact2.mdx:437-440" in table
    table = report.suite_table([dict(r, suite="libero_10") for r in rows], "fastwam")
    assert "| libero_10 | 50 | 98.0 % | 89.5-99.6 % | 95.2 % |" in table, table
    assert "yuantianyuan01/FastWAM" in table

