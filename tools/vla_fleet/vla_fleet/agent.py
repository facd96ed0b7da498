"""The device's DDI agent: the RAUC project's own hawkBit client (rauc-hawkbit 0.2.0,
`RaucDBUSDDIClient`: polling, configData, deploymentBase, download, feedback) talking to
goosebit, with the three places where the 2020 client and goosebit 0.2.12 disagree adapted
at the client's HTTP boundary (`GoosebitDDIClient`), and RAUC's D-Bus `Install` replaced
by an install command whose output lines are fed to the client's own Progress / LastError /
Completed callbacks, as RAUC's service would emit them:

    python -m vla_fleet.agent --server 127.0.0.1:PORT --target dev-1 --token-file F \
        --ca FLEET-CA.pem [--cert DEVICE.pem --key DEVICE.key] --max-download BYTES \
        --compatible C --sw-version V --download DIR/update.raucb -- INSTALL-COMMAND...

With `--ca` it speaks HTTPS and trusts that CA alone (not the system's store), and with
`--cert/--key` it presents the device's client certificate. The download is refused while
it streams once it passes `--max-download` bytes (whatever size the server advertised), and
a full filesystem fails it the same way: the partial file is removed, the server is told
why, and nothing is installed.

The deployment's result is the install command's exit status: with vla_fleet.install (or
`rauc install`) and meta-vla's handlers, the daemon's parity-gate verdict. The client's
RAUC proxy needs a D-Bus system bus (DBUS_SYSTEM_BUS_ADDRESS; the tests start a private
one); nothing is called on it. Every log line is one line on stderr."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import logging
import os
import ssl
import sys
from pathlib import Path

import aiohttp
from rauc_hawkbit.ddi.client import APIError, DDIClient
from rauc_hawkbit.ddi.deployment_base import DeploymentStatusExecution, DeploymentStatusResult
from rauc_hawkbit.rauc_dbus_ddi_client import RaucDBUSDDIClient

# What a feedback call raises when the server is slow, restarting or refuses it.
FEEDBACK_ERRORS = (APIError, aiohttp.ClientError, asyncio.TimeoutError)


class DownloadRefused(Exception):
    """A download stopped before its end: larger than allowed, or the filesystem full."""


def tls_context(ca: Path, cert: Path | None, key: Path | None) -> ssl.SSLContext:
    """Verifies the server against the fleet's CA only: with `cafile` given, Python loads
    no default (system) certificates. Host names are checked as usual."""
    ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=str(ca))
    if cert is not None:
        ctx.load_cert_chain(str(cert), str(key))
    return ctx


class GoosebitDDIClient(DDIClient):
    """rauc-hawkbit's DDI client as goosebit needs it.

    1. goosebit's `deploymentBase` link has no `?c=<state>` part, which the client's
       regex requires: the action id is appended as the state (goosebit ignores it).
    2. goosebit gives an artifact's `sha1` only; the client compares the digest the
       download returns with `hashes.md5`: the sha1 is put in that slot and the download
       returns the file's sha1 (still a full check of the downloaded bytes).
    3. goosebit refuses (422) feedback whose `result.progress` is not `{cnt, of}`; the
       client sends `{}` or `{percentage}`: sent as `{cnt: percentage, of: 100}` or left out.
    """

    digest = "md5"
    # Bytes a download may take before it is refused (set by the agent's --max-download).
    max_download = 1 << 40

    async def get_resource(self, api_path, query_params={}, **kwargs):  # noqa: B006 (the base's signature)
        data = await super().get_resource(api_path, query_params, **kwargs)
        if not isinstance(data, dict):
            return data
        link = data.get("_links", {}).get("deploymentBase")
        if link and "?c=" not in link["href"]:
            link["href"] += "?c=" + link["href"].rstrip("/").rsplit("/", 1)[-1]
        for chunk in data.get("deployment", {}).get("chunks", []):
            for artifact in chunk.get("artifacts", []):
                hashes = artifact.get("hashes", {})
                if "md5" not in hashes and "sha1" in hashes:
                    hashes["md5"] = hashes["sha1"]
                    self.digest = "sha1"
        return data

    async def get_binary(self, url, dl_location, mime="application/octet-stream", timeout=3600):
        """The client's download, counted as it streams: more than `max_download` bytes (an
        endless or oversized answer, whatever the server advertised) or a full filesystem
        stops it and removes the partial file."""
        h = hashlib.new(self.digest)
        received = 0
        try:
            async with self.session.get(url, headers={"Accept": mime, **self.headers},
                                        timeout=aiohttp.ClientTimeout(timeout, sock_read=60)) as resp:
                await self.check_http_status(resp)
                # Unbuffered: a full filesystem fails the write that hits it, not a later close.
                with open(dl_location, "wb", buffering=0) as out:
                    async for block in resp.content.iter_chunked(1 << 16):
                        received += len(block)
                        if received > self.max_download:
                            raise DownloadRefused(f"download from {url} passed the limit of "
                                                  f"{self.max_download} bytes: stopped")
                        view = memoryview(block)
                        try:
                            while view:
                                view = view[out.write(view):]
                        except OSError as e:
                            raise DownloadRefused(f"download to {dl_location} failed after {received} "
                                                  f"bytes: {e.strerror}") from e
                        h.update(block)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.remove(dl_location)
            raise
        return h.hexdigest()

    async def post_resource(self, api_path, data, **kwargs):
        result = data.get("status", {}).get("result", {})
        progress = result.get("progress")
        if isinstance(progress, dict) and "cnt" not in progress:
            if "percentage" in progress:
                result["progress"] = {"cnt": int(progress["percentage"]), "of": 100}
            else:
                del result["progress"]
        return await super().post_resource(api_path, data, **kwargs)


class VladRaucClient(RaucDBUSDDIClient):
    """The RAUC client with `install` running a command instead of RAUC's D-Bus call."""

    def __init__(self, *args, install_command: list[str], max_download: int, **kwargs):
        super().__init__(*args, **kwargs)
        ddi = self.ddi
        # 60 s per request instead of the client's 10: a feedback lost to a slow server
        # leaves the deployment Running on the server for good.
        self.ddi = GoosebitDDIClient(ddi.session, ddi.host, ddi.ssl, ddi.headers["Authorization"].split(" ", 1)[1],
                                     ddi.tenant, ddi.controller_id, timeout=60)
        self.ddi.max_download = max_download
        self.install_command = install_command

    async def download_artifact(self, action_id, url, md5sum, tries=3):
        """The client's download; one refused (too large, filesystem full) is not tried
        again: the server is told why and the deployment closed as failed."""
        try:
            await super().download_artifact(action_id, url, md5sum, tries)
        except DownloadRefused as e:
            self.logger.error("Download refused, nothing installed: %s", e)
            await self.best_effort(self.ddi.deploymentBase[action_id].feedback(
                DeploymentStatusExecution.closed, DeploymentStatusResult.failure,
                [f"download refused, nothing installed: {e}"]))
            raise APIError(f"download refused: {e}") from e

    async def install(self):
        if self.lock_keeper and not self.lock_keeper.lock(self):
            self.logger.info("Another installation is already in progress, aborting")
            return
        proc = await asyncio.create_subprocess_exec(
            *self.install_command, self.bundle_dl_location,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
        last = ""
        steps = 0
        assert proc.stdout is not None
        async for raw in proc.stdout:
            line = raw.decode(errors="replace").rstrip()
            if not line:
                continue
            last = line
            steps += 1
            # RAUC's Progress property: (percentage, message, nesting depth). A progress
            # report the server does not take must not abandon the install under way.
            await self.best_effort(self.progress_callback(None, None, None, None, None,
                                                          (min(95, 5 * steps), line, 1)))
        rc = await proc.wait()
        if rc != 0:
            await self.best_effort(self.last_error_callback(None, None, None, None, None,
                                                            last or f"install exited {rc}"))
        # RAUC's Completed signal: the client's own completion path sends the closing
        # feedback (success or failure) and removes the download. The outcome must reach
        # the server, or it shows the deployment Running for good: retried.
        action_id = self.action_id
        try:
            await self.complete_callback(None, None, None, None, None, (rc,))
        except FEEDBACK_ERRORS as e:
            await self.close_deployment(action_id, rc, e)

    async def best_effort(self, feedback) -> None:
        try:
            await feedback
        except FEEDBACK_ERRORS as e:
            self.logger.warning("progress feedback not delivered: %s", str(e) or type(e).__name__)

    async def close_deployment(self, action_id, rc: int, first_error: Exception) -> None:
        execution = DeploymentStatusExecution.closed
        result = DeploymentStatusResult.success if rc == 0 else DeploymentStatusResult.failure
        msg = f"Rauc bundle update completed with result: {rc}"
        error = first_error
        for attempt in range(1, 31):
            self.logger.warning("result feedback not delivered (%s), attempt %d of 30 in 2 s",
                                str(error) or type(error).__name__, attempt)
            await asyncio.sleep(2)
            try:
                await self.ddi.deploymentBase[action_id].feedback(execution, result, [msg])
                break
            except FEEDBACK_ERRORS as e:
                error = e
        else:
            self.logger.error("result of deployment %s never delivered: %s", action_id, error)
        if os.path.exists(self.bundle_dl_location):
            os.remove(self.bundle_dl_location)
        self.action_id = None
        self.result_callback(rc)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--server", required=True, help="host:port of the DDI server")
    ap.add_argument("--ca", type=Path, help="the fleet's CA certificate (PEM): HTTPS, trusting this CA alone")
    ap.add_argument("--cert", type=Path, help="the device's client certificate (PEM), with --key")
    ap.add_argument("--key", type=Path, help="the device's client certificate's private key (PEM)")
    ap.add_argument("--max-download", type=int, default=4 << 30,
                    help="bytes a bundle download may take before it is refused (default 4 GiB)")
    ap.add_argument("--tenant", default="DEFAULT")
    ap.add_argument("--target", required=True, help="the device's controller id")
    ap.add_argument("--token-file", type=Path, required=True)
    ap.add_argument("--compatible", required=True, help="RAUC compatible, reported as hw_boardname")
    ap.add_argument("--sw-version", required=True, help="the running policy's version")
    ap.add_argument("--download", required=True, help="where the bundle is downloaded to")
    ap.add_argument("--retry", type=float, default=10.0, help="seconds between polls after an error")
    ap.add_argument("install_command", nargs="+")
    a = ap.parse_args()
    if (a.cert is None) != (a.key is None) or (a.cert is not None and a.ca is None):
        ap.error("--cert and --key go together, and with --ca")
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(name)s %(levelname)s: %(message)s")
    log = logging.getLogger("rauc_hawkbit")

    def done(result: int) -> None:
        log.info("deployment finished: install exit status %d", result)

    async def run() -> None:
        token = a.token_file.read_text().strip()
        connector = aiohttp.TCPConnector(ssl=tls_context(a.ca, a.cert, a.key)) if a.ca else None
        async with aiohttp.ClientSession(connector=connector) as session:
            client = VladRaucClient(
                session, a.server, a.ca is not None, a.tenant, a.target, token,
                {"hw_boardname": a.compatible, "hw_revision": "default", "sw_version": a.sw_version},
                a.download, done, install_command=a.install_command, max_download=a.max_download)
            await client.start_polling(wait_on_error=a.retry)

    try:
        asyncio.run(run())
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
