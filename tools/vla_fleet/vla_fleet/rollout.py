"""The operator's canary / error-threshold procedure, driven through goosebit's API.

goosebit 0.2.12 has no rollout groups and no error threshold: a rollout is one software
for every device of one feed, with success / failure counters and a `paused` flag. So
groups are feeds (`canary`, `wave-1`, ...), and the procedure is: start the rollout for the
first group's feed, wait until every device of that feed shows on the server a final state
(Finished or Error) for this deployment, stop (pause that rollout, start no further group)
if the share of the devices reached so far that failed exceeds the threshold, else go on
with the next group. Every figure it decides on is the server's (/api/v1/devices).

Why not the rollout's own success/failure counters: goosebit 0.2.12 increments them with a
read-modify-write across an await (updater/controller/v1/routes.py, deployment_feedback),
so two devices of one rollout reporting within the same moment lose one increment (seen
here: wave-1's two devices finished 30 ms apart, the counter said 1). The counters are
recorded next to the devices' states so that such a loss shows."""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from typing import Callable

from .api import Server


@dataclass
class GroupResult:
    feed: str
    rollout_id: int
    size: int
    success: int
    failure: int
    # The rollout's own counters (see the module doc: they can lose an increment).
    server_success: int = 0
    server_failure: int = 0


@dataclass
class RolloutResult:
    name: str
    groups: list[GroupResult] = field(default_factory=list)
    stopped: bool = False
    reason: str = ""


def group_outcome(server: Server, feed: str, version: str) -> tuple[int, int, int]:
    """(devices in `feed`, of them Finished on `version`, of them in Error) for the
    deployment of `version`: goosebit clears a device's log when it starts a deployment
    and the install's first line names the bundle's version, so a final state counts only
    with that line in the device's log (an Error left from an earlier rollout does not)."""
    devices = [d for d in server.devices().values() if d.get("feed") == feed]
    mark = re.compile(rf"signature verified, \S+ {re.escape(version)}\b")
    ok = failed = 0
    for d in devices:
        if d["last_state"] not in ("Finished", "Error"):
            continue
        if not mark.search(server.device_log(d["id"])):
            continue
        if d["last_state"] == "Finished" and d.get("sw_version") == version:
            ok += 1
        elif d["last_state"] == "Error":
            failed += 1
    return len(devices), ok, failed


def run(server: Server, name: str, software_id: int, groups: list[tuple[str, int]],
        max_failure_percent: float, keep_waiting: Callable[[], str | None],
        poll_s: float = 1.0, say: Callable[[str], None] = print) -> RolloutResult:
    """Roll `software_id` out group by group (`groups`: (feed, number of devices)).

    `max_failure_percent`: the share of the devices reached so far (all groups started)
    that may fail; checked after each group, the rollout stops when it is exceeded.
    `keep_waiting()` returns None while waiting may go on, else why not (a device's
    process died, the caller's time ran out): then the rollout is paused and the reason
    raised as RuntimeError."""
    version = next(sw["version"] for sw in server.software() if sw["id"] == software_id)
    result = RolloutResult(name)
    failures = done = 0
    for feed, size in groups:
        rid = server.start_rollout(f"{name} {feed}", feed, software_id)
        say(f"rollout {name}: group {feed} ({size} devices), rollout {rid} started")
        while True:
            n, ok, failed = group_outcome(server, feed, version)
            if n != size:
                server.pause_rollouts([rid])
                raise RuntimeError(f"rollout {name}: feed {feed} has {n} devices on the server, expected {size}")
            if ok + failed >= size:
                break
            why = keep_waiting()
            if why is not None:
                server.pause_rollouts([rid])
                raise RuntimeError(f"rollout {name}, group {feed}: {why}")
            time.sleep(poll_s)
        r = server.rollouts()[rid]
        result.groups.append(GroupResult(feed, rid, size, ok, failed, r["success_count"], r["failure_count"]))
        if (r["success_count"], r["failure_count"]) != (ok, failed):
            say(f"rollout {name}: group {feed}: goosebit's rollout counters say {r['success_count']} succeeded, "
                f"{r['failure_count']} failed; the devices' states say {ok} and {failed}")
        failures += failed
        done += ok + failed
        rate = 100.0 * failures / done
        say(f"rollout {name}: group {feed}: {ok} succeeded, {failed} failed "
            f"({rate:.0f}% failed so far, threshold {max_failure_percent:g}%)")
        if rate > max_failure_percent:
            server.pause_rollouts([rid])
            result.stopped = True
            result.reason = (f"{failures} of {done} devices failed ({rate:.0f}% > {max_failure_percent:g}%): "
                             f"rollout {rid} paused, later groups not started")
            say(f"rollout {name}: STOPPED: {result.reason}")
            break
    return result
