"""goosebit's ASGI app behind the rules every deployment needs: `/setup` unreachable, and
login tokens that expire.

goosebit 0.2.12 answers `POST /setup` without authentication even after an admin exists,
creating another user with every permission. The admin is made offline instead
(`python -m vla_fleet.server init`), and this wrapper answers 404 for `/setup` before
goosebit sees the request: the same rule a reverse proxy in front of the server must have
(meta-vla/README.md, "Fleet rollouts").

goosebit 0.2.12 signs its login tokens (the API's bearer token and the web UI's
`session_id` cookie) with no expiry, and has no setting for one: a token copied once works
until the secret key changes. Its two token functions are replaced here: a token carries
`iat` and `exp` (`session_lifetime_s` in goosebit.yaml, written by `server init`), and one
without `exp`, or past it, is refused as goosebit refuses a bad signature."""

import os
import time

import yaml
from goosebit import app as goosebit_app
from goosebit import auth
from goosebit.settings import config
from goosebit.users import UserManager
from joserfc import jwt
from joserfc.errors import JoseError

with open(os.environ["GOOSEBIT_SETTINGS"]) as f:
    SESSION_LIFETIME_S = int(yaml.safe_load(f).get("session_lifetime_s", 8 * 3600))


def create_token(username: str) -> str:
    now = int(time.time())
    return jwt.encode(header={"alg": "HS256"},
                      claims={"username": username, "iat": now, "exp": now + SESSION_LIFETIME_S},
                      key=config.secret_key)


async def get_user_from_token(token: str | None):
    if token is None:
        return None
    try:
        claims = jwt.decode(token, config.secret_key).claims
        exp = claims["exp"]
        if not isinstance(exp, int) or exp <= time.time():
            return None
        return await UserManager.get_user(claims["username"])
    except (JoseError, LookupError, ValueError):
        return None


# goosebit looks both up in its auth module at each call (login, every request).
auth.create_token = create_token
auth.get_user_from_token = get_user_from_token


async def app(scope, receive, send):
    if scope["type"] in ("http", "websocket") and scope["path"].rstrip("/").lower() == "/setup":
        await send({"type": "http.response.start", "status": 404,
                    "headers": [(b"content-type", b"text/plain")]})
        await send({"type": "http.response.body", "body": b"not found\n"})
        return
    await goosebit_app(scope, receive, send)
