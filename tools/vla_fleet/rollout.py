"""The operator's canary / error-threshold procedure, driven through goosebit's API.

goosebit 0.2.12 has no rollout groups and no error threshold: a rollout is one software
for every device of one feed, with success / failure counters and a `paused` flag. So
groups are feeds (`canary`, `wave-1`, ...), and the procedure is: start the rollout for the
first group's feed, wait until the server's counters for it add up to the group's size,
stop (pause that rollout, start no further group) if the failures so far exceed the
threshold, else go on with the next group. Every figure it decides on is the server's."""

from __future__ import annotations

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


@dataclass
class RolloutResult:
    name: str
    groups: list[GroupResult] = field(default_factory=list)
    stopped: bool = False
    reason: str = ""


def run(server: Server, name: str, software_id: int, groups: list[tuple[str, int]],
        max_failure_percent: float, keep_waiting: Callable[[], str | None],
        poll_s: float = 1.0, say: Callable[[str], None] = print) -> RolloutResult:
    """Roll `software_id` out group by group (`groups`: (feed, number of devices)).

    `keep_waiting()` returns None while waiting may go on, else why not (a device's
    process died, the caller's time ran out): then the rollout is paused and the reason
    raised as RuntimeError."""
    result = RolloutResult(name)
    failures = done = 0
    for feed, size in groups:
        rid = server.start_rollout(f"{name} {feed}", feed, software_id)
        say(f"rollout {name}: group {feed} ({size} devices), rollout {rid} started")
        while True:
            r = server.rollouts()[rid]
            if r["success_count"] + r["failure_count"] >= size:
                break
            why = keep_waiting()
            if why is not None:
                server.pause_rollouts([rid])
                raise RuntimeError(f"rollout {name}, group {feed}: {why}")
            time.sleep(poll_s)
        result.groups.append(GroupResult(feed, rid, size, r["success_count"], r["failure_count"]))
        failures += r["failure_count"]
        done += r["success_count"] + r["failure_count"]
        rate = 100.0 * failures / done
        say(f"rollout {name}: group {feed}: {r['success_count']} succeeded, {r['failure_count']} failed "
            f"({rate:.0f}% failed so far, threshold {max_failure_percent:g}%)")
        if rate > max_failure_percent:
            server.pause_rollouts([rid])
            result.stopped = True
            result.reason = (f"{failures} of {done} devices failed ({rate:.0f}% > {max_failure_percent:g}%): "
                             f"rollout {rid} paused, later groups not started")
            say(f"rollout {name}: STOPPED: {result.reason}")
            break
    return result
