"""A fleet rollout through goosebit (a real hawkBit-DDI server on 127.0.0.1) to four
device stand-ins, each with its own OTA store, its own vlad daemon on the HTP emulator
(the Fast-WAM fixture), its own robot and its own rauc-hawkbit agent installing through
meta-vla's RAUC handlers. Everything asserted about the rollout is read from the server's
own API (/api/v1/rollouts, /api/v1/devices) and compared with what each device did.

The scenario runs once (module fixture) in phases:
  1. policy 1.1.0 (good) rolled out: canary group (dev-1), then wave-1 (dev-2, dev-3), then
     wave-2 (dev-4);
  2. policy 1.2.0 (signed, intact, fails the parity gate) rolled out the same way, error
     threshold 20 %: the canary fails, the rollout stops, wave-1 never gets it;
  3. policy 1.3.0 (a good policy, signed with the fleet's NEW key, carrying the key list
     that rotates to it, signed by the fleet's root key) rolled out the same way: the
     devices that trust the root key adopt the list and take the release; dev-3 lags the
     key rotation (its image has no root key, it trusts only the old key), so on dev-3
     alone vlad refuses the release at SIGNATURE VERIFICATION in RAUC's pre-install
     handler (`vlad bundle verify`), before anything is written - not at the parity gate.
     The canary succeeds, wave-1 ends 1 succeeded / 1 failed (1 of 3 failed so far, 33 % >
     20 %): the rollout stops, wave-2 (dev-4) stays on 1.1.0;
  4. bad input: a corrupt download (dev-2), a refused token and an unreachable server (dev-3),
     a rollback: dev-4 (on 1.1.0, committed) sent the older signed 1.0.0, refused by
     vlad's version floor, still on 1.1.0 and driving; and an expired 1.5.0 sent to dev-4,
     refused the same way;
  5. the transport: an impostor whose certificate comes from another CA (refused in the
     handshake), a client without a certificate (refused by the server), expired login
     tokens (refused), and a server streaming an endless artifact to dev-3's agent writing
     into a small private tmpfs (stopped at the agent's limit, then by the full tmpfs;
     reported, nothing installed, dev-3 driving).

Everything runs over HTTPS with a CA made at test time (`make_pki`): the server requires a
client certificate from it, every agent pins it and presents its device's certificate.

Run with the project venv (the agents and the server run in build/fleet-venv):
    scripts/setup_fleet.sh && .venv/bin/python -m pytest -q tools/vla_fleet/tests
Needs target/release/vlad (or $VLAD), RAUC 1.13 from scripts/rauc/check.sh (build/tools),
VLA_QNN_LIB_DIR. Emulator only: no board was attached."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]

from vla_fleet import rollout  # noqa: E402
from vla_fleet.api import ApiError, Server  # noqa: E402
from vla_fleet.device import Device  # noqa: E402

OUT = REPO / "build/fleet-rollout"
FLEET_VENV = Path(os.environ.get("FLEET_VENV", REPO / "build/fleet-venv"))
RAUC = REPO / "build/tools/rauc-1.13/build/rauc"
VLAD = Path(os.environ.get("VLAD", REPO / os.environ.get("CARGO_TARGET_DIR", "target") / "release/vlad"))
FIXTURE = REPO / "golden/bundles/fastwam"
COMPATIBLE = "vla-fleet-test"
DEVICES = ["dev-1", "dev-2", "dev-3", "dev-4"]
GROUPS = [("canary", ["dev-1"]), ("wave-1", ["dev-2", "dev-3"]), ("wave-2", ["dev-4"])]
# The share of the devices reached so far that may fail before the rollout stops
# (vla_fleet.rollout.run checks it after each group).
THRESHOLD = 20.0
# The device whose image predates the fleet's root key: it cannot take the key list that
# rotates to the new signing key.
LAGGING = "dev-3"
# The one guard against a hang; every wait below is keyed on the devices' processes
# living and on the server's counters, not on how fast this machine is.
DEADLINE_S = 1800.0
ADMIN = "admin@vla.local"
# The server's login token lifetime (`server init --session-lifetime`).
SESSION_S = 3600


def cannot_run(what: str) -> None:
    if os.environ.get("VLA_REQUIRE_ALL_TESTS") == "1":
        pytest.fail(f"cannot run here: {what} (VLA_REQUIRE_ALL_TESTS=1)")
    pytest.skip(f"cannot run here: {what}")


def log(msg: str) -> None:
    print(f"fleet-test: {msg}", file=sys.stderr, flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(*args, **kw) -> subprocess.CompletedProcess:
    p = subprocess.run([str(a) for a in args], capture_output=True, text=True, **kw)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, args))} exited {p.returncode}: {p.stdout}{p.stderr}")
    return p


def hs256(claims: dict, secret: str) -> str:
    """A JSON web token signed as goosebit signs its login tokens (HS256, its secret key)."""
    def b64(data: bytes) -> bytes:
        return base64.urlsafe_b64encode(data).rstrip(b"=")
    head = b64(json.dumps({"alg": "HS256", "typ": "JWT"}).encode()) + b"." + b64(json.dumps(claims).encode())
    return (head + b"." + b64(hmac.new(secret.encode(), head, hashlib.sha256).digest())).decode()


def jwt_claims(token: str) -> dict:
    part = token.split(".")[1]
    return json.loads(base64.urlsafe_b64decode(part + "=" * (-len(part) % 4)))


def make_pki(work: Path) -> dict[str, Path]:
    """The fleet's test CA (made now, valid a day) with the server's certificate for
    127.0.0.1, a client certificate for each device and one for the operator; and a second,
    unrelated CA with a server certificate for 127.0.0.1 (an impostor the devices must
    refuse)."""
    pki = work / "pki"
    pki.mkdir()
    out: dict[str, Path] = {}

    def ca(name: str) -> None:
        key, cert = pki / f"{name}.key", pki / f"{name}.pem"
        run("openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
            "-keyout", key, "-out", cert, "-days", "1", "-subj", f"/CN=vla fleet test {name}",
            "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign")
        out[name], out[f"{name}-key"] = cert, key

    def leaf(name: str, issuer: str, usage: str, san: str | None) -> None:
        key, csr, cert = pki / f"{name}.key", pki / f"{name}.csr", pki / f"{name}.pem"
        run("openssl", "req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
            "-keyout", key, "-out", csr, "-subj", f"/CN={name}")
        ext = pki / f"{name}.ext"
        ext.write_text("basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature\n"
                       f"extendedKeyUsage={usage}\n" + (f"subjectAltName={san}\n" if san else ""))
        run("openssl", "x509", "-req", "-in", csr, "-CA", out[issuer], "-CAkey", out[f"{issuer}-key"],
            "-CAcreateserial", "-out", cert, "-days", "1", "-extfile", ext)
        out[name], out[f"{name}-key"] = cert, key

    ca("fleet-ca")
    ca("other-ca")
    leaf("server", "fleet-ca", "serverAuth", "IP:127.0.0.1")
    leaf("impostor", "other-ca", "serverAuth", "IP:127.0.0.1")
    leaf("operator", "fleet-ca", "clientAuth", None)
    for name in DEVICES:
        leaf(name, "fleet-ca", "clientAuth", None)
    return out


def agent_tls(pki: dict[str, Path], name: str) -> list[str]:
    """A device's agent: the fleet's CA pinned, its own client certificate."""
    return ["--ca", str(pki["fleet-ca"]), "--cert", str(pki[name]), "--key", str(pki[f"{name}-key"])]


class Impostor:
    """A DDI server on 127.0.0.1 that is not the fleet's: it offers every device one
    deployment whose artifact advertises 1 KiB and then streams zeros without end, and
    records what reaches it. Over HTTPS with the certificate it is given."""

    def __init__(self, cert: Path, key: Path):
        import http.server
        import ssl
        import threading

        impostor = self
        self.requests: list[str] = []
        self.feedback: list[dict] = []
        self.streamed = 0

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def answer(self, body: object) -> None:
                data = json.dumps(body).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                impostor.requests.append(f"GET {self.path}")
                base = f"https://127.0.0.1:{impostor.port}/DEFAULT/controller/v1/{self.path.split('/')[4]}"
                if "/artifacts/" in self.path:
                    self.send_response(200)
                    self.send_header("Content-Type", "application/octet-stream")
                    self.end_headers()
                    block = bytes(1 << 16)
                    try:
                        while True:
                            self.wfile.write(block)
                            impostor.streamed += len(block)
                    except OSError:
                        return  # the agent hung up
                elif "/deploymentBase/" in self.path:
                    self.answer({"id": "7", "deployment": {"download": "forced", "update": "forced", "chunks": [
                        {"part": "os", "version": "9.9.9", "name": "endless", "artifacts": [
                            {"filename": "endless.raucb", "size": 1024, "hashes": {"sha1": "0" * 40},
                             "_links": {"download": {
                                 "href": f"{base}/softwaremodules/1/artifacts/endless.raucb"}}}]}]}})
                else:
                    self.answer({"config": {"polling": {"sleep": "00:00:02"}},
                                 "_links": {"deploymentBase": {"href": f"{base}/deploymentBase/7?c=7"}}})

            def do_POST(self):
                impostor.requests.append(f"POST {self.path}")
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if self.path.endswith("/feedback"):
                    impostor.feedback.append(json.loads(body))
                self.answer({})

            do_PUT = do_POST

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(cert, key)
        self.server.socket = ctx.wrap_socket(self.server.socket, server_side=True)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def private_tmpfs(mountpoint: Path, size: str) -> list[str] | None:
    """A command prefix that runs its arguments in a private mount namespace with a tmpfs
    of `size` on `mountpoint` (nobody else sees the mount; it goes with the process), or
    None when this machine allows no such namespace."""
    if os.geteuid() == 0:
        unshare = ["unshare", "--mount", "--propagation", "private"]
    else:
        unshare = ["unshare", "--user", "--map-root-user", "--mount", "--propagation", "private"]
    script = 'mount -t tmpfs -o "size=$1,mode=0700" vla-download "$2" && shift 2 && exec "$@"'
    probe = subprocess.run([*unshare, "sh", "-c", script, "sh", size, str(mountpoint), "true"],
                           capture_output=True, text=True)
    if probe.returncode != 0:
        log(f"no private tmpfs here: {probe.stderr.strip()}")
        return None
    return [*unshare, "sh", "-c", script, "sh", size, str(mountpoint)]


class Fleet:
    """The server, the devices and what the scenario recorded."""

    def __init__(self):
        self.procs: list[subprocess.Popen] = []
        self.devices: dict[str, Device] = {}
        self.seen: dict[str, object] = {}
        self.start = time.monotonic()
        self.server_proc: subprocess.Popen | None = None

    def spawn(self, argv, out: Path, env=None) -> subprocess.Popen:
        with open(out, "ab") as f:
            p = subprocess.Popen([str(a) for a in argv], stdout=f, stderr=subprocess.STDOUT,
                                 stdin=subprocess.DEVNULL, env=env, start_new_session=True)
        self.procs.append(p)
        return p

    def keep_waiting(self, keys=("daemon", "robot", "agent")) -> str | None:
        for p in self.procs:
            if p.poll() is not None:
                return f"{p.args[0]} exited {p.returncode} (logs in {OUT})"
        for d in self.devices.values():
            for k in keys:
                if k in d.procs and not d.alive(k):
                    return f"{d.name}'s {k} exited {d.procs[k].returncode}; log: {d.log(k)[-1500:]}"
        if time.monotonic() - self.start > DEADLINE_S:
            return f"the scenario ran past {DEADLINE_S:.0f} s"
        return None

    def wait_for(self, what: str, cond, keys=("daemon", "robot", "agent")):
        while True:
            v = cond()
            if v:
                return v
            why = self.keep_waiting(keys)
            if why is not None:
                raise AssertionError(f"waiting for {what}: {why}")
            time.sleep(0.5)

    def close(self) -> None:
        for d in self.devices.values():
            d.stop_all()
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(30)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()


def make_bundles(work: Path) -> dict:
    from vla_host.ota_fixtures import hex64, signed_policy_bundle
    import check  # scripts/rauc/check.py: the RAUC bundle meta-vla's recipe builds

    check.COMPATIBLE = COMPATIBLE  # rauc_bundle writes the module's compatible into the manifest
    fleet_key = work / "fleet.key"
    public = hex64(run(VLAD, "bundle", "keygen", fleet_key).stdout)
    # The key the fleet rotates to: releases from 1.3.0 on are signed with it.
    new_key = work / "fleet-new.key"
    new_public = hex64(run(VLAD, "bundle", "keygen", new_key).stdout)
    # The fleet's root key (offline in real life): it signs the key list that rotates.
    root_key = work / "fleet-root.key"
    root_public = hex64(run(VLAD, "bundle", "keygen", root_key).stdout)
    cert, key = work / "rauc-cert.pem", work / "rauc-key.pem"
    run("openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
        "-nodes", "-keyout", key, "-out", cert, "-days", "30", "-subj", "/CN=vla-fleet-test RAUC signer",
        "-addext", "basicConstraints=critical,CA:FALSE", "-addext", "keyUsage=digitalSignature")
    policies = work / "policies"
    policies.mkdir()
    made = {"public": public, "new_public": new_public, "root_public": root_public, "cert": cert}
    for name, version, tamper, signer in (("a", "1.0.0", False, fleet_key), ("good", "1.1.0", False, fleet_key),
                                       ("gate-fails", "1.2.0", True, fleet_key),
                                       ("new-key", "1.3.0", False, new_key),
                                       ("corrupt", "1.4.0", False, new_key),
                                       ("expired", "1.5.0", False, fleet_key)):
        # `expired`: signed, intact and newer, but its signed expiry lies an hour back (a
        # server replaying a release it was asked to withdraw, or one frozen in time).
        d = signed_policy_bundle(VLAD, FIXTURE, policies, name, version, signer, tamper=tamper,
                                 expires=int(time.time()) - 3600 if name == "expired" else None)
        if name == "new-key":
            # The rotation travels with the first release signed by the new key: a key list
            # (version 1: the old and the new key, either enough) signed by the root key,
            # beside the manifest. Devices that trust the root key adopt it at install.
            (d / "keys.json").write_text(json.dumps(
                {"format": 1, "version": 1, "keys": [public, new_public], "threshold": 1, "revoked": []},
                indent=2) + "\n")
            run(VLAD, "bundle", "sign-keys", d, "--key", root_key)
        made[name] = {"dir": d, "version": version,
                      "hash": run("sha256sum", d / "ota-manifest.json").stdout.split()[0]}
        # A's RAUC bundle too: once 1.1.0 is committed, serving 1.0.0 is a rollback attack.
        made[name]["raucb"] = check.rauc_bundle(RAUC, work, name, d, version, cert, key)
    return made


@pytest.fixture(scope="module")
def fleet():
    for what, ok in (("VLA_QNN_LIB_DIR unset (scripts/qnn_lib_dir.sh)", "VLA_QNN_LIB_DIR" in os.environ),
                     (f"no vlad at {VLAD} (cargo build --release -p vlad)", VLAD.exists()),
                     (f"no RAUC at {RAUC} (scripts/rauc/check.sh builds it)", RAUC.exists()),
                     (f"no fleet venv at {FLEET_VENV} (scripts/setup_fleet.sh)",
                      (FLEET_VENV / "bin/python").exists()),
                     ("no dbus-daemon (scripts/setup_fleet.sh)", shutil.which("dbus-daemon") is not None),
                     ("no unsquashfs (scripts/setup_fleet.sh)", shutil.which("unsquashfs") is not None)):
        if not ok:
            cannot_run(what)
    from vla_host.ota_fixtures import FASTWAM_CONTROL, daemon_config

    # A CI runner's SIGTERM stops the scenario through its clean-up (every process it
    # started is stopped) instead of killing pytest outright.
    def terminated(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")
    previous = signal.signal(signal.SIGTERM, terminated)
    shutil.rmtree(OUT, ignore_errors=True)
    work = OUT / "work"
    work.mkdir(parents=True)
    f = Fleet()
    try:
        log("building the policy bundles and their RAUC bundles")
        b = make_bundles(work)
        f.bundles = b
        pki = make_pki(work)
        f.pki = pki

        # A private D-Bus "system bus" for the agents' RAUC proxy (nothing is called on it).
        bus = OUT / "dbus.sock"
        f.spawn(["dbus-daemon", "--session", "--nofork", f"--address=unix:path={bus}"], OUT / "dbus.log")
        f.wait_for("the D-Bus socket", lambda: bus.exists(), keys=())

        # The server: settings, database and admin offline, then uvicorn on 127.0.0.1.
        server_dir = OUT / "server"
        password = OUT / "admin.password"
        password.write_text(os.urandom(12).hex() + "\n")
        fenv = dict(os.environ)
        py = FLEET_VENV / "bin/python"
        run(py, "-m", "vla_fleet.server", "init", server_dir, "--admin", ADMIN, "--password-file", password,
            "--session-lifetime", SESSION_S, env=fenv)
        port = free_port()
        # HTTPS with the test CA's certificate, and client certificates from that CA required.
        f.server_proc = f.spawn([py, "-m", "vla_fleet.server", "serve", server_dir, "--port", port,
                                 "--tls-cert", pki["server"], "--tls-key", pki["server-key"],
                                 "--client-ca", pki["fleet-ca"]], OUT / "server.log", env=fenv)
        url = f"https://127.0.0.1:{port}"
        operator = ssl.create_default_context(cafile=str(pki["fleet-ca"]))
        operator.load_cert_chain(pki["operator"], pki["operator-key"])
        f.server = Server(url, tls=operator)

        def up():
            try:
                f.server.login(ADMIN, password.read_text().strip())
                return True
            except ApiError:
                return False
        f.wait_for("the server's login", up, keys=())
        # Login tokens expire: the one just issued carries its lifetime; one past its
        # expiry, and one without any (as goosebit itself issues them), signed with the
        # server's own secret, are refused.
        secret = (server_dir / "secret_key").read_text().strip()
        now = int(time.time())
        refused = {}
        for name, claims in (("expired", {"username": ADMIN, "iat": now - 7200, "exp": now - 3600}),
                             ("no-expiry", {"username": ADMIN})):
            try:
                Server(url, hs256(claims, secret), tls=operator).devices()
                refused[name] = "accepted"
            except ApiError as e:
                refused[name] = str(e)
        f.server.devices()  # the issued token is accepted (ApiError otherwise)
        f.seen["session"] = {"claims": jwt_claims(f.server.token), "refused": refused}
        f.url, f.port, f.server_dir = url, port, server_dir

        # The devices: each flashed with A, its daemon and robot started. The synchronous
        # trigger: each chunk plays from its first row when it lands, whatever its latency
        # (up to max_chunk_age_ms), so the robots' ok actions do not depend on this machine
        # inferring faster than a chunk's span (four daemons share two cores here).
        control = dict(FASTWAM_CONTROL, trigger="synchronous", max_chunk_age_ms=60000)
        tokens = {}
        for i, name in enumerate(DEVICES):
            root = OUT / name
            cfg = daemon_config(json.loads((REPO / "config/dev.json").read_text()), root / "ota", b["public"],
                                f"vla-fleet-{os.getpid()}-{i}", control, trial_inferences=1,
                                max_trial_starts=3)
            cfg["metrics"] = {"textfile": str(root / "vlad.prom"), "interval_ms": 1000}
            # Key rotation by the signed key list: every device but the lagging one has the
            # fleet's root key in its image; all trust only the old signing key.
            if name != LAGGING:
                cfg["ota"]["root_keys"] = [b["root_public"]]
            d = Device(name, root, VLAD, cfg, COMPATIBLE, b["cert"], RAUC, py, verdict_wait=120)
            d.env["DBUS_SYSTEM_BUS_ADDRESS"] = f"unix:path={bus}"
            d.flash(b["a"]["dir"])
            tokens[name] = root / "token"
            tokens[name].write_text(os.urandom(16).hex() + "\n")
            f.devices[name] = d
        for d in f.devices.values():
            d.start_daemon()
        for d in f.devices.values():
            f.wait_for(f"{d.name}'s daemon pid file", lambda d=d: (d.ota_root / "vlad.pid").exists(),
                       keys=("daemon",))
            d.start_robot()
        for d in f.devices.values():
            f.wait_for(f"{d.name}'s first ok action", lambda d=d: d.robot().get("ok_applied", 0) > 0, keys=("daemon", "robot"))
        log(f"devices running A ({time.monotonic() - f.start:.0f} s)")

        # The operator: the devices with their tokens, in their groups' feeds; the software.
        for feed, names in GROUPS:
            for name in names:
                f.server.create_devices([name], feed, tokens[name].read_text().strip())
        # The software before the devices register: uploading it creates the hardware
        # entry for its `compatible`. goosebit 0.2.12 creates that entry with a racy
        # get_or_create when devices register first and at once: two rows, and from
        # then on every configData of that model answers 500.
        sw = {name: f.server.upload_software(b[name]["raucb"])
              for name in ("good", "gate-fails", "new-key", "corrupt", "a", "expired")}
        f.sw = sw
        for d in f.devices.values():
            d.start_agent(f"127.0.0.1:{port}", tokens[d.name], "1.0.0", tls=agent_tls(pki, d.name))
        f.wait_for("every device registered", lambda: all(
            dv["last_state"] == "Registered" for dv in f.server.devices().values()))

        # Phase 1: the good policy, canary then wave-1.
        t0 = time.monotonic()
        r1 = rollout.run(f.server, "policy 1.1.0", sw["good"], [(g, len(n)) for g, n in GROUPS], THRESHOLD,
                         f.keep_waiting, say=log)
        f.seen["good"] = {"result": r1, "seconds": time.monotonic() - t0,
                          "rollouts": f.server.rollouts(), "devices": f.server.devices(),
                          "current": {n: d.current() for n, d in f.devices.items()},
                          "logs": {n: f.server.device_log(n) for n in DEVICES}}

        # Phase 2: the gate-failing policy: the canary fails, the threshold stops the rollout.
        t0 = time.monotonic()
        robot_before = f.devices["dev-1"].robot()
        r2 = rollout.run(f.server, "policy 1.2.0", sw["gate-fails"], [(g, len(n)) for g, n in GROUPS],
                         THRESHOLD, f.keep_waiting, say=log)
        f.seen["gate-fails"] = {"result": r2, "seconds": time.monotonic() - t0,
                                "rollouts": f.server.rollouts(), "devices": f.server.devices(),
                                "current": {n: d.current() for n, d in f.devices.items()},
                                "status": f.devices["dev-1"].status(),
                                "logs": {n: f.server.device_log(n) for n in DEVICES},
                                "agent": f.devices["dev-1"].log("agent"),
                                "robot_before": robot_before}
        # Still publishing: ok actions keep arriving at dev-1's robot after the rollback.
        d1 = f.devices["dev-1"]
        n_ok = d1.robot().get("ok_applied", 0)
        prom = (d1.root / "vlad.prom").read_text()
        f.wait_for("dev-1's robot to receive more ok actions after the rollback",
                   lambda: d1.robot().get("ok_applied", 0) > n_ok + 5)
        f.seen["gate-fails"]["robot_after"] = d1.robot()
        f.seen["gate-fails"]["metrics"] = prom
        f.wait_for("dev-1's metrics textfile to count more ok actions",
                   lambda: metric((d1.root / "vlad.prom").read_text(), 'vlad_published_actions_total{status="ok"}')
                   > metric(prom, 'vlad_published_actions_total{status="ok"}'))
        f.seen["gate-fails"]["metrics_after"] = (d1.root / "vlad.prom").read_text()

        # Phase 3: a good policy signed with the new key: dev-3 (lagging the key rotation)
        # refuses it at signature verification, the threshold stops the rollout in wave-1.
        d3 = f.devices[LAGGING]
        t0 = time.monotonic()
        robot_before = d3.robot()
        bundles_before = d3.bundles()
        repo_before = sorted(os.listdir(d3.repo)) if d3.repo.is_dir() else []
        # goosebit sends nothing more to a device in Error (dev-1, after 1.2.0) until the
        # operator forces an update: the operator's step after looking into the failure.
        f.server.patch_devices(["dev-1"], force_update=True)
        r3 = rollout.run(f.server, "policy 1.3.0", sw["new-key"], [(g, len(n)) for g, n in GROUPS],
                         THRESHOLD, f.keep_waiting, say=log)
        f.seen["new-key"] = {"result": r3, "seconds": time.monotonic() - t0,
                             "rollouts": f.server.rollouts(), "devices": f.server.devices(),
                             "current": {n: d.current() for n, d in f.devices.items()},
                             "status": d3.status(), "bundles_before": bundles_before,
                             "bundles_after": d3.bundles(), "repo_before": repo_before,
                             "repo_after": sorted(os.listdir(d3.repo)) if d3.repo.is_dir() else [],
                             "logs": {n: f.server.device_log(n) for n in DEVICES},
                             "key_lists": {n: (d.ota_root / "key-list.json").exists()
                                           for n, d in f.devices.items()},
                             "robot_before": robot_before}
        n_ok = d3.robot().get("ok_applied", 0)
        f.wait_for(f"{LAGGING}'s robot to receive more ok actions after the refusal",
                   lambda: d3.robot().get("ok_applied", 0) > n_ok + 5)
        f.seen["new-key"]["robot_after"] = d3.robot()

        # Phase 4a: a corrupt download: the server's copy of 1.4.0 damaged after upload.
        d2 = f.devices["dev-2"]
        before = {"current": d2.current(), "bundles": d2.bundles(), "repo": sorted(os.listdir(d2.repo))}
        agent_from = len(d2.log("agent"))
        art = [p for p in (server_dir / "artifacts").rglob("*") if p.is_file() and p.name == "corrupt.raucb"]
        assert len(art) == 1, f"the uploaded 1.3.0 artifact in {server_dir / 'artifacts'}: {art}"
        data = bytearray(art[0].read_bytes())
        data[len(data) // 2] ^= 0xFF
        art[0].write_bytes(bytes(data))
        f.server.patch_devices(["dev-2"], software=str(sw["corrupt"]))
        f.wait_for("dev-2 in state Error", lambda: f.server.devices()["dev-2"]["last_state"] == "Error")
        # The agent tells the server before it logs the failure: wait for its line too.
        f.wait_for("dev-2's agent to log the refused download",
                   lambda: "checksum does not match after" in d2.log("agent")[agent_from:])
        f.seen["corrupt"] = {"before": before, "after": {"current": d2.current(), "bundles": d2.bundles(),
                                                         "repo": sorted(os.listdir(d2.repo))},
                             "device": f.server.devices()["dev-2"], "log": f.server.device_log("dev-2"),
                             "agent": d2.log("agent")[agent_from:], "daemon_alive": d2.alive("daemon")}

        # Phase 4d: a rollback: the server (compromised, or anyone on its path) sends dev-4,
        # which committed 1.1.0, the older signed 1.0.0. vlad's version floor refuses it in
        # RAUC's post-install handler; the device stays on 1.1.0 and keeps driving.
        d4 = f.devices["dev-4"]
        before4 = {"current": d4.current(), "bundles": d4.bundles()}
        n_ok = d4.robot().get("ok_applied", 0)
        f.server.patch_devices(["dev-4"], software=str(sw["a"]), force_update=True)
        f.wait_for("dev-4 in state Error", lambda: f.server.devices()["dev-4"]["last_state"] == "Error")
        f.wait_for("dev-4's robot to receive more ok actions after the refused rollback",
                   lambda: d4.robot().get("ok_applied", 0) > n_ok + 5)
        f.seen["rollback"] = {"before": before4, "after": {"current": d4.current(), "bundles": d4.bundles()},
                              "device": f.server.devices()["dev-4"], "log": f.server.device_log("dev-4"),
                              "agent": d4.log("agent"), "status": d4.status(),
                              "daemon_alive": d4.alive("daemon")}

        # Phase 4e: an expired release (newer, signed, intact) sent to dev-4: refused by
        # RAUC's pre-install check (vlad bundle verify), dev-4 stays on 1.1.0 and drives.
        n_ok = d4.robot().get("ok_applied", 0)
        agent_from = len(d4.log("agent"))
        f.server.patch_devices(["dev-4"], software=str(sw["expired"]), force_update=True)
        # dev-4 is in Error already (4d): the wait is for its agent to have tried again.
        f.wait_for("dev-4's agent to try the expired release and fail",
                   lambda: "deployment finished: install exit status" in d4.log("agent")[agent_from:]
                   and f.server.devices()["dev-4"]["last_state"] == "Error")
        f.wait_for("dev-4's robot to receive more ok actions after the refused expired release",
                   lambda: d4.robot().get("ok_applied", 0) > n_ok + 5)
        f.seen["expired"] = {"after": {"current": d4.current(), "bundles": d4.bundles()},
                             "agent": d4.log("agent")[agent_from:],
                             "device": f.server.devices()["dev-4"], "daemon_alive": d4.alive("daemon")}

        # Phase 4b/c: dev-3's agent with a refused token, then with an unreachable server.
        d3 = f.devices["dev-3"]
        d3.stop("agent")
        before3 = {"current": d3.current(), "bundles": d3.bundles()}
        wrong = d3.root / "wrong-token"
        wrong.write_text("not-the-device-token\n")
        f.server.patch_devices(["dev-3"], software=str(sw["good"]), force_update=True)
        d3.start_agent(f"127.0.0.1:{port}", wrong, "1.1.0", key="agent-token", tls=agent_tls(pki, "dev-3"))
        f.wait_for("dev-3's refused-token line", lambda: "401" in d3.log("agent-token"),
                   keys=("daemon", "robot", "agent-token"))
        d3.stop("agent-token")
        closed = free_port()
        d3.start_agent(f"127.0.0.1:{closed}", tokens["dev-3"], "1.1.0", key="agent-unreachable",
                       tls=agent_tls(pki, "dev-3"))
        f.wait_for("dev-3's unreachable-server line", lambda: "Cannot connect" in d3.log("agent-unreachable"),
                   keys=("daemon", "robot", "agent-unreachable"))
        d3.stop("agent-unreachable")
        f.seen["refused"] = {"before": before3, "after": {"current": d3.current(), "bundles": d3.bundles()},
                             "token_log": d3.log("agent-token"), "unreachable_log": d3.log("agent-unreachable"),
                             "daemon_alive": d3.alive("daemon"), "device": f.server.devices()["dev-3"]}

        # Phase 5a: an impostor whose certificate comes from another CA, which the agent's
        # process would trust if it read the default store (SSL_CERT_FILE names that CA):
        # refused in the handshake, one line, no request reaches the impostor.
        impostor = Impostor(pki["impostor"], pki["impostor-key"])
        try:
            d3.start_agent(f"127.0.0.1:{impostor.port}", tokens["dev-3"], "1.1.0", key="agent-impostor",
                           tls=agent_tls(pki, "dev-3"), env={**d3.env, "SSL_CERT_FILE": str(pki["other-ca"])})
            f.wait_for("dev-3's refused-certificate line",
                       lambda: "CERTIFICATE_VERIFY_FAILED" in d3.log("agent-impostor"),
                       keys=("daemon", "robot", "agent-impostor"))
            d3.stop("agent-impostor")
        finally:
            impostor.close()
        f.seen["impostor"] = {"log": d3.log("agent-impostor"), "requests": impostor.requests,
                              "after": {"current": d3.current(), "bundles": d3.bundles()}}

        # Phase 5b: a server the agent trusts (the fleet's certificate: a compromised server)
        # streams an endless artifact that advertised 1 KiB. The agent writes into a small
        # tmpfs of its own: once past its --max-download it stops; with a limit above the
        # tmpfs, the full filesystem stops it. Each time the failure is reported, the partial
        # file removed, nothing installed, and dev-3 keeps driving.
        mnt = d3.root / "download-tmpfs"
        mnt.mkdir()
        n_ok = d3.robot().get("ok_applied", 0)
        endless = {}
        for key, size, limit in (("agent-endless", "8m", 1 << 20), ("agent-full", "2m", 64 << 20)):
            wrap = private_tmpfs(mnt, size)
            if wrap is None:
                f.seen["endless"] = None
                break
            impostor = Impostor(pki["server"], pki["server-key"])
            try:
                d3.start_agent(f"127.0.0.1:{impostor.port}", tokens["dev-3"], "1.1.0", key=key,
                               tls=agent_tls(pki, "dev-3"), download=mnt / "bundle.raucb",
                               max_download=limit, wrap=wrap)
                f.wait_for(f"dev-3's {key} to report the refused download",
                           lambda: impostor.feedback and "Download refused" in d3.log(key),
                           keys=("daemon", "robot", key))
                d3.stop(key)
            finally:
                impostor.close()
            endless[key] = {"log": d3.log(key), "feedback": impostor.feedback, "streamed": impostor.streamed,
                            "limit": limit}
        else:
            f.wait_for("dev-3's robot to receive more ok actions after the endless downloads",
                       lambda: d3.robot().get("ok_applied", 0) > n_ok + 5)
            f.seen["endless"] = {**endless, "after": {"current": d3.current(), "bundles": d3.bundles()},
                                 "host_dir": sorted(os.listdir(mnt)), "daemon_alive": d3.alive("daemon"),
                                 "before": before3}

        f.seen["daemons_alive"] = {n: d.alive("daemon") for n, d in f.devices.items()}
        tls_curl = ["--cacert", pki["fleet-ca"], "--cert", pki["operator"], "--key", pki["operator-key"]]
        f.seen["setup"] = subprocess.run(["curl", "-s", *tls_curl, "-o", "/dev/null", "-w", "%{http_code}",
                                          "-X", "POST", "-d", "username=x@y.z&password=p", f"{url}/setup"],
                                         capture_output=True, text=True).stdout
        # Without a client certificate the handshake fails: no HTTP status at all.
        no_cert = subprocess.run(["curl", "-s", "--cacert", pki["fleet-ca"], "-o", "/dev/null", "-w",
                                  "%{http_code}", f"{url}/api/v1/devices"], capture_output=True, text=True)
        f.seen["no_client_cert"] = {"rc": no_cert.returncode, "status": no_cert.stdout}
        f.seen["total_seconds"] = time.monotonic() - f.start
        log(f"scenario done in {f.seen['total_seconds']:.0f} s")
        yield f
    finally:
        f.close()
        signal.signal(signal.SIGTERM, previous)
        summary = {k: v for k, v in f.seen.items() if k in ("total_seconds",)}
        for k in ("good", "gate-fails", "new-key"):
            if k in f.seen:
                summary[f"{k}_seconds"] = round(f.seen[k]["seconds"], 1)
        (OUT / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        # What the server showed at each phase, for the operator's documentation and for
        # a failure's post-mortem.
        (OUT / "seen.json").write_text(json.dumps(f.seen, indent=2, default=lambda o: getattr(o, "__dict__", str(o)))
                                       + "\n")


def metric(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    raise AssertionError(f"no {name} in the metrics textfile:\n{text[-2000:]}")


def one_line_with(log_text: str, needle: str) -> str:
    lines = [ln for ln in log_text.splitlines() if needle in ln]
    assert lines, f"no line with {needle!r} in:\n{log_text[-3000:]}"
    return lines[0]


def test_good_policy_rolls_out_group_by_group(fleet):
    s = fleet.seen["good"]
    res = s["result"]
    assert not res.stopped, res.reason
    assert [(g.feed, g.success, g.failure) for g in res.groups] == [("canary", 1, 0), ("wave-1", 2, 0),
                                                                    ("wave-2", 1, 0)]
    for g in res.groups:
        r = s["rollouts"][g.rollout_id]
        # goosebit's own counters can lose an increment when two devices of a group report
        # at once (vla_fleet.rollout's doc): never more than the devices did, no failure.
        assert (r["success_count"], r["failure_count"]) == (g.server_success, g.server_failure), r
        assert 1 <= r["success_count"] <= g.size and r["failure_count"] == 0, r
    good = fleet.bundles["good"]
    for name in DEVICES:
        dev = s["devices"][name]
        assert dev["last_state"] == "Finished" and dev["sw_version"] == "1.1.0", dev
        assert s["current"][name] == good["hash"], f"{name} runs {s['current'][name]}, not 1.1.0"
        assert f"{good['hash']} passed" in s["logs"][name], s["logs"][name]


def test_gate_failure_in_the_canary_stops_the_rollout(fleet):
    s = fleet.seen["gate-fails"]
    res = s["result"]
    assert res.stopped and [g.feed for g in res.groups] == ["canary"], res
    canary = s["rollouts"][res.groups[0].rollout_id]
    assert (canary["success_count"], canary["failure_count"], canary["paused"]) == (0, 1, True), canary
    # No rollout of 1.2.0 was started for the later groups.
    assert not [r for r in s["rollouts"].values() if r["name"].startswith("policy 1.2.0 wave")], s["rollouts"]
    good, bad = fleet.bundles["good"], fleet.bundles["gate-fails"]
    dev1 = s["devices"]["dev-1"]
    assert dev1["last_state"] == "Error" and dev1["sw_version"] == "1.1.0", dev1
    assert f"rolled {bad['hash']} back to {good['hash']}" in s["logs"]["dev-1"], s["logs"]["dev-1"]
    for name in ("dev-2", "dev-3", "dev-4"):
        assert s["devices"][name]["last_state"] == "Finished" and s["devices"][name]["sw_version"] == "1.1.0"
    # What the devices did: dev-1 back on 1.1.0 (its store names the rollback), the others untouched.
    assert s["current"] == {n: good["hash"] for n in DEVICES}, s["current"]
    assert bad["hash"][:12] in s["status"] and "last rollback" in s["status"], s["status"]
    after, before = s["robot_after"], s["robot_before"]
    assert after.get("ok_applied", 0) > before.get("ok_applied", 0), (before, after)
    # The metrics textfile: ok actions still counted after the rollback, no failed inference.
    ok = [metric(m, 'vlad_published_actions_total{status="ok"}') for m in (s["metrics"], s["metrics_after"])]
    assert ok[1] > ok[0], ok
    assert metric(s["metrics_after"], "vlad_inference_failures_total") == 0


def test_one_device_failing_in_a_wave_stops_the_rollout_at_the_threshold(fleet):
    """dev-3 fails 1.3.0 at vlad's signature verification (it lags the key rotation), not
    at the parity gate: the same artifact that dev-1 and dev-2 install and gate, the key
    list in it rotating them to the new key."""
    s = fleet.seen["new-key"]
    res = s["result"]
    # The procedure's view, and the server's own counters for each group it started.
    assert res.stopped and [(g.feed, g.success, g.failure) for g in res.groups] == [
        ("canary", 1, 0), ("wave-1", 1, 1)], res
    assert "1 of 3 devices failed" in res.reason, res.reason
    canary, wave1 = (s["rollouts"][g.rollout_id] for g in res.groups)
    assert (canary["success_count"], canary["failure_count"], canary["paused"]) == (1, 0, False), canary
    # wave-1's two devices may report at the same moment, when goosebit can lose one of the
    # two increments (vla_fleet.rollout's doc): never more than the devices did, and at least
    # one; the devices' own states on the server (below) are exact.
    assert wave1["paused"] and 1 <= wave1["success_count"] + wave1["failure_count"], wave1
    assert wave1["success_count"] <= 1 and wave1["failure_count"] <= 1, wave1
    assert not [r for r in s["rollouts"].values() if r["name"] == "policy 1.3.0 wave-2"], s["rollouts"]
    # Each device's state and version on the server equal what the device runs.
    good, new = fleet.bundles["good"], fleet.bundles["new-key"]
    expect = {"dev-1": ("Finished", "1.3.0", new), "dev-2": ("Finished", "1.3.0", new),
              "dev-3": ("Error", "1.1.0", good), "dev-4": ("Finished", "1.1.0", good)}
    for name, (state, version, bundle) in expect.items():
        dev = s["devices"][name]
        assert (dev["last_state"], dev["sw_version"]) == (state, version), (name, dev)
        assert s["current"][name] == bundle["hash"], f"{name} runs {s['current'][name]}, expected {version}"
    for name in ("dev-1", "dev-2"):
        assert f"{new['hash']} passed" in s["logs"][name], s["logs"][name]
    # The rotation came with the release: the devices that took it keep its key list.
    assert s["key_lists"] == {"dev-1": True, "dev-2": True, "dev-3": False, "dev-4": False}, s["key_lists"]
    # dev-3: refused by vlad bundle verify in the pre-install handler, nothing written.
    log3 = s["logs"][LAGGING]
    assert "does not verify against any of the 1 trusted key(s)" in log3, log3
    assert "pre-install handler failed" in log3 and "nothing installed" in log3, log3
    assert s["bundles_after"] == s["bundles_before"], (s["bundles_before"], s["bundles_after"])
    assert s["repo_after"] == s["repo_before"], (s["repo_before"], s["repo_after"])
    assert new["hash"] not in s["bundles_after"]
    assert good["hash"][:12] in s["status"], s["status"]
    assert new["hash"][:12] not in s["status"], s["status"]
    # dev-3 still drives its robot.
    assert s["robot_after"].get("ok_applied", 0) > s["robot_before"].get("ok_applied", 0) + 5


def test_corrupt_download_is_refused_before_anything_is_written(fleet):
    s = fleet.seen["corrupt"]
    assert s["device"]["last_state"] == "Error", s["device"]
    line = one_line_with(s["agent"], "checksum does not match after")
    assert "Artifact" in line
    assert "checksum does not match" in s["log"], s["log"]
    assert s["after"] == s["before"], (s["before"], s["after"])
    assert "rauc-standin" not in s["agent"], "the install ran on a corrupt download"
    assert s["daemon_alive"]


def test_an_older_signed_policy_is_refused_as_a_rollback(fleet):
    s = fleet.seen["rollback"]
    good = fleet.bundles["good"]["hash"]
    assert s["before"]["current"] == good, s["before"]
    assert s["device"]["last_state"] == "Error", s["device"]
    # Refused for being a rollback (RAUC's pre-install check), not for anything else.
    assert "version floor 1.1.0" in s["agent"], s["agent"][-2000:]
    assert s["after"]["current"] == good, s["after"]
    assert "version floor" in s["status"] and "1.1.0" in s["status"], s["status"]
    assert s["daemon_alive"]


def test_an_expired_release_is_refused(fleet):
    s = fleet.seen["expired"]
    assert s["device"]["last_state"] == "Error", s["device"]
    assert "signed expiry" in s["agent"] and "has passed" in s["agent"], s["agent"][-2000:]
    assert s["after"]["current"] == fleet.bundles["good"]["hash"], s["after"]
    assert fleet.bundles["expired"]["hash"] not in s["after"]["bundles"], "the expired release was installed"
    assert s["daemon_alive"]


def test_refused_token_and_unreachable_server_are_one_line_each(fleet):
    s = fleet.seen["refused"]
    line = one_line_with(s["token_log"], "401")
    assert "Polling failed" in line, line
    line = one_line_with(s["unreachable_log"], "Cannot connect")
    assert "Polling failed" in line and "127.0.0.1" in line, line
    assert s["after"] == s["before"] and s["daemon_alive"]
    assert "Traceback" not in s["token_log"] + s["unreachable_log"]


def test_login_tokens_expire(fleet):
    s = fleet.seen["session"]
    assert s["claims"]["exp"] - s["claims"]["iat"] == SESSION_S, s["claims"]
    assert s["claims"]["exp"] > time.time()
    for name in ("expired", "no-expiry"):
        assert "HTTP 401" in s["refused"][name], (name, s["refused"][name])


def test_an_impostor_server_certificate_is_refused_in_one_line(fleet):
    """The agent trusts the pinned fleet CA alone: a server certificate from another CA is
    refused although the process's default store (SSL_CERT_FILE) holds that CA."""
    s = fleet.seen["impostor"]
    line = one_line_with(s["log"], "CERTIFICATE_VERIFY_FAILED")
    assert "Polling failed" in line and "127.0.0.1" in line, line
    assert "Traceback" not in s["log"], s["log"][-2000:]
    assert s["requests"] == [], s["requests"]
    assert "Starting bundle download" not in s["log"]
    assert s["after"] == fleet.seen["refused"]["before"], s["after"]


def test_a_client_without_a_certificate_is_refused_by_the_server(fleet):
    s = fleet.seen["no_client_cert"]
    # curl: 0 would be an HTTP answer; the handshake (or the first read) fails instead.
    assert s["rc"] != 0 and s["status"] == "000", s


def test_an_endless_download_stops_at_the_limit_or_a_full_tmpfs_and_installs_nothing(fleet):
    s = fleet.seen["endless"]
    if s is None:
        cannot_run("no private mount namespace with a tmpfs (unshare --mount)")
    for key, needle in (("agent-endless", "passed the limit of 1048576 bytes"),
                        ("agent-full", "No space left on device")):
        r = s[key]
        line = one_line_with(r["log"], "Download refused")
        assert needle in line, line
        assert "Traceback" not in r["log"] and "Starting installation" not in r["log"], r["log"][-2000:]
        # Reported to the server: the deployment closed as failed, with the reason.
        fb = r["feedback"][0]
        assert fb["status"]["execution"] == "closed" and fb["status"]["result"]["finished"] == "failure", fb
        assert needle in " ".join(fb["status"]["details"]), fb
    # The server streamed past the limit: the agent stopped reading, not the server sending.
    assert s["agent-endless"]["streamed"] > 1 << 20
    assert s["after"] == s["before"], (s["before"], s["after"])
    assert s["host_dir"] == [], "the download reached the device's own filesystem"
    assert s["daemon_alive"]


def test_daemons_ran_throughout_and_setup_is_unreachable(fleet):
    assert fleet.seen["daemons_alive"] == {n: True for n in DEVICES}
    assert fleet.seen["setup"] == "404"
