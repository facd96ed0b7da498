"""meta-vla's rauc-hawkbit-updater configuration (dynamic-layers/rauc/recipes-support/
rauc-hawkbit-updater): the script the service runs before the agent
(vla-hawkbit-config) joins the image's shared settings with the device's provisioned
identity into the file the agent reads. Checked: the result has every key
rauc-hawkbit-updater 1.4's config parser requires (src/config-file.c: hawkbit_server,
target_name, one token, bundle_download_location unless streaming, a [device] group with
a key) with the image's choices (HTTPS verified, downloads on the data partition, no
reboot), the target's own token (the tenant-wide gateway token refused) and, when
provisioned, the device's client certificate (ssl_cert/ssl_key); each bad input fails in one line naming the variable and the file, never
printing a token, and leaves the previous configuration as it was."""

import configparser
import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
FILES = REPO / "meta-vla/dynamic-layers/rauc/recipes-support/rauc-hawkbit-updater/files"
SCRIPT = FILES / "vla-hawkbit-config"
DATA_DIR = "/var/lib/rauc-hawkbit-updater"  # VLA_HAWKBIT_DIR's default (the bbappend)
TOKEN = "cb115a721af28f781b493fa467819ef5"
GOOD = {"HAWKBIT_SERVER": "fleet.example.com:8443", "HAWKBIT_TENANT": "DEFAULT",
        "HAWKBIT_TARGET": "robot-0042", "HAWKBIT_AUTH_TOKEN": TOKEN}


@pytest.fixture
def template(tmp_path) -> Path:
    """The image's config.conf as the bbappend installs it."""
    path = tmp_path / "config.conf"
    path.write_text((FILES / "vla-hawkbit.conf").read_text().replace("@VLA_HAWKBIT_DIR@", DATA_DIR))
    return path


def run(tmp_path: Path, template: Path, device: dict) -> tuple[subprocess.CompletedProcess, Path]:
    out = tmp_path / "run" / "config.conf"
    out.parent.mkdir(exist_ok=True)
    env = {"PATH": os.environ["PATH"], **device}
    p = subprocess.run([SCRIPT, tmp_path / "device.env", template, out], env=env,
                       capture_output=True, text=True)
    return p, out


def key_file(path: Path) -> configparser.ConfigParser:
    # GKeyFile's syntax for what the image writes: groups, `key = value`, # comments.
    c = configparser.ConfigParser(interpolation=None, delimiters=("=",), comment_prefixes=("#",),
                                  strict=True)
    c.read_string(path.read_text())
    return c


def test_the_agent_gets_the_image_settings_and_the_device_identity(tmp_path, template):
    p, out = run(tmp_path, template, GOOD)
    assert p.returncode == 0, p.stderr
    assert TOKEN not in p.stdout + p.stderr
    assert "robot-0042" in p.stdout and "https://fleet.example.com:8443" in p.stdout
    assert (out.stat().st_mode & 0o777) == 0o600
    c = key_file(out)
    client = c["client"]
    assert client["hawkbit_server"] == "fleet.example.com:8443"
    assert client["tenant_id"] == "DEFAULT"
    assert client["target_name"] == "robot-0042"
    assert client["auth_token"] == TOKEN and "gateway_token" not in client
    assert client["ssl"] == "true" and client["ssl_verify"] == "true"
    assert client["bundle_download_location"] == f"{DATA_DIR}/download/bundle.raucb"
    assert client["post_update_reboot"] == "false"
    assert "stream_bundle" not in client
    assert len(c["device"]) >= 1
    assert not list(tmp_path.glob("run/*.tmp.*"))


def test_the_tenant_wide_gateway_token_is_refused(tmp_path, template):
    device = {k: v for k, v in GOOD.items() if k != "HAWKBIT_AUTH_TOKEN"}
    device["HAWKBIT_GATEWAY_TOKEN"] = TOKEN
    p, out = run(tmp_path, template, device)
    assert p.returncode == 1 and not out.exists()
    line = p.stderr.strip()
    assert "\n" not in line and "HAWKBIT_GATEWAY_TOKEN" in line and "act as every other" in line, line
    assert TOKEN not in line


@pytest.fixture
def client_cert(tmp_path) -> dict[str, str]:
    """A provisioned client certificate and key (contents do not matter to the script)."""
    cert, key = tmp_path / "device.pem", tmp_path / "device.key"
    cert.write_text("certificate\n")
    key.write_text("key\n")
    cert.chmod(0o644)
    key.chmod(0o600)
    return {"HAWKBIT_SSL_CERT": str(cert), "HAWKBIT_SSL_KEY": str(key)}


def test_a_client_certificate_beside_the_token(tmp_path, template, client_cert):
    p, out = run(tmp_path, template, {**GOOD, **client_cert})
    assert p.returncode == 0, p.stderr
    client = key_file(out)["client"]
    assert client["ssl_cert"] == client_cert["HAWKBIT_SSL_CERT"]
    assert client["ssl_key"] == client_cert["HAWKBIT_SSL_KEY"]
    assert client["auth_token"] == TOKEN and client["ssl_verify"] == "true"
    assert "client certificate" in p.stdout


@pytest.mark.parametrize("change,message", [
    ({"HAWKBIT_SSL_KEY": None}, "HAWKBIT_SSL_KEY is not set"),
    ({"HAWKBIT_SSL_CERT": "device.pem"}, "an absolute path"),
    ({"HAWKBIT_SSL_CERT": "/nonexistent/device.pem"}, "no readable file there"),
    ({"mode": 0o640}, "readable by others than its owner"),
], ids=["key missing", "relative path", "no file", "key 0640"])
def test_a_bad_client_certificate_is_named(tmp_path, template, client_cert, change, message):
    if "mode" in change:
        Path(client_cert["HAWKBIT_SSL_KEY"]).chmod(change.pop("mode"))
    device = {k: v for k, v in {**GOOD, **client_cert, **change}.items() if v is not None}
    p, out = run(tmp_path, template, device)
    assert p.returncode == 1 and not out.exists()
    line = p.stderr.strip()
    assert "\n" not in line and message in line and "device.env" in line, line


def test_an_ipv6_server_with_a_port(tmp_path, template):
    p, out = run(tmp_path, template, {**GOOD, "HAWKBIT_SERVER": "[fd00::1]:8443"})
    assert p.returncode == 0, p.stderr
    assert key_file(out)["client"]["hawkbit_server"] == "[fd00::1]:8443"


BAD = [
    ({"HAWKBIT_SERVER": None}, "HAWKBIT_SERVER is not set"),
    ({"HAWKBIT_SERVER": "https://fleet.example.com"}, "without a scheme"),
    ({"HAWKBIT_SERVER": "fleet example.com"}, "HAWKBIT_SERVER=fleet example.com"),
    ({"HAWKBIT_SERVER": "fleet.example.com\nssl = false"}, "on one line"),
    ({"HAWKBIT_TENANT": None}, "HAWKBIT_TENANT is not set"),
    ({"HAWKBIT_TARGET": ""}, "HAWKBIT_TARGET is not set"),
    ({"HAWKBIT_TARGET": "robot 42"}, "HAWKBIT_TARGET=robot 42"),
    ({"HAWKBIT_AUTH_TOKEN": None}, "HAWKBIT_AUTH_TOKEN is not set"),
    ({"HAWKBIT_AUTH_TOKEN": "short"}, "HAWKBIT_AUTH_TOKEN (value not shown)"),
    ({"HAWKBIT_AUTH_TOKEN": TOKEN + "\npost_update_reboot = true"}, "HAWKBIT_AUTH_TOKEN (several lines"),
    ({"HAWKBIT_GATEWAY_TOKEN": TOKEN}, "the tenant-wide gateway token"),
]


@pytest.mark.parametrize("change,message", BAD, ids=[m for _, m in BAD])
def test_bad_provisioning_is_named_and_keeps_the_previous_config(tmp_path, template, change, message):
    p, out = run(tmp_path, template, GOOD)
    assert p.returncode == 0, p.stderr
    before = out.read_bytes()
    device = {k: v for k, v in {**GOOD, **change}.items() if v is not None}
    p, out = run(tmp_path, template, device)
    assert p.returncode == 1
    line = p.stderr.strip()
    assert "\n" not in line and message in line and "device.env" in line, line
    assert TOKEN not in line
    assert out.read_bytes() == before
    assert not list(tmp_path.glob("run/*.tmp.*"))


def test_an_image_that_bakes_in_an_identity_is_refused(tmp_path, template):
    template.write_text(template.read_text().replace("[client]\n", "[client]\nauth_token = abc\n", 1))
    p, out = run(tmp_path, template, GOOD)
    assert p.returncode == 1 and "sets auth_token" in p.stderr and not out.exists(), p.stderr
