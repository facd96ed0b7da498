"""The operator's side of goosebit's management API (standard library only): log in,
upload a RAUC bundle as software, create devices with their tokens and feeds, start,
pause and read rollouts, read devices and their logs. Every call raises `ApiError` with the
method, path, status and goosebit's answer in one line."""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.parse
import urllib.request
import uuid
from pathlib import Path
from typing import Any


class ApiError(Exception):
    """A management API call that failed (HTTP status, or the server unreachable)."""


class Server:
    def __init__(self, base_url: str, token: str | None = None, timeout: float = 30.0,
                 tls: ssl.SSLContext | None = None):
        """`tls`: for an https URL, the context holding the fleet's CA (and the operator's
        client certificate when the server requires one)."""
        self.base_url = base_url.rstrip("/")
        self.token = token
        self.timeout = timeout
        self.tls = tls

    def request(self, method: str, path: str, body: bytes | None = None,
                content_type: str | None = None) -> Any:
        req = urllib.request.Request(self.base_url + path, data=body, method=method)
        if content_type:
            req.add_header("Content-Type", content_type)
        if self.token:
            req.add_header("Authorization", f"Bearer {self.token}")
        try:
            with urllib.request.urlopen(req, timeout=self.timeout, context=self.tls) as resp:
                data = resp.read()
        except urllib.error.HTTPError as e:
            detail = e.read().decode(errors="replace").strip().replace("\n", " ")[:300]
            raise ApiError(f"{method} {path}: HTTP {e.code}: {detail}") from e
        except (urllib.error.URLError, OSError) as e:
            raise ApiError(f"{method} {path}: {self.base_url} unreachable: {e}") from e
        return json.loads(data) if data else None

    def json(self, method: str, path: str, payload: Any) -> Any:
        return self.request(method, path, json.dumps(payload).encode(), "application/json")

    def login(self, user: str, password: str) -> None:
        form = urllib.parse.urlencode({"username": user, "password": password}).encode()
        self.token = self.request("POST", "/login", form,
                                  "application/x-www-form-urlencoded")["access_token"]

    def upload_software(self, bundle: Path) -> int:
        """A RAUC bundle as a software module; goosebit reads version and compatible from it."""
        boundary = uuid.uuid4().hex
        body = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; "
                f"filename=\"{bundle.name}\"\r\nContent-Type: application/octet-stream\r\n\r\n"
                ).encode() + bundle.read_bytes() + f"\r\n--{boundary}--\r\n".encode()
        return self.request("PUT", "/api/v1/software", body,
                            f"multipart/form-data; boundary={boundary}")["id"]

    def software(self) -> list[dict]:
        return self.request("GET", "/api/v1/software")["software"]

    def create_devices(self, ids: list[str], feed: str, token: str | None = None) -> None:
        payload: dict[str, Any] = {"devices": ids, "feed": feed}
        if token is not None:
            payload["auth_token"] = token
        self.json("PUT", "/api/v1/devices", payload)

    def patch_devices(self, ids: list[str], **fields: Any) -> None:
        self.json("PATCH", "/api/v1/devices", {"devices": ids, **fields})

    def devices(self) -> dict[str, dict]:
        return {d["id"]: d for d in self.request("GET", "/api/v1/devices")["devices"]}

    def device_log(self, dev_id: str) -> str:
        return self.request("GET", f"/api/v1/devices/{urllib.parse.quote(dev_id)}/log").get("log") or ""

    def start_rollout(self, name: str, feed: str, software_id: int) -> int:
        return self.json("PUT", "/api/v1/rollouts",
                         {"name": name, "feed": feed, "software_id": software_id})["id"]

    def pause_rollouts(self, ids: list[int], paused: bool = True) -> None:
        self.json("PATCH", "/api/v1/rollouts", {"ids": ids, "paused": paused})

    def rollouts(self) -> dict[int, dict]:
        return {r["id"]: r for r in self.request("GET", "/api/v1/rollouts")["rollouts"]}
