"""goosebit's ASGI app behind the one rule every deployment needs: `/setup` unreachable.

goosebit 0.2.12 answers `POST /setup` without authentication even after an admin exists,
creating another user with every permission. The admin is made offline instead
(`python -m vla_fleet.server init`), and this wrapper answers 404 for `/setup` before
goosebit sees the request: the same rule a reverse proxy in front of the server must have
(meta-vla/README.md, "Fleet rollouts")."""

from goosebit import app as goosebit_app


async def app(scope, receive, send):
    if scope["type"] in ("http", "websocket") and scope["path"].rstrip("/").lower() == "/setup":
        await send({"type": "http.response.start", "status": 404,
                    "headers": [(b"content-type", b"text/plain")]})
        await send({"type": "http.response.body", "body": b"not found\n"})
        return
    await goosebit_app(scope, receive, send)
