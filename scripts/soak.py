"""Soak of `vlad run` (OTA mode) with `vlad simulate` as the robot, under injected faults.

Called by scripts/soak.sh (which sets up the machine and builds vlad); see docs/soak.md.

Phases:
  main     the daemon on `<ota.root>/current` at the profile's rate; on a schedule:
           SIGHUP reloads, firmware restarts (SIGKILL of the simulator, a new writer epoch),
           OTA activations of a signed bundle that fails its parity gate (must roll back)
           and of a good one (must commit); the simulator goes silent on its own schedule
           (--gap-every/--gap-length). RSS is sampled every second.
  npu      (end of main) NPU faults through the fault-injecting QNN library the daemon
           loads in place of libQnnHtp.so (--faults-lib; docs/reliability.md): a failed
           graphExecute, three in a row, a DSP subsystem restart (QNN's validity table and
           the stricter model), a memory error at a reload, each NPU_REPEATS times.
  overrun  the same store, restarted with a publish rate at which a chunk lasts half an
           inference (measured in the main phase): the robot must only ever get `hold`
           or valid `ok` actions.

Exit status: 0 every check passed, 1 a check failed (the summary names it), 2 usage.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
from vla_host import ota_fixtures

# Control timing per fixture: Fast-WAM's from ota_fixtures; the MolmoAct2 fixtures take
# about 3.7 s per inference, the demo's 2 Hz gives a 10-step chunk of 5 s
# (config/demo-emulator.json).
FASTWAM_CONTROL = ota_fixtures.FASTWAM_CONTROL

# A hold longer than this triggers a flight recording (the silent-robot gaps last longer).
RECORD_HOLD_MS = 1000
# Recordings replayed after the soak (each reruns its observations on the emulator).
REPLAYED = 2

# RSS may grow by at most this much after warm-up (see docs/soak.md for the reasoning).
RSS_BOUND_KIB = 1024
# The one guard against a hang, on top of --duration: every wait for something the daemon
# or the robot reports (ready, reloaded, rolled back, committed, a recording, an ok action)
# lasts while they live, until the run's deadline (start + duration + this), never for a
# guess of how fast this machine gates and infers.
HANG_GUARD_S = 1800.0

# NPU faults: each kind this many times (rules for vla-qnn-faults; see docs/reliability.md).
NPU_REPEATS = 3
NPU_SPACING_S = 2.0
NPU_FAULTS = {
    "npu-exec": "graphExecute from=+1 times=1 code=1003",
    "npu-exec3": "graphExecute from=+1 times=3 code=1003",
    "npu-ssr": "ssr on=graphExecute from=+1",
    "npu-ssr-be": "ssr on=graphExecute from=+1 until=backend",
    "npu-1002": "contextCreateFromBinary from=+1 times=1 code=1002",
}

LOG_LINE = re.compile(r"^\[(\S+?)Z?\s+(\w+)\s+(\S+)\]\s?(.*)$")
STATUS = re.compile(
    r"rate ([\d.]+) Hz, inference (\d+) ms, freshness (\d+) ms, ok (\d+), hold (\d+), "
    r"fault (\d+), missed (\d+)"
)


def log(msg: str) -> None:
    print(f"soak: {msg}", flush=True)


class SoakError(Exception):
    """A set-up step failed: the soak cannot run."""


def vlad_cmd(vlad: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    try:
        return ota_fixtures.vlad_cmd(vlad, *args, check=check)
    except ota_fixtures.FixtureError as e:
        raise SoakError(str(e)) from None


def hex64(text: str) -> str:
    try:
        return ota_fixtures.hex64(text)
    except ota_fixtures.FixtureError as e:
        raise SoakError(str(e)) from None


# --------------------------------------------------------------------------- set-up


def make_config(base: dict, out: Path, root: Path, public: str, control: dict, tag: str) -> Path:
    cfg = ota_fixtures.daemon_config(base, root, public, f"vla-soak-{os.getpid()}", control,
                                     trial_inferences=5, max_trial_starts=3)
    # The flight recorder (docs/observability.md): the injected faults (a silent robot, a
    # firmware restart) leave recordings that `vlad replay` must reproduce.
    cfg["recorder"] = {"directory": str(out / f"recordings-{tag}"), "history_s": 15, "frames": "full",
                       "max_chunks": 64, "max_mb": 64, "on_fault": True, "hold_limit_ms": RECORD_HOLD_MS}
    path = out / f"vlad-{tag}.json"
    path.write_text(json.dumps(cfg, indent=2) + "\n")
    return path


def signed_bundle(vlad: Path, fixture: Path, out: Path, name: str, version: str,
                  key: Path, config: Path, tamper: bool) -> str:
    """Makes, signs and installs a bundle (`name` also its bundle.json name); returns its
    content hash."""
    try:
        d = ota_fixtures.signed_policy_bundle(vlad, fixture, out, name, version, key, tamper,
                                              bundle_name=name)
    except ota_fixtures.FixtureError as e:
        raise SoakError(str(e)) from None
    return hex64(vlad_cmd(vlad, "ota", "install", str(d), "--config", str(config)).stdout)


# --------------------------------------------------------------------------- processes


class Daemon:
    def __init__(self, vlad: Path, config: Path, out: Path, tag: str, env: dict | None = None):
        self.tag = tag
        self.out_path = out / f"daemon-{tag}.out"
        self.log_path = out / f"daemon-{tag}.log"
        self.proc = subprocess.Popen(
            [str(vlad), "run", "--config", str(config),
             "--log-level", "info,qnn=error,vlad::daemon=debug"],
            stdout=open(self.out_path, "w"), stderr=open(self.log_path, "w"),
            env=env,
        )
        self.started = time.time()
        self.exit_code: int | None = None
        self.died_early = False

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def count(self, needle: str) -> int:
        return self.log_text().count(needle)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def wait_ready(self, deadline: float) -> float:
        while time.time() < deadline:
            if "running: publishing" in self.log_text():
                return time.time() - self.started
            if not self.alive():
                raise SoakError(f"daemon {self.tag} exited {self.proc.returncode} while loading:\n"
                                + tail(self.log_text()))
            time.sleep(0.2)
        raise SoakError(f"daemon {self.tag} alive but not ready by the run's deadline "
                        f"({HANG_GUARD_S:.0f} s past --duration):\n" + tail(self.log_text()))

    def stop(self, timeout: float = 180) -> None:
        self.died_early = not self.alive()
        if not self.died_early:
            self.proc.send_signal(signal.SIGTERM)
        try:
            self.exit_code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.exit_code = self.proc.wait()

    def report(self) -> dict:
        return parse_loop_report(self.out_path.read_text(errors="replace"))

    def status_timeline(self) -> list[tuple[float, dict]]:
        rows = []
        for line in self.log_text().splitlines():
            m, s = LOG_LINE.match(line), STATUS.search(line)
            if m and s:
                keys = ("rate", "inference_ms", "freshness_ms", "ok", "hold", "fault", "missed")
                rows.append((wall(m.group(1)), dict(zip(keys, map(float, s.groups())))))
        return rows


class Simulator:
    def __init__(self, vlad: Path, config: Path, fixture: Path, out: Path, index: int,
                 duration: float, gaps: tuple[float, float] | None):
        self.index = index
        self.json_path = out / f"sim-{index}.json"
        self.out_path = out / f"sim-{index}.out"
        args = [str(vlad), "simulate", "--config", str(config), "--bundle", str(fixture),
                "--duration", f"{duration:.1f}", "--json", str(self.json_path)]
        if gaps:
            args += ["--gap-every", f"{gaps[0]:g}", "--gap-length", f"{gaps[1]:g}"]
        self.proc = subprocess.Popen(args, stdout=open(self.out_path, "w"), stderr=subprocess.STDOUT)
        self.started = time.time()
        self.killed = False

    def kill9(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()
        self.killed = True

    def snapshot(self) -> dict | None:
        try:
            return json.loads(self.json_path.read_text())
        except (OSError, ValueError):
            return None


def tail(text: str, n: int = 15) -> str:
    return "\n".join(text.splitlines()[-n:])


def wall(stamp: str) -> float:
    return datetime.fromisoformat(stamp.rstrip("Z") + "+00:00").timestamp()


def parse_loop_report(text: str) -> dict:
    pats = {
        "seconds": r"control loop report \(([\d.]+) s\)",
        "rate": r"rate\s+([\d.]+) Hz published \(target ([\d.]+) Hz\), (\d+) ticks, (\d+) missed",
        "jitter": r"publish jitter\s+p50 ([\d.]+) ms\s+p99 ([\d.]+) ms\s+max ([\d.]+) ms",
        "inference": r"inference\s+(\d+) runs, (\d+) failed, p50 ([\d.]+) ms\s+p99 ([\d.]+) ms\s+\((\d+) stale",
        "freshness": r"freshness\s+observation->publish p50 ([\d.]+) ms\s+p99 ([\d.]+) ms\s+max ([\d.]+) ms \((\d+) steps",
        "published": r"published\s+(\d+) ok, (\d+) hold, (\d+) fault",
    }
    r = {}
    for key, pat in pats.items():
        m = re.search(pat, text)
        if not m:
            return {}
        r[key] = [float(g) for g in m.groups()]
    return {
        "seconds": r["seconds"][0],
        "rate_hz": r["rate"][0], "target_hz": r["rate"][1],
        "ticks": int(r["rate"][2]), "missed": int(r["rate"][3]),
        "jitter_ms": dict(zip(("p50", "p99", "max"), r["jitter"])),
        "inferences": int(r["inference"][0]), "inference_failures": int(r["inference"][1]),
        "inference_ms": {"p50": r["inference"][2], "p99": r["inference"][3]},
        "stale_observations": int(r["inference"][4]),
        "freshness_ms": dict(zip(("p50", "p99", "max"), r["freshness"][:3])),
        "skipped_steps": int(r["freshness"][3]),
        "ok": int(r["published"][0]), "hold": int(r["published"][1]), "fault": int(r["published"][2]),
    }


class RssSampler(threading.Thread):
    """VmRSS of the running daemon, once a second."""

    def __init__(self):
        super().__init__(daemon=True)
        self.samples: list[tuple[float, str, int]] = []
        self.target: tuple[str, int] | None = None
        self.stop_flag = threading.Event()

    def run(self) -> None:
        while not self.stop_flag.wait(1.0):
            if self.target is None:
                continue
            tag, pid = self.target
            try:
                for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                    if line.startswith("VmRSS:"):
                        self.samples.append((time.time(), tag, int(line.split()[1])))
            except OSError:
                pass


class SimTimeline(threading.Thread):
    """The current simulator's JSON counters, twice a second (it rewrites them each second)."""

    def __init__(self):
        super().__init__(daemon=True)
        self.rows: list[tuple[float, int, dict]] = []
        self.sim: Simulator | None = None
        self.stop_flag = threading.Event()

    def run(self) -> None:
        while not self.stop_flag.wait(0.5):
            sim = self.sim
            snap = sim.snapshot() if sim else None
            if snap:
                self.rows.append((time.time(), sim.index, snap))


# --------------------------------------------------------------------------- events


@dataclass
class Event:
    kind: str
    start: float
    done: float = 0.0
    ok: bool = False
    detail: str = ""
    extra: dict = field(default_factory=dict)


def current_hash(root: Path) -> str:
    try:
        return Path(os.readlink(root / "current")).name
    except OSError:
        return ""


def trial_pending(root: Path) -> bool:
    try:
        return json.loads((root / "ota-state.json").read_text()).get("trial") is not None
    except (OSError, ValueError):
        return True


def wait_for(cond, deadline: float, daemon: Daemon, sim: "Simulator | None" = None,
             poll: float = 0.2) -> bool:
    """Whether `cond` came true while the daemon (and `sim`, if given) lived, before the
    run's deadline (the hang guard)."""
    while time.time() < deadline:
        if cond():
            return True
        if not daemon.alive() or (sim is not None and sim.proc.poll() is not None):
            return cond()
        time.sleep(poll)
    return cond()


def npu_environment(out: Path, faults_lib: Path) -> tuple[dict, Path]:
    """The daemon's environment with vla-qnn-faults as its libQnnHtp.so: a library
    directory of symlinks to the real one (and the vendored `*.libs` beside it, which the
    real libraries find through `$ORIGIN/..`); its rules file (empty: every call forwarded)."""
    real = Path(os.environ["VLA_QNN_LIB_DIR"])
    lib = out / "qnn-faults" / "qnn"
    lib.mkdir(parents=True)
    for f in real.iterdir():
        if f.name != "libQnnHtp.so":
            (lib / f.name).symlink_to(f)
    (lib / "libQnnHtp.so").symlink_to(faults_lib.resolve())
    for f in real.parent.iterdir():
        if f.name.endswith(".libs"):
            (lib.parent / f.name).symlink_to(f)
    rules = out / "qnn-faults" / "faults.rules"
    rules.write_text("# nothing armed\n")
    env = dict(os.environ, VLA_QNN_LIB_DIR=str(lib), VLA_QNN_FAULTS=str(rules),
               VLA_QNN_FAULTS_REAL=str(real / "libQnnHtp.so"))
    return env, rules


def npu_event(kind: str, daemon: Daemon, sim: "Simulator", rules: Path, deadline: float) -> Event:
    """Arms one NPU fault and waits until the daemon has dealt with it (its log) and the
    robot applies a new `ok` action after that."""
    ev = Event(kind, time.time())
    text = daemon.log_text()
    injected = text.count("vla-qnn-faults: graphExecute call")
    recovered = text.count("NPU: re-created and gated")
    refused = sum(1 for ln in text.splitlines() if "rejected" in ln and "QNN error 1002" in ln)
    reloads = text.count("reloaded: bundle") + text.count("reload failed")
    rules.write_text(f"# {kind} at {ev.start:.1f}\n{NPU_FAULTS[kind]}\n")
    if kind == "npu-1002":
        daemon.proc.send_signal(signal.SIGHUP)

    def handled() -> bool:
        t = daemon.log_text()
        if kind == "npu-exec":
            return t.count("vla-qnn-faults: graphExecute call") > injected
        if kind == "npu-1002":
            return (sum(1 for ln in t.splitlines() if "rejected" in ln and "QNN error 1002" in ln)
                    > refused and t.count("reloaded: bundle") + t.count("reload failed") > reloads)
        return t.count("NPU: re-created and gated") > recovered

    ok = wait_for(handled, deadline, daemon, sim)
    detail = "handled"
    if ok:
        applied = (sim.snapshot() or {}).get("ok_applied", 0)
        ok = wait_for(lambda: (sim.snapshot() or {}).get("ok_applied", 0) > applied, deadline, daemon, sim)
        detail = "handled; the robot drives again" if ok else "handled, but the robot got no ok after it"
    else:
        detail = "the daemon did not report handling it"
    if "NOT bit-identical" in daemon.log_text():
        ok, detail = False, "a re-created session computed another golden chunk"
    ev.ok, ev.detail, ev.done = ok, detail, time.time()
    return ev


# --------------------------------------------------------------------------- statistics


def rss_figures(samples: list[tuple[float, str, int]], tag: str, after: float) -> dict:
    pts = [(t, kib) for t, g, kib in samples if g == tag and t >= after]
    every = [kib for _, g, kib in samples if g == tag]
    if len(pts) < 3:
        return {"samples": len(pts), "peak_kib": max(every, default=0)}
    t = np.array([p[0] for p in pts]) - pts[0][0]
    v = np.array([p[1] for p in pts], dtype=float)
    slope = float(np.polyfit(t / 60.0, v, 1)[0]) if t[-1] > 0 else 0.0
    return {
        "samples": len(pts),
        "start_kib": int(v[0]), "baseline_kib": int(v[0]), "end_kib": int(v[-1]),
        "max_kib": int(v.max()), "min_kib": int(v.min()),
        "growth_kib": int(v.max() - v[0]),
        "trend_kib_per_min": slope,
        "minutes": float(t[-1] / 60.0),
        "peak_kib": max(every),
    }


def sims_total(snaps: list[dict]) -> dict:
    def s(key):
        return sum(x.get(key, 0) for x in snaps)

    def mx(path):
        vals = []
        for x in snaps:
            v = x
            for k in path:
                v = v.get(k, {}) if isinstance(v, dict) else {}
            if isinstance(v, (int, float)):
                vals.append(v)
        return max(vals, default=0.0)

    expired = {k: sum(x["ok_expired_on_arrival"][k] for x in snaps)
               for k in ("robot_late", "short_window", "published_late")} if snaps else {}
    return {
        "instances": len(snaps),
        "observations": s("observations_written"),
        "received": s("actions_received"), "ok": s("ok_applied"),
        "hold": s("hold"), "fault": s("fault"),
        "all_zero": s("all_zero_applied"),
        "expired": expired,
        "window_invalid": s("ok_window_invalid"),
        "ok_while_silent": s("ok_while_silent"),
        "inherited_ok": s("inherited_ok"),
        "stale_resumes": s("stale_resumes"),
        "robot_expiries": s("robot_expiries"),
        "hold_episodes": s("hold_episodes"),
        "gaps": s("gaps"),
        "made_to_applied_max_ms": mx(("made_to_applied_ms", "max")),
        "made_to_applied_p99_ms": mx(("made_to_applied_ms", "p99")),
        "in_force_age_max_ms": mx(("in_force_age_max_ms",)),
        "capture_to_applied_max_ms": mx(("capture_to_applied_ms", "max")),
        "capture_to_applied_p99_ms": mx(("capture_to_applied_ms", "p99")),
        "capture_to_applied_p50_ms": mx(("capture_to_applied_ms", "p50")),
        "visibility_p99_ms": mx(("visibility_ms", "p99")),
        "visibility_max_ms": mx(("visibility_ms", "max")),
        "longest_hold_ms": mx(("longest_hold_ms",)),
        "max_action_interval_ms": mx(("max_action_interval_ms",)),
        "longest_poll_gap_ms": mx(("longest_poll_gap_ms",)),
        "gap_hold_latency_max_ms": mx(("gap_hold_latency_max_ms",)),
        "resume_latency_max_ms": mx(("resume_latency_max_ms",)),
        "stale_resume_age_max_ms": mx(("stale_resume_age_max_ms",)),
        "first_ok_max_s": max((x.get("first_ok_s") or 0.0 for x in snaps), default=0.0),
    }


def counter_at(rows: list[tuple[float, dict]], t: float, key: str, before: bool) -> float | None:
    """The counter `key` in the status line just before (or just after) wall time `t`."""
    if before:
        cands = [r[key] for ts, r in rows if ts <= t]
        return cands[-1] if cands else None
    cands = [r[key] for ts, r in rows if ts >= t]
    return cands[0] if cands else None


def robot_pause(rows: list[tuple[float, int, dict]], start: float, end: float) -> float | None:
    """Longest stretch in [start, end] in which the robot applied no new `ok` action."""
    pts = [(t, (i, s["ok_applied"])) for t, i, s in rows if start - 1.5 <= t <= end]
    if len(pts) < 2:
        return None
    longest, since = 0.0, pts[0][0]
    last_ok: dict[int, int] = {pts[0][1][0]: pts[0][1][1]}
    for t, (index, ok) in pts[1:]:
        # A new simulator instance starts from 0: only its first `ok` is a change.
        if ok > last_ok.get(index, 0):
            longest = max(longest, t - since)
            since = t
        last_ok[index] = ok
    return max(longest, pts[-1][0] - since)


def sim_delta(rows: list[tuple[float, int, dict]], start: float, end: float, key: str) -> int | None:
    """How much a simulator counter grew in [start, end] (summed over simulator instances)."""
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    for t, i, s in rows:
        if start <= t <= end:
            first.setdefault(i, s[key])
            last[i] = s[key]
    if not last:
        return None
    return sum(last[i] - first[i] for i in last)


# --------------------------------------------------------------------------- the soak


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--vlad", type=Path, help="the vlad binary (required unless --summary)")
    ap.add_argument("--duration", type=float, default=150.0,
                    help="seconds of fault injection after the daemon is ready (main + overrun)")
    ap.add_argument("--bundle", default="fastwam", help="fixture under golden/bundles")
    ap.add_argument("--out", type=Path, default=REPO / "build" / "soak")
    ap.add_argument("--summary", type=Path, help="print the tables of a finished soak's summary.json")
    ap.add_argument("--faults-lib", type=Path,
                    help="libvla_qnn_faults.so, loaded by the daemon as libQnnHtp.so (required unless --summary)")
    a = ap.parse_args()
    if a.summary:
        s = json.loads(a.summary.read_text())
        print_summary(s)
        for f in s["failures"]:
            print(f"  FAILED: {f}")
        return 1 if s["failures"] else 0
    if not a.vlad:
        ap.error("--vlad is required")
    if not a.faults_lib or not a.faults_lib.is_file():
        ap.error("--faults-lib must name libvla_qnn_faults.so (scripts/soak.sh builds it)")
    if a.duration < 90:
        ap.error("--duration must be at least 90 seconds (one fault cycle and its warm-up)")
    fixture = REPO / "golden" / "bundles" / a.bundle
    if not (fixture / "bundle.json").is_file():
        ap.error(f"--bundle {a.bundle}: no bundle.json in {fixture}")
    if "VLA_QNN_LIB_DIR" not in os.environ:
        ap.error("VLA_QNN_LIB_DIR is not set (scripts/soak.sh sets it)")
    vlad = a.vlad.resolve()
    out = a.out.resolve()
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    try:
        return soak(vlad, fixture, out, a.duration, a.faults_lib)
    except SoakError as e:
        log(f"error: {e}")
        return 1


def soak(vlad: Path, fixture: Path, out: Path, duration: float, faults_lib: Path) -> int:
    manifest = json.loads((fixture / "bundle.json").read_text())
    fastwam = manifest["policy"] == "fastwam"
    base = json.loads((REPO / "config" / "demo-emulator.json").read_text())
    control = dict(FASTWAM_CONTROL) if fastwam else dict(base["control"])
    period = 1.0 / control["publish_hz"]
    heartbeat = control["writer_heartbeat_timeout_ms"] / 1000
    # Events every `spacing` s; a reload gates the bundle again (longer for MolmoAct2).
    spacing = 10.0 if fastwam else 30.0
    overrun_len = min(300.0, max(30.0, 0.15 * duration))
    main_len = duration - overrun_len
    gaps = (2.5 * spacing, max(2.0, 4 * heartbeat))
    restart_down = 2 * heartbeat
    # One cycle of the four events, its warm-up and as long again measured after it.
    needed = 6 * spacing
    if main_len < needed:
        raise SoakError(f"--duration {duration:g} is too short for {fixture.name}: the main phase "
                        f"({main_len:.0f} s) needs at least {needed:.0f} s, so give at least "
                        f"{math.ceil(needed / 0.85)} s")

    deadline = time.time() + duration + HANG_GUARD_S
    root = out / "ota"
    key = out / "fleet.key"
    public = hex64(vlad_cmd(vlad, "bundle", "keygen", str(key)).stdout)
    config = make_config(base, out, root, public, control, "main")
    log(f"signing and installing bundles from {fixture.name} into {root}")
    # A and B share a version: the soak switches back and forth between them, and a device
    # never activates a version below the highest it committed.
    good_a = signed_bundle(vlad, fixture, out, "bundle-a", "1.0.0", key, config, tamper=False)
    good_b = signed_bundle(vlad, fixture, out, "bundle-b", "1.0.0", key, config, tamper=False)
    bad_c = signed_bundle(vlad, fixture, out, "bundle-c", "1.2.0", key, config, tamper=True)
    vlad_cmd(vlad, "ota", "activate", good_a, "--config", str(config))
    cfg = json.loads(config.read_text())
    rings = [Path(cfg["rings"]["observation_path"]), Path(cfg["rings"]["action_path"])]
    for r in rings:
        r.unlink(missing_ok=True)

    npu_env, npu_rules = npu_environment(out, faults_lib)
    rss = RssSampler()
    timeline = SimTimeline()
    rss.start()
    timeline.start()
    events: list[Event] = []
    sims: list[Simulator] = []
    daemons: list[Daemon] = []
    failures: list[str] = []
    try:
        # ------------------------------------------------------------------ main phase
        log(f"main phase: {main_len:.0f} s at {control['publish_hz']:g} Hz, events every "
            f"{spacing:g} s, robot silent {gaps[1]:g} s every {gaps[0]:g} s")
        daemon = Daemon(vlad, config, out, "main", npu_env)
        daemons.append(daemon)
        ready_s = daemon.wait_ready(deadline)
        log(f"daemon ready in {ready_s:.1f} s (pid {daemon.proc.pid})")
        rss.target = ("main", daemon.proc.pid)
        t0 = time.time()
        main_end = t0 + main_len

        def new_sim() -> Simulator:
            # A robot for the rest of the main phase, and then some: the phase may be
            # extended (below), and the robot is stopped when it ends.
            sim = Simulator(vlad, config, fixture, out, len(sims), max(5.0, main_end - time.time())
                            + HANG_GUARD_S, gaps)
            sims.append(sim)
            timeline.sim = sim
            return sim

        sim = new_sim()

        def npu_round(daemon: Daemon, sim: Simulator, rounds: int) -> bool:
            # Once no trial is pending: a memory error at a reload of a bundle on trial
            # rolls it back, rightly, which is not the event measured here.
            if not wait_for(lambda: not trial_pending(root), deadline, daemon, sim):
                failures.append("the NPU phase found a trial that never ended")
                return False
            for _ in range(rounds):
                for kind in NPU_FAULTS:
                    if not daemon.alive():
                        return False
                    time.sleep(NPU_SPACING_S)
                    ev = npu_event(kind, daemon, sim, npu_rules, deadline)
                    events.append(ev)
                    log(f"t+{ev.start - t0:6.1f} s {kind:9s} {'ok' if ev.ok else 'FAILED'} in "
                        f"{ev.done - ev.start:5.1f} s: {ev.detail}")
            npu_rules.write_text("# nothing armed\n")
            return True

        # The first round of NPU faults is part of the warm-up: the recovery path's first
        # allocations (a new backend, its contexts) are not growth.
        log(f"npu faults: {len(NPU_FAULTS)} kinds x {NPU_REPEATS} rounds, {NPU_SPACING_S:g} s apart; "
            f"round 1 in the warm-up, the others after the main cycle")
        npu_start = time.time()
        npu_round(daemon, sim, 1)
        main_end += time.time() - npu_start
        cycle = ["sighup", "restart", "ota-bad", "ota-good"]
        warmup_end: float | None = None
        next_at = time.time() + spacing

        def cycled() -> int:
            return sum(1 for e in events if e.kind in cycle)

        # An event needs the robot for a while after it (a trial commits on inferences).
        # The phase lasts until one full cycle has run and been measured for two spacings
        # after it, however long its reloads take on this machine.
        while daemon.alive() and (next_at < main_end - spacing or cycled() < len(cycle)):
            time.sleep(max(0.0, next_at - time.time()))
            kind = cycle[cycled() % len(cycle)]
            ev = Event(kind, time.time())
            if kind == "sighup":
                done, failed = daemon.count("reloaded: bundle"), daemon.count("reload failed")
                daemon.proc.send_signal(signal.SIGHUP)
                ev.ok = wait_for(lambda: daemon.count("reloaded: bundle") + daemon.count("reload failed")
                                 > done + failed, deadline, daemon)
                ev.ok = ev.ok and daemon.count("reload failed") == failed
                ev.detail = "reloaded" if ev.ok else "reload did not complete or failed"
            elif kind == "restart":
                restarts_logged = daemon.count("robot firmware restarted")
                sim.kill9()
                time.sleep(restart_down)
                sim = new_sim()
                ev.ok = wait_for(lambda: (sim.snapshot() or {}).get("first_ok_s") is not None, deadline,
                                 daemon, sim)
                ev.detail = "new writer got ok actions" if ev.ok else "no ok action after the restart"
                if ev.ok and not wait_for(lambda: daemon.count("robot firmware restarted") > restarts_logged,
                                          deadline, daemon):
                    ev.ok, ev.detail = False, "the daemon did not log the new writer epoch"
            elif kind == "ota-bad":
                before = current_hash(root)
                n = daemon.count(f"bundle {bad_c} rejected")
                p = vlad_cmd(vlad, "ota", "activate", bad_c, "--config", str(config), check=False)
                ev.ok = wait_for(lambda: daemon.count(f"bundle {bad_c} rejected") > n
                                 and current_hash(root) == before, deadline, daemon)
                ev.detail = (f"rolled back to {before[:12]}" if ev.ok else
                             f"not rolled back (current {current_hash(root)[:12]}; activate said: "
                             f"{(p.stdout + p.stderr).strip()[:200]})")
            else:
                target = good_b if current_hash(root) == good_a else good_a
                n = daemon.count(f"reloaded: bundle {target}")
                p = vlad_cmd(vlad, "ota", "activate", target, "--config", str(config), check=False)
                ev.ok = wait_for(lambda: daemon.count(f"reloaded: bundle {target}") > n
                                 and not trial_pending(root), deadline, daemon, sim)
                ev.detail = (f"{target[:12]} reloaded and committed" if ev.ok else
                             f"{target[:12]} not committed: {(p.stdout + p.stderr).strip()[:200]}")
            ev.done = time.time()
            events.append(ev)
            log(f"t+{ev.start - t0:6.1f} s {kind:9s} {'ok' if ev.ok else 'FAILED'} in "
                f"{ev.done - ev.start:5.1f} s: {ev.detail}")
            if warmup_end is None and cycled() == len(cycle):
                # Writing a flight recording is a code path too (its JSON and the MCAP
                # writer's buffers on the recorder thread): one of a full history, asked
                # for now, so that the first one a fault triggers later is not growth.
                written = daemon.count("signal recording written")
                daemon.proc.send_signal(signal.SIGUSR1)
                if not wait_for(lambda: daemon.count("signal recording written") > written, deadline, daemon):
                    failures.append("SIGUSR1 did not produce a flight recording while the daemon ran")
                # Every code path ran once: the allocator's pools and QNN's are at size.
                warmup_end = time.time() + 5.0
                main_end = max(main_end, time.time() + 2 * spacing)
            next_at = max(next_at + spacing, time.time() + 3.0)
        # NPU faults, rounds 2.. (the first ran in the warm-up); judged by the RSS check.
        if daemon.alive() and npu_round(daemon, sim, NPU_REPEATS - 1):
            main_end = max(main_end, time.time() + 2 * spacing)
        while daemon.alive() and sim.proc.poll() is None and time.time() < main_end:
            time.sleep(0.2)
        main_alive = daemon.alive()
        # The robot's JSON is rewritten every second: stopping it loses at most a second.
        sim.kill9()
        daemon.stop()
        rss.target = None
        main_report = daemon.report()
        main_status = daemon.status_timeline()
        main_sims = [s.snapshot() or {} for s in sims]
        if warmup_end is None:
            failures.append("the main phase ended before one full fault cycle (duration too short)")
            warmup_end = time.time()

        # ------------------------------------------------------------------ overrun phase
        if not main_alive:
            raise SoakError("the main daemon died during the soak:\n" + tail(daemon.log_text()))
        p50_s = (main_report.get("inference_ms", {}).get("p50") or 500.0) / 1000.0
        chunk_len = manifest["fastwam"]["action_horizon"] if fastwam else manifest["molmoact2"]["action_horizon"]
        # A chunk lasts half an inference.
        over_hz = min(500.0, round(2 * chunk_len / p50_s, 1))
        over_period_ms = math.ceil(1000 / over_hz)
        over_control = dict(control)
        over_control.update({
            "publish_hz": over_hz,
            "action_valid_ms": 2 * over_period_ms,
            "hold_after_chunk_end_ms": 2 * over_period_ms,
            "writer_heartbeat_timeout_ms": max(control["writer_heartbeat_timeout_ms"], 2 * over_period_ms),
            "max_chunk_age_ms": max(control["max_chunk_age_ms"], int(3000 * p50_s)),
        })
        over_config = make_config(base, out, root, public, over_control, "overrun")
        log(f"overrun phase: {overrun_len:.0f} s at {over_hz:g} Hz: a {chunk_len}-step chunk lasts "
            f"{chunk_len / over_hz:.2f} s, an inference {p50_s:.2f} s (main phase p50)")
        odaemon = Daemon(vlad, over_config, out, "overrun", npu_env)
        daemons.append(odaemon)
        odaemon.wait_ready(deadline)
        rss.target = ("overrun", odaemon.proc.pid)
        o_t0 = time.time()
        osim = Simulator(vlad, over_config, fixture, out, len(sims), overrun_len, None)
        sims.append(osim)
        timeline.sim = osim
        # The robot ends on its own after overrun_len (its final JSON); the deadline is
        # the hang guard.
        osim.proc.wait(timeout=max(1.0, deadline - time.time()))
        over_alive = odaemon.alive()
        odaemon.stop()
        rss.target = None
        over_report = odaemon.report()
        over_sim = osim.snapshot() or {}
    finally:
        rss.stop_flag.set()
        timeline.stop_flag.set()
        for s in sims:
            if s.proc.poll() is None:
                s.kill9()
        for d in daemons:
            if d.proc.poll() is None:
                d.proc.kill()
                d.proc.wait()
        for r in rings:
            r.unlink(missing_ok=True)

    # ---------------------------------------------------------------------- checks
    m_rss = rss_figures(rss.samples, "main", warmup_end)
    o_rss = rss_figures(rss.samples, "overrun", o_t0 + 10.0)
    ms = sims_total(main_sims)
    os_ = sims_total([over_sim] if over_sim else [])
    bound_kib = RSS_BOUND_KIB

    def check(ok: bool, what: str):
        if not ok:
            failures.append(what)

    for tag, alive, d, rep in (("main", main_alive, daemon, main_report),
                               ("overrun", over_alive, odaemon, over_report)):
        check(alive and not d.died_early, f"the {tag} daemon died during the soak (exit {d.proc.returncode})")
        check(d.exit_code == 0 and bool(rep), f"the {tag} daemon did not stop cleanly with its report "
              f"(exit {d.exit_code})")
    both = [ms, os_]
    check(sum(x["all_zero"] for x in both) == 0, "an all-zero action was applied")
    check(sum(x["expired"].get("published_late", 0) for x in both) == 0,
          "an ok action reached the robot past its valid_until (published late)")
    check(sum(x["window_invalid"] for x in both) == 0,
          "an ok action carried a window longer than action_valid_ms or none at all")
    check(sum(x["ok_while_silent"] for x in both) == 0,
          "an ok action was made after the robot had been silent longer than the heartbeat timeout")
    for ev in events:
        if ev.kind == "ota-bad":
            check(ev.ok, f"the bad bundle was not rolled back at t+{ev.start - t0:.0f} s: {ev.detail}")
        else:
            check(ev.ok, f"{ev.kind} at t+{ev.start - t0:.0f} s: {ev.detail}")
    check(m_rss.get("samples", 0) >= 3, "too few RSS samples after warm-up")
    check(m_rss.get("growth_kib", 0) <= bound_kib,
          f"RSS grew {m_rss.get('growth_kib', 0)} KiB after warm-up (bound {bound_kib} KiB)")
    check(bool(over_sim) and os_["received"] > 0, "the robot received nothing in the overrun phase")
    recordings = replay_recordings(vlad, fixture, out / "recordings-main", check)

    # ---------------------------------------------------------------------- per-event view
    by_kind: dict[str, list[dict]] = {}
    settle = 3.0
    for ev in events:
        row = {
            "seconds": ev.done - ev.start,
            "daemon_hold": None, "robot_hold": None, "robot_pause": None,
        }
        h0 = counter_at(main_status, ev.start, "hold", before=True)
        h1 = counter_at(main_status, ev.done + settle, "hold", before=False)
        if h0 is not None and h1 is not None:
            row["daemon_hold"] = h1 - h0
        row["robot_hold"] = sim_delta(timeline.rows, ev.start, ev.done + settle, "hold")
        row["robot_pause"] = robot_pause(timeline.rows, ev.start, ev.done + settle)
        by_kind.setdefault(ev.kind, []).append(row)

    summary = {
        "duration_s": duration, "bundle": fixture.name, "main_s": main_len, "overrun_s": overrun_len,
        "gap_every_s": gaps[0], "gap_length_s": gaps[1], "restart_down_s": restart_down,
        "control": control, "overrun_control": over_control,
        "events": [ev.__dict__ for ev in events], "per_event": by_kind,
        "daemon": {"main": main_report, "overrun": over_report},
        "robot": {"main": ms, "overrun": os_, "instances": main_sims + [over_sim]},
        "rss": {"main": m_rss, "overrun": o_rss, "bound_kib": bound_kib,
                "warmup_s": warmup_end - t0,
                "series": [[round(t - t0, 1), tag, kib] for t, tag, kib in rss.samples]},
        "recordings": recordings,
        "failures": failures,
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
    print_summary(summary)
    if failures:
        print("\nSOAK FAILED:")
        for f in failures:
            print(f"  - {f}")
        return 1
    print("\nsoak passed: every check held")
    return 0


def replay_recordings(vlad: Path, fixture: Path, directory: Path, check) -> dict:
    """The main phase's recordings: the warm-up's (SIGUSR1) and those its faults left, at
    least one `hold` (the robot goes silent longer than RECORD_HOLD_MS every cycle), each a
    complete file, the first REPLAYED
    reproduced by `vlad replay` on the fixture (the soak's bundles are signed copies of it)."""
    files = sorted(directory.glob("*.mcap"))
    check(not list(directory.glob(".*")), f"a temporary recording was left in {directory}")
    triggers: dict[str, int] = {}
    for f in files:
        trigger = f.stem.rsplit("-", 1)[-1]
        triggers[trigger] = triggers.get(trigger, 0) + 1
    check(triggers.get("hold", 0) >= 1, f"no hold recording in {directory} after the robot's silences")
    replays = []
    for f in files[:REPLAYED]:
        r = vlad_cmd(vlad, "replay", str(f), "--bundle", str(fixture), check=False)
        lines = [ln for ln in r.stdout.splitlines() if ln.strip()]
        last = next((ln for ln in reversed(lines) if "compared" in ln), lines[-1] if lines else "")
        replays.append({"file": f.name, "exit": r.returncode, "summary": last})
        check(r.returncode == 0, f"vlad replay {f.name} exit {r.returncode}: {last} {r.stderr.strip()[-300:]}")
    return {"files": len(files), "triggers": triggers, "replays": replays,
            "bytes": sum(f.stat().st_size for f in files)}


def print_summary(s: dict) -> None:
    def f(v, spec=".1f"):
        return "-" if v is None else format(v, spec)

    d, o = s["daemon"]["main"], s["daemon"]["overrun"]
    rm, ro = s["robot"]["main"], s["robot"]["overrun"]
    print(f"\nsoak summary: {s['bundle']}, {s['duration_s']:.0f} s "
          f"(main {s['main_s']:.0f} s at {s['control']['publish_hz']:g} Hz, "
          f"overrun {s['overrun_s']:.0f} s at {s['overrun_control']['publish_hz']:g} Hz)")
    rec = s.get("recordings") or {}
    if rec:
        replayed = "; ".join(f"{r['file']}: {r['summary']}" for r in rec["replays"])
        print(f"  flight recordings {rec['files']} {rec['triggers']} ({rec['bytes']:,} bytes); "
              f"replayed: {replayed}")
    rows = [("", "main", "overrun")]

    def both(label, fn, spec=".1f"):
        vals = []
        for x in (d, o):
            try:
                vals.append(f(fn(x), spec))
            except (KeyError, TypeError):
                vals.append("-")
        rows.append((label, *vals))

    def robot(label, fn, spec=".1f"):
        vals = []
        for x in (rm, ro):
            try:
                vals.append(f(fn(x), spec))
            except (KeyError, TypeError):
                vals.append("-")
        rows.append((label, *vals))

    rows.append(("daemon (end report)", "", ""))
    both("  rate Hz (target)", lambda x: f"{x['rate_hz']:.2f} ({x['target_hz']:g})", "s")
    both("  ticks / missed", lambda x: f"{x['ticks']} / {x['missed']}", "s")
    both("  jitter p50/p99/max ms", lambda x: "{p50:.2f} / {p99:.2f} / {max:.2f}".format(**x["jitter_ms"]), "s")
    both("  inference runs (failed)", lambda x: f"{x['inferences']} ({x['inference_failures']})", "s")
    both("  inference p50/p99 ms", lambda x: "{p50:.0f} / {p99:.0f}".format(**x["inference_ms"]), "s")
    both("  freshness p50/p99/max ms", lambda x: "{p50:.0f} / {p99:.0f} / {max:.0f}".format(**x["freshness_ms"]), "s")
    both("  published ok/hold/fault", lambda x: f"{x['ok']} / {x['hold']} / {x['fault']}", "s")
    rows.append(("robot (simulators)", "", ""))
    robot("  instances / gaps", lambda x: f"{x['instances']} / {x['gaps']}", "s")
    robot("  received ok/hold/fault", lambda x: f"{x['ok']} / {x['hold']} / {x['fault']}", "s")
    robot("  hold episodes", lambda x: x["hold_episodes"], "d")
    robot("  longest hold s", lambda x: x["longest_hold_ms"] / 1000, ".2f")
    robot("  made->applied max ms", lambda x: x["made_to_applied_max_ms"], ".2f")
    robot("  action in force age max ms", lambda x: x["in_force_age_max_ms"], ".1f")
    robot("  capture->applied p50/p99/max ms",
          lambda x: f"{x['capture_to_applied_p50_ms']:.0f} / {x['capture_to_applied_p99_ms']:.0f} / "
                    f"{x['capture_to_applied_max_ms']:.0f}", "s")
    robot("  max interval between actions ms", lambda x: x["max_action_interval_ms"], ".1f")
    robot("  robot-side expiries", lambda x: x["robot_expiries"], "d")
    robot("  ok expired on arrival", lambda x: "{robot_late} robot late, {short_window} short window, "
          "{published_late} published late".format(**x["expired"]), "s")
    robot("  ok made while silent", lambda x: x["ok_while_silent"], "d")
    robot("  ok window invalid", lambda x: x["window_invalid"], "d")
    robot("  all-zero applied", lambda x: x["all_zero"], "d")
    robot("  silent->first hold max ms", lambda x: x["gap_hold_latency_max_ms"], ".0f")
    robot("  back->first ok max ms", lambda x: x["resume_latency_max_ms"], ".0f")
    robot("  stale resumes (age max ms)",
          lambda x: f"{x['stale_resumes']} ({x['stale_resume_age_max_ms']:.0f})", "s")
    robot("  ok from previous writer", lambda x: x["inherited_ok"], "d")
    robot("  longest robot poll gap ms", lambda x: x["longest_poll_gap_ms"], ".1f")
    r = s["rss"]

    def rss_cell(x):
        if "growth_kib" not in x:
            return "-"
        return (f"{x['baseline_kib'] / 1024:.1f} -> max {x['max_kib'] / 1024:.1f} MiB, "
                f"+{x['growth_kib']} KiB, {x['trend_kib_per_min']:+.1f} KiB/min over {x['minutes']:.1f} min")
    rows.append(("daemon RSS after warm-up", rss_cell(r["main"]), rss_cell(r["overrun"])))
    rows.append(("  bound / warm-up", f"{r['bound_kib']} KiB / {r['warmup_s']:.0f} s", "(not judged)"))
    w0 = max(len(x[0]) for x in rows)
    w1 = max(len(str(x[1])) for x in rows)
    for label, a, b in rows:
        print(f"{label:<{w0}}  {a!s:<{w1}}  {b}")

    print("\nfaults (main phase), per event: daemon-side holds published and robot-side holds "
          "received and longest pause in ok, from event to 3 s after it completed")
    print(f"{'event':<10} {'count':>5} {'failed':>6} {'took s max':>10} {'daemon holds':>13} "
          f"{'robot holds':>12} {'robot pause s max':>18}")
    for kind, evs in s["per_event"].items():
        failed = sum(1 for e in s["events"] if e["kind"] == kind and not e["ok"])

        def stat(key):
            vals = [e[key] for e in evs if e[key] is not None]
            return f"{np.mean(vals):.0f} avg" if vals else "-"
        took = max(e["seconds"] for e in evs)
        pauses = [e["robot_pause"] for e in evs if e["robot_pause"] is not None]
        print(f"{kind:<10} {len(evs):>5} {failed:>6} {took:>10.1f} {stat('daemon_hold'):>13} "
              f"{stat('robot_hold'):>12} {f(max(pauses) if pauses else None):>18}")
    g = s["robot"]["main"]
    print(f"restart: the firmware was down {s['restart_down_s']:g} s each time; the new writer's first ok "
          f"came at most {g['first_ok_max_s']:.2f} s after it started; {g['inherited_ok']} ok actions it "
          f"applied were computed from the previous writer's observations")
    print(f"gap: {g['gaps']} silences of {s['gap_length_s']:g} s (heartbeat timeout "
          f"{s['control']['writer_heartbeat_timeout_ms']} ms): first hold at most "
          f"{g['gap_hold_latency_max_ms']:.0f} ms after the last heartbeat; first ok at most "
          f"{g['resume_latency_max_ms']:.0f} ms after it came back; {g['stale_resumes']} ok actions "
          f"after a silence (gap or restart) came from an observation captured before it (oldest "
          f"{g['stale_resume_age_max_ms']:.0f} ms); {g['ok_while_silent']} ok made while silent")
    if g["stale_resumes"]:
        print("note: after a silence the daemon resumes the chunk it held, where it stopped, until "
              "a fresh chunk lands or max_chunk_age_ms passes (see docs/soak.md, findings)")


if __name__ == "__main__":
    sys.exit(main())
