"""The update server: goosebit's settings, database and admin for one server directory,
and the command that serves it on 127.0.0.1 only.

    python -m vla_fleet.server init DIR --admin NAME --password-file F
    python -m vla_fleet.server serve DIR --port N \
        [--tls-cert SERVER.pem --tls-key SERVER.key [--client-ca FLEET-CA.pem]]

`init` is idempotent. It writes DIR/goosebit.yaml (SQLite database, artifacts directory,
a 2 s poll time, login tokens accepted for `--session-lifetime` seconds (8 h; vla_fleet.asgi),
device tokens required: `device_auth` mode `strict`, every device is
created with its token through the API before it may poll) and DIR/pyproject.toml (the
aerich configuration the wheel does not ship), creates the database with `aerich upgrade`
and the admin user without going through `/setup`. `serve` runs uvicorn with
`vla_fleet.asgi:app` (goosebit, `/setup` answered 404) bound to 127.0.0.1, over HTTPS with
`--tls-cert/--tls-key`; with `--client-ca` every connection must present a client
certificate issued by that CA (devices and operators alike), checked in the TLS handshake
before goosebit sees a request."""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import ssl
import subprocess
import sys
from pathlib import Path


def settings_env(directory: Path) -> dict[str, str]:
    """The environment goosebit reads its settings from (GOOSEBIT_SETTINGS)."""
    return {**os.environ, "GOOSEBIT_SETTINGS": str(directory / "goosebit.yaml")}


def write_settings(directory: Path, poll_time: str, session_lifetime_s: int = 8 * 3600) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    key_file = directory / "secret_key"
    if not key_file.exists():
        key_file.write_text(secrets.token_urlsafe(32) + "\n")
        key_file.chmod(0o600)
    # It holds the secret key that signs the login tokens: only the server's user reads it.
    settings = directory / "goosebit.yaml"
    fd = os.open(settings, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)  # an existing file keeps its mode through O_CREAT
    with os.fdopen(fd, "w") as out:
        out.write(
            f"db_uri: sqlite:///{directory / 'db.sqlite3'}\n"
            f"artifacts_dir: {directory / 'artifacts'}\n"
            f"secret_key: {key_file.read_text().strip()}\n"
            f'poll_time: "{poll_time}"\n'
            # Read by vla_fleet.asgi (goosebit ignores keys it does not know): how long a
            # login token (API bearer token, web UI session) is accepted.
            f"session_lifetime_s: {session_lifetime_s}\n"
            "device_auth:\n  enable: true\n  mode: strict\n")
    import goosebit.db  # noqa: F401  (the migrations ship inside the package)
    migrations = Path(sys.modules["goosebit.db"].__file__).parent / "migrations"
    (directory / "pyproject.toml").write_text(
        "[tool.aerich]\n"
        'tortoise_orm = "goosebit.db.config.TORTOISE_CONF"\n'
        f'location = "{migrations}"\n'
        'src_folder = "./."\n')


async def create_admin(name: str, password: str) -> bool:
    from goosebit import db
    from goosebit.db.models import User
    from goosebit.users import create_initial_user
    from goosebit.settings.const import PWD_CXT as hasher

    await db.init()
    try:
        if await User.get_or_none(username=name) is not None:
            return False
        await create_initial_user(name, hasher.hash(password))
        return True
    finally:
        await db.close()


def init(directory: Path, admin: str, password: str, poll_time: str, session_lifetime_s: int) -> None:
    if "GOOSEBIT_SETTINGS" not in os.environ:
        # goosebit reads its settings when first imported: re-run with them in place.
        write_settings(directory, poll_time, session_lifetime_s)
        raise SystemExit(subprocess.run([sys.executable, *sys.argv], env=settings_env(directory)).returncode)
    write_settings(directory, poll_time, session_lifetime_s)
    aerich = Path(sys.executable).parent / "aerich"
    p = subprocess.run([str(aerich), "upgrade"], cwd=directory, capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit(f"vla_fleet.server: aerich upgrade in {directory} failed: "
                         f"{(p.stdout + p.stderr).strip().splitlines()[-1:]}")
    made = asyncio.run(create_admin(admin, password))
    print(f"vla_fleet.server: {directory} ready, admin {admin} {'created' if made else 'exists'}")


def serve(directory: Path, port: int, tls_cert: Path | None = None, tls_key: Path | None = None,
          client_ca: Path | None = None) -> None:
    tls: list[str] = []
    if tls_cert is not None:
        tls = ["--ssl-certfile", str(tls_cert), "--ssl-keyfile", str(tls_key)]
    if client_ca is not None:
        # ssl.CERT_REQUIRED: a handshake without a certificate from this CA fails.
        tls += ["--ssl-ca-certs", str(client_ca), "--ssl-cert-reqs", str(int(ssl.CERT_REQUIRED))]
    os.chdir(directory)
    os.execve(str(Path(sys.executable).parent / "uvicorn"),
              ["uvicorn", "vla_fleet.asgi:app", "--host", "127.0.0.1", "--port", str(port), *tls,
               # Longer than the client's pauses between feedbacks during an install (the
               # gate): with uvicorn's 5 s the client's pooled connection is closed under
               # it and the next feedback fails with "Server disconnected".
               "--timeout-keep-alive", "300", "--no-access-log"],
              settings_env(directory))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    i = sub.add_parser("init")
    i.add_argument("dir", type=Path)
    i.add_argument("--admin", required=True)
    i.add_argument("--password-file", type=Path, required=True)
    i.add_argument("--poll-time", default="00:00:02")
    i.add_argument("--session-lifetime", type=int, default=8 * 3600, metavar="SECONDS",
                   help="how long a login token is accepted (default 8 h)")
    s = sub.add_parser("serve")
    s.add_argument("dir", type=Path)
    s.add_argument("--port", type=int, required=True)
    s.add_argument("--tls-cert", type=Path, help="the server's certificate chain (PEM): HTTPS")
    s.add_argument("--tls-key", type=Path, help="its private key (PEM)")
    s.add_argument("--client-ca", type=Path, help="require client certificates issued by this CA")
    a = ap.parse_args()
    if a.cmd == "serve" and ((a.tls_cert is None) != (a.tls_key is None)
                             or (a.client_ca is not None and a.tls_cert is None)):
        ap.error("--tls-cert and --tls-key go together; --client-ca needs them")
    if a.cmd == "init":
        init(a.dir.resolve(), a.admin, a.password_file.read_text().strip(), a.poll_time,
             a.session_lifetime)
    else:
        serve(a.dir.resolve(), a.port, *(p.resolve() if p else None for p in (a.tls_cert, a.tls_key, a.client_ca)))


if __name__ == "__main__":
    main()
