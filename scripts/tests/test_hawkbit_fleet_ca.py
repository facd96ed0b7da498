"""The mechanism of the image agent's fleet-CA pin (meta-vla's rauc-hawkbit-updater
drop-in): rauc-hawkbit-updater has no CA-file option, so libcurl verifies the update
server against its compiled-in bundle, `/etc/ssl/certs/ca-certificates.crt` in oe-core's
curl recipe; the drop-in's `BindReadOnlyPaths=` mounts the directory holding the fleet's
CA over `/etc/ssl/certs`. Here the same bind, taken from the drop-in, is made in a private
mount namespace and this machine's curl (whose compiled-in bundle must be that same path,
read from `curl -v`) reaches a server certified by the fleet's CA and refuses one
certified by another CA, which the machine's own store would not know either way.

This checks the bind and curl's trust, not systemd's handling of the line nor the real
rauc-hawkbit-updater (neither runs here)."""

import http.server
import os
import re
import shutil
import ssl
import subprocess
import threading
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
# oe-core's curl recipe: --with-ca-bundle=${sysconfdir}/ssl/certs/ca-certificates.crt
OE_CORE_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
DROPIN = (REPO / "meta-vla/dynamic-layers/rauc/recipes-support/rauc-hawkbit-updater/files"
          / "vla-hawkbit.service.conf")


def cannot_run(what: str) -> None:
    if os.environ.get("VLA_REQUIRE_ALL_TESTS") == "1":
        pytest.fail(f"cannot run here: {what} (VLA_REQUIRE_ALL_TESTS=1)")
    pytest.skip(f"cannot run here: {what}")


def bind() -> tuple[str, str]:
    """The drop-in's BindReadOnlyPaths= source and destination."""
    lines = [ln for ln in DROPIN.read_text().splitlines() if ln.startswith("BindReadOnlyPaths=")]
    assert len(lines) == 1, lines
    source, destination = lines[0].split("=", 1)[1].split(":")
    return source, destination


def pki(tmp: Path, name: str) -> tuple[Path, Path, Path]:
    """A CA and a server certificate for 127.0.0.1 it issued: (ca, cert, key)."""
    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True, cwd=tmp)
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"]
    run("req", "-x509", *ec, "-keyout", f"{name}-ca.key", "-out", f"{name}-ca.pem", "-days", "1",
        "-subj", f"/CN={name} CA")
    run("req", *ec, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", "/CN=127.0.0.1")
    (tmp / "san.ext").write_text("subjectAltName=IP:127.0.0.1\n")
    run("x509", "-req", "-in", f"{name}.csr", "-CA", f"{name}-ca.pem", "-CAkey", f"{name}-ca.key",
        "-CAcreateserial", "-out", f"{name}.pem", "-days", "1", "-extfile", "san.ext")
    return tmp / f"{name}-ca.pem", tmp / f"{name}.pem", tmp / f"{name}.key"


class Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass


def serve(cert: Path, key: Path) -> http.server.HTTPServer:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Quiet)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def test_behind_the_bind_curl_trusts_the_fleet_ca_alone(tmp_path):
    for tool in ("curl", "openssl", "unshare"):
        if shutil.which(tool) is None:
            cannot_run(f"{tool} is not installed")
    source, destination = bind()
    assert Path(destination) == OE_CORE_BUNDLE.parent, \
        f"the drop-in binds over {destination}, the image's curl reads {OE_CORE_BUNDLE}"
    fleet_ca, fleet_cert, fleet_key = pki(tmp_path, "fleet")
    _, other_cert, other_key = pki(tmp_path, "other")
    fleet, other = serve(fleet_cert, fleet_key), serve(other_cert, other_key)
    try:
        url = lambda s: f"https://127.0.0.1:{s.server_address[1]}/"  # noqa: E731
        probe = subprocess.run(["curl", "-v", "-o", "/dev/null", url(fleet)],
                               capture_output=True, text=True, timeout=30)
        cafile = re.search(r"CAfile: (\S+)", probe.stderr)
        if cafile is None or Path(cafile.group(1)) != OE_CORE_BUNDLE:
            cannot_run(f"this curl's compiled-in bundle is not {OE_CORE_BUNDLE} "
                       f"({cafile.group(1) if cafile else 'not shown by curl -v'})")
        assert probe.returncode == 60, "the fleet's CA is in this machine's store: nothing to show"
        # The installed file: the directory the drop-in binds holds the CA as curl's name.
        store = tmp_path / Path(source).name
        store.mkdir()
        shutil.copy(fleet_ca, store / OE_CORE_BUNDLE.name)
        script = (f"mount --bind -o ro {store} {destination} || exit 90; "
                  f"curl -sS -o /dev/null {url(fleet)}; echo fleet=$?; "
                  f"curl -sS -o /dev/null {url(other)}; echo other=$?")
        mount_ns = ["unshare", "--mount", "--propagation", "private"]
        if os.geteuid() != 0:
            mount_ns = ["unshare", "--user", "--map-root-user", "--mount", "--propagation", "private"]
        run = subprocess.run([*mount_ns, "sh", "-c", script], capture_output=True, text=True,
                             timeout=60)
        if run.returncode == 90 or "fleet=" not in run.stdout:
            cannot_run(f"no private mount namespace with a bind mount: {run.stderr.strip()}")
        assert "fleet=0" in run.stdout, run.stdout + run.stderr
        assert "other=60" in run.stdout, run.stdout + run.stderr
    finally:
        fleet.shutdown()
        other.shutdown()
