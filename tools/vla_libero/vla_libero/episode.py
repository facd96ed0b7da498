"""One LIBERO episode in lockstep with vlad's synchronous trigger, as the robot runs it:

1. reset to the stored init state, then upstream's no-op steps;
2. idle: publish the current observation (camera frames as rendered, raw state) and keep
   publishing it, unchanged, on every action tick (and at least every 100 ms) while vlad
   holds: the simulation does not move, so every copy shows the same state;
3. every `ok` row of a chunk inferred from one of those copies is applied with one
   `env.step`, in seq order (the robot reads every published step by seq, never just the
   newest, so a simulation slower than the publish rate loses none); a `hold` is not
   stepped;
4. after `execute_steps` rows (vlad then holds) back to 2, until LIBERO reports success or
   the suite's step limit.

So the policy sees exactly what upstream's eval feeds it: the observation after the no-op
steps, then the observation after every `execute_steps` applied actions, and the
simulation advances only by the actions of the chunk inferred from the previous one."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from . import conventions as cv
from . import ring as rg
from . import sim as sm


class LockstepError(Exception):
    """The episode could not run in lockstep; the message says what broke."""


@dataclass
class Log:
    """What the robot did, for the report and the boundary checks."""
    env_actions: list = field(default_factory=list)       # every action env.step received
    # Observation points: the simulator state after the no-op steps and after each chunk.
    point_frames: list = field(default_factory=list)       # ring frames [cams, H, W, 3]
    point_rendered: list = field(default_factory=list)     # as robosuite rendered them
    point_upstream_images: list = field(default_factory=list)
    point_raw_state: list = field(default_factory=list)    # the ring's state, f64
    point_env_state: list = field(default_factory=list)    # the env observation's eef_pos, eef_quat, gripper_qpos, f64
    point_upstream_state: list = field(default_factory=list)  # f32 [8]
    point_steps: list = field(default_factory=list)        # policy steps done before it
    published: list = field(default_factory=list)          # (seq, point, capture_ns)
    applied: list = field(default_factory=list)            # (seq, chunk_id, step_index, source_obs_seq, made_ns, read_ns, valid_until_ns)
    applied_values: list = field(default_factory=list)
    step_s: list = field(default_factory=list)             # wall time per env.step
    ticks_ok: int = 0
    ticks_hold: int = 0
    ticks_fault: int = 0
    ignored_ok: int = 0                                     # ok rows of a chunk from an earlier state
    cut_chunks: int = 0                                     # chunks vlad stopped before execute_steps rows
    success: bool = False
    steps: int = 0
    error: str = ""


def run(simulator: sm.Sim, init_state: np.ndarray, conv: cv.Conventions, writer: rg.ObservationWriter,
        reader: rg.ActionReader, instruction: int, max_steps: int, alive=lambda: None,
        between_chunks=lambda: None, wait_s: float = 900.0, reset_seed: int | None = None,
        on_frame=lambda obs: None, fault: tuple = ()) -> Log:
    """`alive` raises when vlad is gone; `between_chunks` runs after each chunk's executed
    rows, while the simulation waits anyway (the flight recording is taken there);
    `on_frame` gets the observation after the no-op steps and after every env step (the
    episode's video). `fault` breaks the live path on purpose, for the tests that watch the
    checks fail: `short-warmup` (one no-op step fewer), `flip-frame` (camera 0 written
    upside down on the ring)."""
    fault = fault or ()
    log = Log()
    obs = simulator.reset(init_state, seed=reset_seed)
    for _ in range(conv.num_steps_wait - ("short-warmup" in fault)):
        obs, _ = simulator.step(cv.NOOP_ACTION)
        writer.heartbeat()
    on_frame(obs)

    def new_point(o):
        frames = conv.ring_frames(o)
        if "flip-frame" in fault:
            frames = frames.copy()
            frames[0] = frames[0][::-1]
        log.point_frames.append(frames)
        log.point_rendered.append(sm.raw_frames(o))
        log.point_upstream_images.append(cv.upstream_images(o))
        log.point_raw_state.append(conv.ring_state(o).astype(np.float64))
        log.point_env_state.append(sm.raw_state(o))
        log.point_upstream_state.append(cv.upstream_state(o))
        log.point_steps.append(log.steps)
        return len(log.point_frames) - 1

    def publish(point):
        # The capture time is the rings' clock (the board's, through a bridge).
        seq = writer.publish(log.point_raw_state[point].astype(np.float32), log.point_frames[point], instruction,
                             seed=seq_seed(point))
        log.published.append((seq, point, writer.last_capture_ns))
        point_of[seq] = point
        return seq

    def seq_seed(point):
        return 0x5EED_0000 + point

    point_of: dict[int, int] = {}
    point = new_point(obs)
    publish(point)
    last_publish = time.monotonic()
    idle, rows, chunk = True, 0, None
    next_seq = reader.published() + 1
    deadline = time.monotonic() + wait_s
    while log.steps < max_steps and not log.success:
        alive()
        if next_seq > reader.published():
            writer.heartbeat()
            if idle and time.monotonic() - last_publish >= 0.1:
                publish(point)
                last_publish = time.monotonic()
            if time.monotonic() > deadline:
                raise LockstepError(f"no action from vlad for {wait_s:.0f} s (observation point {point}, "
                                    f"{log.steps} steps done)")
            time.sleep(0.002)
            continue
        code, a = reader.read(next_seq)
        if code == rg.READ_OVERWRITTEN:
            raise LockstepError(f"action {next_seq} was overwritten before the robot read it: the simulation fell "
                                "more than the action ring's slots behind")
        if code != rg.READ_OK:
            time.sleep(0.001)
            continue
        next_seq += 1
        read_ns = reader.last_read_ns
        if a.status != rg.STATUS_OK:
            if a.status == rg.STATUS_HOLD:
                log.ticks_hold += 1
            else:
                log.ticks_fault += 1
            if not idle and rows > 0:
                # vlad stopped the chunk early (a limit, a fault): the state after the rows
                # actually executed is what the next inference must see.
                log.cut_chunks += 1
                idle, point = True, new_point(obs)
            if idle:
                publish(point)
                last_publish = time.monotonic()
            continue
        log.ticks_ok += 1
        # Only a chunk inferred from the current state drives the simulation.
        if point_of.get(a.source_obs_seq) != point:
            log.ignored_ok += 1
            continue
        if a.chunk_id != chunk:
            chunk, rows, idle = a.chunk_id, 0, False
        if a.step_index != rows:
            # Not applied; the episode ends here and the checks (reading vlad's published
            # rows) say what went wrong.
            log.error = (f"chunk {a.chunk_id}: row {a.step_index} arrived where row {rows} was due "
                         "(synchronous execution starts at row 0 and plays rows in order)")
            break
        t0 = time.monotonic()
        obs, done = simulator.step(a.values)
        log.step_s.append(time.monotonic() - t0)
        on_frame(obs)
        writer.heartbeat()
        log.applied.append((a.seq, a.chunk_id, a.step_index, a.source_obs_seq, a.made_time_ns, read_ns,
                            a.valid_until_ns))
        log.applied_values.append(a.values.copy())
        log.steps += 1
        rows += 1
        log.success = done
        deadline = time.monotonic() + wait_s
        if rows == conv.execute_steps:
            between_chunks()
            idle, point = True, new_point(obs)
            # vlad takes the first copy captured after the last row's period (its hold
            # tick); earlier copies show the same state and are skipped by it.
    # What the env received: the no-op steps counted from its own action log.
    log.env_actions = [a.copy() for a in simulator.actions]
    return log


def save(log: Log, path) -> None:
    """The robot's log as npz (read by checks.py and report.py)."""
    np.savez_compressed(
        path,
        env_actions=np.array(log.env_actions, np.float64).reshape(-1, 7),
        point_frames=np.array(log.point_frames, np.uint8),
        point_rendered=np.array(log.point_rendered, np.uint8),
        point_upstream_images=np.array(log.point_upstream_images, np.uint8),
        point_raw_state=np.array(log.point_raw_state, np.float64),
        point_env_state=np.array(log.point_env_state, np.float64).reshape(-1, 9),
        point_upstream_state=np.array(log.point_upstream_state, np.float32),
        point_steps=np.array(log.point_steps, np.int64),
        published=np.array(log.published, np.uint64).reshape(-1, 3),
        applied=np.array(log.applied, np.uint64).reshape(-1, 7),
        applied_values=np.array(log.applied_values, np.float32).reshape(len(log.applied_values), -1),
        step_s=np.array(log.step_s, np.float64),
        counts=np.array([log.ticks_ok, log.ticks_hold, log.ticks_fault, log.ignored_ok, log.cut_chunks, log.steps,
                         int(log.success)], np.int64),
    )
