"""Power cuts at the block level under the OTA store (see scripts/rauc/powercut.sh).

The store lives on an ext4 file system on a raw disk image attached to the VM as
virtio-blk with cache=none; the VM (scripts/rauc/vm.py) runs scripts/rauc/powercut-inside.sh
at every boot: it checks what the last cut left, then runs install, activate, trial,
commit and gc in a loop while this script kills qemu (SIGKILL) at a random moment: the
guest's page cache and every write it had not completed are lost, as in a power cut. The
next boot checks again, then loops again, so each boot serves one check and one cut.

Where the cut lands: before each boot a phase is drawn (the five phases in a shuffled
order per round, from a seeded RNG whose seed is printed) and a fraction u in [0, 1); the
kill comes u times the phase's expected duration (its median so far in this run) after
the guest announces that phase on its serial console. The phase at the cut is the last
one the guest announced before the kill.

Each boot's check passes when, after the daemon's start-up recovery: the file system is
clean after its journal replay; the daemon gated `current` and a simulated robot applied
`ok` actions; state and links agree; `current` and every stored bundle verify completely
(`vlad bundle verify`); no staging, trash or temporary files are left; and what the loop
had acknowledged before the cut (the last phase that ended) is still there, read from the
store as the cut left it. Only what the next boot finds is judged; whatever the guest
wrote after its check is never trusted.

Prints a table a cut and a summary, writes summary.json; exits 1 on any failure.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
import vm  # noqa: E402
from vla_host.ota_fixtures import FixtureError, daemon_config, hex64, signed_policy_bundle, vlad_cmd

FIXTURE = REPO / "golden/bundles/fastwam"
PHASES = ["install", "activate", "trial", "commit", "gc"]
# Expected phase durations in the TCG VM before this run has measured any (seconds).
PRIOR_S = {"install": 4.0, "activate": 2.0, "trial": 35.0, "commit": 18.0, "gc": 2.0}
# virtio-blk, the store's ext4 (crc32c is only a soft dependency of ext4 and jbd2).
DISK_MODULES = ["virtio_blk", "crc32c_generic", "ext4"]
DISK_MNT = Path("/run/vla-powercut/disk")
OTA_ROOT = DISK_MNT / "ota"
# The daemon's control timing in the VM: nothing in it may depend on how fast the machine
# is. Fast-WAM infers in 15-40 s in the TCG VM on a quiet machine and took 160-190 s on a
# loaded one, and a boot may run --boot-timeout (BOOT_TIMEOUT_S) before its hang guard ends it.
# Every chunk is therefore as old as its inference when it lands; the run once failed
# because the publisher holds on every tick once `now - capture > max_chunk_age_ms`
# (vla-control scheduler `next`), and vla-config caps that at 60 s on a device, and
# because a back-to-back chunk landing after its 32 steps (128 s at 0.25 Hz) plus the grace
# has every row past (skip mode), so it only holds. So:
# - trigger synchronous: a landed chunk plays its rows from the first whatever its
#   latency (EXECUTE_STEPS of them, at the 1 Hz publish rate, each an `ok` the robot counts);
# - max_chunk_age_ms an hour, past the default boot hang guard, which only the explicit
#   emulator-only `emulator_age_limits` allows (refused by a board's aarch64 build);
# - the robot's observation age and heartbeat at the device ceiling of a minute: a guest
#   starved for seconds by a loaded host must not look like a stale camera or a dead robot.
BOOT_TIMEOUT_S = 1800.0
EXECUTE_STEPS = 4
VM_CONTROL = {
    "publish_hz": 1.0,
    "max_observation_age_ms": 60000,
    "max_chunk_age_ms": 3600000,
    "hold_after_chunk_end_ms": 2000,
    "action_valid_ms": 2000,
    "writer_heartbeat_timeout_ms": 60000,
    "trigger": "synchronous",
    "execute_steps": EXECUTE_STEPS,
    "emulator_age_limits": True,
}
TRIAL_INFERENCES = 2
OK_ACTIONS = 3
# The trial's `vlad ota verdict --wait` slack: it waits while the daemon loads and gates,
# then this plus twice the gate's measured inference time (the scenario's other waits are
# for as long as the daemon lives; --boot-timeout is the hang guard).
GUEST_WAIT_S = 120
# What a healthy store's root holds (vla-ota's store layout, lib.rs): the version floor and an
# adopted key list are the store's own files, not leftovers of an interrupted operation.
ROOT_ENTRIES = {"bundles", "current", "previous", "ota-state.json", "ota.lock", "vlad.pid",
                "version-floor.json", "key-list.json"}
HASH = re.compile(r"^[0-9a-f]{64}$")
MARKER = re.compile(r"powercut: (.*?)\s*$")


def log(msg: str) -> None:
    print(f"powercut: {msg}", flush=True)


class RunError(Exception):
    """The run could not be set up or a boot could not be driven (not a finding)."""


# ------------------------------------------------------------------------------ set-up

@dataclass
class Setup:
    hashes: dict[str, str]  # fixture name -> content hash
    disk: Path
    initrd: Path


def prepare(vlad: Path, kernel_dir: Path, out: Path, work: Path) -> Setup:
    """Keys, three signed bundles, the daemon's configuration, the provisioned disk image
    (as flashed: b1 current and b3 previous, both committed; b3's source beside the store
    so that it installs with --link), the scenario's environment and the initramfs."""
    key = work / "fleet.key"
    public = hex64(vlad_cmd(vlad, "bundle", "keygen", key).stdout)
    config = work / "vlad.json"
    cfg = daemon_config(json.loads((REPO / "config/dev.json").read_text()), OTA_ROOT, public,
                        "vla-powercut", VM_CONTROL, trial_inferences=TRIAL_INFERENCES, max_trial_starts=3)
    config.write_text(json.dumps(cfg, indent=2) + "\n")

    policies = work / "policies"
    policies.mkdir()
    # One version, three names: the loop cycles through them for ever, and a device never
    # installs a version below the highest it committed (its version floor).
    names = {"b1": "1.0.0", "b2": "1.0.0", "b3": "1.0.0"}
    for name, version in names.items():
        signed_policy_bundle(vlad, FIXTURE, policies, name, version, key, bundle_name=f"powercut-{name}")
    hashes = {n: hex64(vlad_cmd(vlad, "bundle", "verify", policies / n, "--config", config).stdout
                       .split("content hash", 1)[1]) for n in names}

    stage = out / "disk-root"
    shutil.rmtree(stage, ignore_errors=True)
    (stage / "artifacts").mkdir(parents=True)
    shutil.copytree(policies / "b3", stage / "artifacts/b3")
    root = ["--root", stage / "ota", "--config", config]
    # b3 then b1, each committed: the first iteration already installs a bundle (b2) and
    # its gc removes one (b3), as every later one does.
    for name in ("b3", "b1"):
        vlad_cmd(vlad, "ota", "install", policies / name, *root)
        vlad_cmd(vlad, "ota", "activate", hashes[name], *root)
        vlad_cmd(vlad, "ota", "commit", *root)
    disk = out / "ota-disk.img"
    disk.unlink(missing_ok=True)
    mkfs = shutil.which("mkfs.ext4") or shutil.which("mkfs.ext4", path="/usr/sbin:/sbin")
    if mkfs is None:
        raise RunError("mkfs.ext4 not found (Debian package e2fsprogs)")
    p = subprocess.run([mkfs, "-q", "-F", "-L", "vla-ota", "-d", str(stage),
                        "-E", "lazy_itable_init=0,lazy_journal_init=0", str(disk), "64M"],
                       capture_output=True, text=True)
    if p.returncode != 0:
        raise RunError(f"mkfs.ext4 failed: {p.stdout}{p.stderr}")
    shutil.rmtree(stage)

    sources = {"b1": (policies / "b1", "copy"), "b2": (policies / "b2", "copy"),
               "b3": (DISK_MNT / "artifacts/b3", "link")}
    env = [f"VLAD={vlad}", f"VLAD_CONFIG={config}", f"VLA_QNN_LIB_DIR={os.environ['VLA_QNN_LIB_DIR']}",
           "DISK_DEV=/dev/vda", f"DISK_MNT={DISK_MNT}", f"OTA_ROOT={OTA_ROOT}",
           f"WAIT_S={GUEST_WAIT_S}", f"OK_ACTIONS={OK_ACTIONS}", "CAMERA_HZ=2",
           f"BUNDLES=\"{' '.join(names)}\""]
    for name, (src, placement) in sources.items():
        env += [f"HASH_{name}={hashes[name]}", f"SRC_{name}={src}", f"PLACEMENT_{name}={placement}"]
    (work / "env.sh").write_text("\n".join(env) + "\n")
    shutil.copy(REPO / "scripts/rauc/powercut-inside.sh", work / "inside.sh")
    try:
        initrd, modules = vm.initramfs(kernel_dir, work, out, DISK_MODULES)
    except vm.VmError as e:
        raise RunError(str(e)) from None
    log(f"initramfs: busybox and {len(modules)} modules ({', '.join(modules)})")
    return Setup(hashes=hashes, disk=disk, initrd=initrd)


# ------------------------------------------------------------------------- one boot

@dataclass
class Boot:
    """What the host saw of one boot on the serial console (host clock, seconds since
    qemu started)."""
    number: int
    check_done: float | None = None
    finished: bool = False
    loop_start: float | None = None
    begun: list[tuple[float, int, str, str]] = field(default_factory=list)  # (t, iter, phase, hash)
    ended: list[tuple[float, int, str, str]] = field(default_factory=list)
    error: str | None = None
    target: str | None = None
    fraction: float | None = None
    delay: float | None = None
    killed_at: float | None = None
    exit_code: int | None = None
    seconds: float = 0.0

    def last_begun(self) -> tuple[float, int, str, str] | None:
        return self.begun[-1] if self.begun else None

    def last_ended(self) -> tuple[float, int, str, str] | None:
        return self.ended[-1] if self.ended else None

    def phase_at_cut(self) -> str:
        b, e = self.last_begun(), self.last_ended()
        if b is None:
            return "(before the loop)"
        if e is not None and (e[1], e[2]) == (b[1], b[2]):
            return f"{b[2]}, ended"
        return b[2]

    def durations(self) -> dict[str, list[float]]:
        begin = {(i, p): t for t, i, p, _ in self.begun}
        found: dict[str, list[float]] = {}
        for t, i, p, _ in self.ended:
            if (i, p) in begin:
                found.setdefault(p, []).append(t - begin[(i, p)])
        return found


class Driver:
    """Runs qemu for one boot and reads its console as it comes; in loop mode kills it
    (SIGKILL: the power cut) `fraction` of the target phase's expected duration after
    the guest begins that phase, or at once when the guest reports an error, or at the
    deadline."""

    def __init__(self, boot: Boot, estimate: dict[str, float], deadline_s: float):
        self.boot, self.estimate, self.deadline_s = boot, estimate, deadline_s
        self.kill_at: float | None = None
        self.lines: queue.Queue[tuple[float, str | None]] = queue.Queue()
        self.start = 0.0

    def run(self, cmd: list[str], console_log: Path) -> None:
        self.start = time.monotonic()
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL)
        thread = threading.Thread(target=self.read, args=(proc, console_log), daemon=True)
        thread.start()
        try:
            self.watch(proc)
        finally:
            if proc.poll() is None:  # this script was stopped: no qemu is left behind
                proc.kill()
            self.boot.exit_code = proc.wait()
        self.boot.seconds = time.monotonic() - self.start
        thread.join()

    def read(self, proc: subprocess.Popen, console_log: Path) -> None:
        assert proc.stdout is not None
        with open(console_log, "wb") as f:
            for raw in proc.stdout:
                f.write(raw)
                f.flush()
                self.lines.put((time.monotonic() - self.start, raw.decode("utf-8", "replace")))
        self.lines.put((time.monotonic() - self.start, None))

    def kill(self, proc: subprocess.Popen, now: float) -> None:
        if self.boot.killed_at is None:
            proc.kill()
            self.boot.killed_at = now

    def watch(self, proc: subprocess.Popen) -> None:
        """Handles console lines until qemu's output ends (everything it printed before
        it died included)."""
        boot = self.boot
        while True:
            now = time.monotonic() - self.start
            if boot.error:
                self.kill(proc, now)
            if self.kill_at is not None and now >= self.kill_at:
                self.kill(proc, now)
            if now > self.deadline_s and boot.killed_at is None:
                boot.error = f"the boot ran past its {self.deadline_s:.0f} s limit"
                self.kill(proc, now)
            wait = 1.0
            if self.kill_at is not None and boot.killed_at is None:
                wait = max(0.0, min(1.0, self.kill_at - now))
            try:
                t, line = self.lines.get(timeout=wait)
            except queue.Empty:
                continue
            if line is None:
                return
            self.handle(t, line)

    def handle(self, t: float, line: str) -> None:
        boot = self.boot
        m = MARKER.search(line)
        words = m.group(1).split() if m else []
        if not words:
            return
        if words == ["check", "done"]:
            boot.check_done = t
        elif words[0] == "finished":
            boot.finished = True
        elif words[:2] == ["loop", "start"]:
            boot.loop_start = t
        elif words[0] in ("begin", "end") and len(words) >= 4:
            entry = (t, int(words[1]), words[2], words[3])
            (boot.begun if words[0] == "begin" else boot.ended).append(entry)
            if words[0] == "begin" and words[2] == boot.target and self.kill_at is None:
                boot.delay = (boot.fraction or 0.0) * self.estimate[words[2]]
                self.kill_at = t + boot.delay
        elif words[0] == "error":
            boot.error = " ".join(words[1:])


# --------------------------------------------------------------------------- judging

@dataclass
class Expectation:
    """What the loop had acknowledged before the cut: the last phase that ended, and
    the bundle a phase begun after it may have added."""
    phase: str
    hash: str
    adding: str | None = None
    kept_by_gc: set[str] = field(default_factory=set)


def expectation(boot: Boot, boot_dir: Path) -> Expectation | None:
    e = boot.last_ended()
    if e is None:
        return None
    _, it, phase, h = e
    b = boot.last_begun()
    adding = b[3] if b is not None and b[2] == "install" and (b[1], b[2]) != (it, phase) else None
    kept: set[str] = set()
    if phase == "gc":
        # The gc output was complete before the guest announced the end of gc.
        text = read(boot_dir / "loop" / f"{it}-gc.out")
        kept = set(re.findall(r"^kept ([0-9a-f]{64})", text, re.M))
    return Expectation(phase=phase, hash=h, adding=adding, kept_by_gc=kept)


def read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def parse_state(text: str) -> dict | None:
    try:
        state = json.loads(text)
    except ValueError:
        return None
    return state if isinstance(state, dict) else None


def links(text: str) -> dict[str, str | None]:
    found: dict[str, str | None] = {}
    for line in text.splitlines():
        name, _, target = line.partition(" ")
        found[name] = None if target in ("", "(none)") else target
    return found


def leftovers(root_entries: list[str], bundle_entries: list[str]) -> list[str]:
    return ([e for e in root_entries if e not in ROOT_ENTRIES]
            + [f"bundles/{e}" for e in bundle_entries if not HASH.match(e)])


def judge_boot(d: Path, known: set[str], expect: Expectation | None) -> tuple[list[str], dict]:
    """Problems found in one boot's check (boots/<n>/), and what recovery had to do."""
    problems: list[str] = []
    facts: dict = {}

    def need(cond: bool, what: str, evidence: str = "") -> None:
        if not cond:
            problems.append(what + (f"\n    {evidence.strip()[:1500]}" if evidence.strip() else ""))

    for name, what in (("mount-replay", "the store's file system did not mount after the cut"),
                       ("fsck", "e2fsck -fn found the file system damaged after its journal replay"),
                       ("mount", "the store's file system did not mount again")):
        rc = read(d / f"{name}.rc").strip()
        need(rc == "0", f"{what} (exit {rc or 'missing'})", read(d / f"{name}.out"))
    if not (d / "check-finished").exists():
        problems.append("the check did not finish (see the console log)")
        return problems, facts

    # The store as the cut left it (before recovery): what the loop acknowledged is there.
    before = parse_state(read(d / "before.state"))
    before_bundles = read(d / "before.bundles").split()
    facts["leftovers_before"] = leftovers(read(d / "before.root").split(), before_bundles)
    facts["links_disagreed"] = "warning: link" in read(d / "before.status")
    facts["on_trial_at_cut"] = bool(before and before.get("trial"))
    if expect is not None:
        where = f"(last acknowledged: {expect.phase} of {expect.hash[:12]})"
        cur = before.get("current") if before else None
        if expect.phase == "install":
            need(expect.hash in before_bundles, f"an installed bundle is missing after the cut {where}",
                 read(d / "before.bundles"))
        if expect.phase in ("activate", "trial", "commit", "gc"):
            need(cur == expect.hash, f"the activation did not survive the cut: current is {cur} {where}",
                 read(d / "before.state"))
        if expect.phase == "trial" and before and before.get("trial") == expect.hash:
            need(int(before.get("healthy_inferences", 0)) >= 1,
                 f"the trial's healthy inference was lost {where}", read(d / "before.state"))
        if expect.phase in ("commit", "gc"):
            need(before is not None and before.get("trial") is None,
                 f"the commit did not survive the cut {where}", read(d / "before.state"))
        if expect.phase == "gc" and before:
            allowed = {before.get("current"), before.get("previous"), before.get("trial"),
                       expect.adding, *expect.kept_by_gc}
            stale = [b for b in before_bundles if HASH.match(b) and b not in allowed]
            need(not stale, f"gc's removal did not survive the cut: {stale} {where}",
                 read(d / "before.bundles"))

    # The daemon: started, recovered, gated current, served the robot.
    daemon_log = read(d / "daemon.log")
    need(read(d / "daemon-state").strip() == "running", "the daemon did not keep running",
         daemon_log[-1500:])
    ok = read(d / "robot-ok").strip()
    need(ok.isdigit() and int(ok) >= OK_ACTIONS, f"the robot applied {ok or 'no'} ok actions", daemon_log[-1500:])
    need(not (d / "check-errors").exists(), "the check reported errors", read(d / "check-errors"))
    rollbacks = [line for line in daemon_log.splitlines() if "rolled back before loading" in line]
    facts["rollbacks_at_start"] = rollbacks
    for line in rollbacks:
        need("crash loop" in line, "the daemon rolled back at start for another reason than a crash loop", line)
    errors = [line for line in daemon_log.splitlines() if " ERROR " in line]
    need(not errors, "the daemon logged errors", "\n".join(errors[:5]))

    # The store after recovery.
    status = read(d / "after.status")
    need(read(d / "after.status.rc").strip() == "0", "vlad ota status failed", status)
    need("warning:" not in status, "state and links disagree after recovery", status)
    need("leftover:" not in status, "vlad ota status reports leftovers after recovery", status)
    state = parse_state(read(d / "after.state"))
    need(state is not None, "the state file is missing or unreadable after recovery", read(d / "after.state"))
    after_bundles = read(d / "after.bundles").split()
    left = leftovers(read(d / "after.root").split(), after_bundles)
    need(not left, f"leftovers after recovery: {left}")
    facts["cleaned"] = [e for e in facts["leftovers_before"] if e not in left]
    if state is not None:
        cur, prev, trial = state.get("current"), state.get("previous"), state.get("trial")
        facts["current"] = cur
        facts["on_trial_after"] = trial is not None
        need(cur in known, f"current is {cur}, not one of the fixtures", read(d / "after.state"))
        need(trial is None or trial == cur, f"the bundle on trial ({trial}) is not current ({cur})")
        lk = links(read(d / "after.links"))
        for name, h in (("current", cur), ("previous", prev)):
            want = None if h is None else f"bundles/{h}"
            need(lk.get(name) == want, f"link `{name}` -> {lk.get(name)} but the state says {want}")
        for h in (cur, prev):
            need(h is None or h in after_bundles, f"the state names {h}, which is not installed",
                 read(d / "after.bundles"))
        verify_current = read(d / "verify-current.out")
        need(read(d / "verify-current.rc").strip() == "0" and f"content hash {cur}" in verify_current,
             "`current` does not verify completely", verify_current)
    for name in after_bundles:
        if not HASH.match(name):
            continue
        out = read(d / "verify" / f"{name}.out")
        need(name in known, f"an unknown bundle {name} is stored")
        need(read(d / "verify" / f"{name}.rc").strip() == "0" and f"content hash {name}" in out,
             f"stored bundle {name[:12]} does not verify", out)
    facts["stored"] = [b for b in after_bundles if HASH.match(b)]
    return problems, facts


# ----------------------------------------------------------------------------- the run

def plan(rng: random.Random, cuts: int) -> list[tuple[str, float]]:
    """The phase each cut aims at (every phase once per round, in a shuffled order) and
    the fraction of its expected duration after which it comes."""
    targets: list[str] = []
    while len(targets) < cuts:
        round_ = PHASES[:]
        rng.shuffle(round_)
        targets += round_
    return [(t, rng.random()) for t in targets[:cuts]]


def fmt_s(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vlad", type=Path, required=True)
    ap.add_argument("--kernel-dir", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--cuts", type=int, default=30)
    ap.add_argument("--seed", type=int, default=None, help="default: a random one (printed)")
    ap.add_argument("--boot-timeout", type=float, default=BOOT_TIMEOUT_S, help="seconds one boot may run")
    ap.add_argument("--memory-mib", type=int, default=4096)
    a = ap.parse_args()
    if a.cuts < 1:
        ap.error("--cuts must be at least 1")
    try:
        cpus = vm.cpus_from_env()
    except vm.VmError as e:
        log(f"FAILED to set up: {e}")
        return 1
    seed = a.seed if a.seed is not None else random.SystemRandom().randrange(2**32)
    # Stopped from outside (SIGTERM), unwind so that the running qemu is killed too.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    vlad, kernel_dir, out = a.vlad.resolve(), a.kernel_dir.resolve(), a.out.resolve()
    shutil.rmtree(out, ignore_errors=True)
    work = out / "work"
    work.mkdir(parents=True)
    run_start = time.monotonic()
    log(f"seed {seed}, {a.cuts} cut(s), {cpus} vCPU; results in {out}")
    try:
        setup = prepare(vlad, kernel_dir, out, work)
    except (FixtureError, RunError) as e:
        log(f"FAILED to set up: {e}")
        return 1
    known = set(setup.hashes.values())
    log("bundles: " + ", ".join(f"{n} {h[:12]}" for n, h in setup.hashes.items()))
    targets = plan(random.Random(seed), a.cuts)
    estimate = dict(PRIOR_S)
    observed: dict[str, list[float]] = {}
    drive_args = ["-drive", f"file={setup.disk},format=raw,if=virtio,cache=none"]
    cmd = vm.qemu_command(kernel_dir, setup.initrd, work, a.memory_mib, drive_args, cpus)

    rows: list[dict] = []
    problems_total: list[str] = []
    previous: Boot | None = None
    for n in range(a.cuts + 1):
        last = n == a.cuts
        boot = Boot(number=n)
        if not last:
            boot.target, boot.fraction = targets[n]
        (work / "boot").write_text(f"{n}\n")
        (work / "mode").write_text("check\n" if last else "loop\n")
        boot_dir = work / "boots" / str(n)
        Driver(boot, estimate, a.boot_timeout).run(cmd, out / f"console-{n}.log")
        expect = expectation(previous, work / "boots" / str(n - 1)) if previous else None
        problems, facts = judge_boot(boot_dir, known, expect)
        if boot.check_done is None:
            problems.append(f"no `check done` from the guest (qemu exit {boot.exit_code}); "
                            f"see {out / f'console-{n}.log'}")
        if last:
            if not boot.finished:
                problems.append("the last boot did not stop its daemon and unmount cleanly")
            elif read(boot_dir / "daemon.rc").strip() != "0":
                problems.append(f"the daemon exited {read(boot_dir / 'daemon.rc').strip()} on SIGTERM")
        else:
            if boot.error:
                problems.append(f"the loop failed: {boot.error}")
            elif boot.killed_at is None:
                problems.append(f"the VM stopped by itself before the cut (exit {boot.exit_code})")
        for phase, seconds in boot.durations().items():
            observed.setdefault(phase, []).extend(seconds)
            estimate[phase] = statistics.median(observed[phase])
        row = {"boot": n, "check_s": boot.check_done, "seconds": round(boot.seconds, 1), "facts": facts,
               "problems": problems}
        if previous is not None:
            row.update(cut=n, target=previous.target, phase=previous.phase_at_cut(),
                       delay=previous.delay,
                       into_phase=(previous.killed_at - previous.last_begun()[0]
                                   if previous.last_begun() and previous.killed_at else None),
                       iteration=previous.last_begun()[1] if previous.last_begun() else None,
                       boot_to_cut=previous.killed_at, loop_to_cut=(
                           previous.killed_at - previous.loop_start
                           if previous.killed_at and previous.loop_start else None))
        rows.append(row)
        status = "ok" if not problems else "FAILED"
        if previous is None:
            log(f"boot 0 (the store as flashed): check {status} after {fmt_s(boot.check_done)} s")
        else:
            log(f"cut {n}: aimed at {row['target']}, landed in {row['phase']} "
                f"{fmt_s(row['into_phase'])} s in (iteration {row['iteration']}); boot {n} check {status} "
                f"after {fmt_s(boot.check_done)} s")
        for p in problems:
            log(f"  PROBLEM: {p}")
        problems_total += [f"boot {n}: {p}" for p in problems]
        if problems:
            break
        previous = boot

    total = time.monotonic() - run_start
    report(rows, seed, total, out, problems_total)
    return 1 if problems_total else 0


def report(rows: list[dict], seed: int, total: float, out: Path, problems: list[str]) -> None:
    cuts = [r for r in rows if "cut" in r]
    print(f"\npower-cut run, seed {seed}: {len(cuts)} cut(s), {total / 60:.1f} min")
    print(f"{'cut':>4} {'aimed at':<9} {'phase at cut':<16} {'delay':>6} {'in':>6} {'iter':>4} "
          f"{'cut at':>7} {'check':>6}  next boot")
    for r in cuts:
        f = r["facts"]
        notes = []
        if f.get("leftovers_before"):
            notes.append(f"cleaned {len(f['cleaned'])} leftover(s)")
        if f.get("links_disagreed"):
            notes.append("links repaired")
        if f.get("on_trial_at_cut"):
            notes.append("on trial")
        if f.get("rollbacks_at_start"):
            notes.append("crash-loop rollback")
        verdict = "ok" if not r["problems"] else "FAILED"
        print(f"{r['cut']:>4} {r['target']:<9} {r['phase']:<16} {fmt_s(r['delay']):>6} "
              f"{fmt_s(r['into_phase']):>6} {r['iteration'] if r['iteration'] is not None else '-':>4} "
              f"{fmt_s(r['boot_to_cut']):>7} {fmt_s(r['check_s']):>6}  {verdict}"
              + (f" ({', '.join(notes)})" if notes else ""))
    phases: dict[str, int] = {}
    for r in cuts:
        phases[r["phase"]] = phases.get(r["phase"], 0) + 1
    if cuts:
        per_cut = [r["boot_to_cut"] for r in cuts if r["boot_to_cut"]]
        checks = [r["check_s"] for r in rows if r["check_s"]]
        print("phases at cut: " + ", ".join(f"{p} {n}" for p, n in sorted(phases.items())))
        if per_cut:
            print(f"boot to cut: mean {statistics.mean(per_cut):.1f} s, min {min(per_cut):.1f}, "
                  f"max {max(per_cut):.1f}")
        if checks:
            print(f"boot to check done: mean {statistics.mean(checks):.1f} s, min {min(checks):.1f}, "
                  f"max {max(checks):.1f}")
        print("recovery: " + ", ".join([
            f"{sum(1 for r in cuts if r['facts'].get('leftovers_before'))} cut(s) left leftovers",
            f"{sum(1 for r in cuts if r['facts'].get('links_disagreed'))} left links disagreeing",
            f"{sum(1 for r in cuts if r['facts'].get('on_trial_at_cut'))} came during a trial",
            f"{sum(1 for r in cuts if r['facts'].get('rollbacks_at_start'))} crash-loop rollback(s)"]))
    summary = {"seed": seed, "cuts": len(cuts), "minutes": round(total / 60, 1), "phases": phases,
               "rows": rows, "problems": problems}
    (out / "summary.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
    if problems:
        print(f"POWER-CUT RUN FAILED ({len(problems)} problem(s)); logs in {out}")
        for p in problems:
            print("  " + p)
    else:
        print(f"passed: nothing lost in {len(cuts)} cut(s) (summary: {out / 'summary.json'})")


if __name__ == "__main__":
    sys.exit(main())
