"""A fleet rollout through a real hawkBit-DDI update server: goosebit on the loopback
(`server`, `asgi`), the RAUC project's DDI client adapted to it (`agent`), RAUC's install
as vlad's handlers see it on hosts without dm-verity (`install`), the operator's API calls
and the canary / error-threshold procedure (`api`, `rollout`), device stand-ins (`device`).
Own venv: scripts/setup_fleet.sh (goosebit, rauc-hawkbit); `api`, `rollout` and `device`
use only the standard library, so the tests drive them from the project venv."""
