"""vla-libero: `tasks` lists a suite, `episode` runs one episode through vlad and writes its
report, `eval` runs several and writes the per-suite success table, `demo` runs a short
episode on the tiny fixture."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

from . import bridge as br
from . import checks as ck
from . import conventions as cv
from . import daemon as dm
from . import episode as ep
from . import recording as rc
from . import report as rp
from . import ring as rg
from . import sim as sm


# Faults the tests inject on the live path to watch the checks fail: the robot writes camera 0
# upside down, skips one no-op step, or vlad runs a bundle without the gripper inversion.
FAULTS = ("flip-frame", "short-warmup", "no-gripper-inversion")


def _faults(text: str) -> tuple:
    faults = tuple(f.strip() for f in text.split(",") if f.strip())
    bad = [f for f in faults if f not in FAULTS]
    if bad:
        raise argparse.ArgumentTypeError(f"unknown fault {bad[0]!r}; faults: {', '.join(FAULTS)}")
    return faults


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="vla-libero", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("tasks", help="list a suite's tasks")
    t.add_argument("--suite", default="libero_spatial")
    d = sub.add_parser("demo", help="one short episode on the tiny closed-loop Fast-WAM fixture (what CI runs)")
    d.add_argument("--out", type=Path, default=Path("build/libero-demo"))
    d.add_argument("--policy", choices=("fastwam", "molmoact2"), default="fastwam",
                   help="fastwam: golden/bundles/fastwam-closed-loop (raw state); molmoact2: "
                        "golden/bundles/molmoact2-upstream-sd")
    d.add_argument("--vlad", help="vlad binary (default: the newer of target/release and target/debug)")
    d.add_argument("--fault", type=_faults, help=f"break the live path on purpose: {', '.join(FAULTS)}")
    for name in ("episode", "eval"):
        e = sub.add_parser(name, help="one episode with its report" if name == "episode" else
                           "several episodes per task and suite: the success-rate table")
        e.add_argument("--bundle", required=True, type=Path, help="a closed-loop Fast-WAM bundle with "
                       "fastwam.chain.state_input eef_pos_quat_gripper")
        e.add_argument("--suite", action="append", help="LIBERO suite (repeat for eval); default libero_spatial")
        e.add_argument("--task", default="0", help="index, bddl name or language (eval: comma list or 'all')")
        e.add_argument("--init", type=int, default=0, help="first stored init state")
        e.add_argument("--episodes", type=int, default=1, help="episodes per task (eval)")
        e.add_argument("--max-steps", type=int, help="policy steps cap (default: upstream's per suite)")
        e.add_argument("--instruction-id", type=int, help="the bundle instruction to use instead of the task's "
                       "language (a tiny fixture has no LIBERO prompt)")
        e.add_argument("--publish-hz", type=float, default=2.0, help="vlad's row pace (lockstep: any rate works)")
        e.add_argument("--vlad", help="vlad binary (default target/release or target/debug)")
        e.add_argument("--out", type=Path, default=Path("build/libero"))
        e.add_argument("--sheet-rows", type=int, default=8)
        e.add_argument("--bridge", help="reach the rings through vla-ring-bridge run by this command (e.g. "
                       "'ssh root@board /tmp/vla-ring-bridge'; 'local': this machine's build), not directly")
        e.add_argument("--board", help="run vlad on another machine through this command prefix (e.g. "
                       "'ssh root@board'); use with --bridge, --board-vlad, --board-dir; --bundle is the board's path")
        e.add_argument("--board-vlad", default="vlad", help="vlad on the board")
        e.add_argument("--board-bundle", help="the bundle's path on the board (default: --bundle's)")
        e.add_argument("--board-dir", default="/tmp/vla-libero", help="the config and recordings on the board")
        e.add_argument("--board-qnn-lib-dir", help="VLA_QNN_LIB_DIR for vlad on the board (default: its config's)")
        e.add_argument("--record-every-s", type=float, default=dm.RECORD_EVERY_S,
                       help="take a flight recording between chunks this often (at most 300)")
        e.add_argument("--workers", type=int, default=1, help="eval: episodes run in parallel, each worker with "
                       "its own vlad and rings (OUT/worker-K)")
        e.add_argument("--shard", help=argparse.SUPPRESS)  # K/N: the episodes of worker K of N
        e.add_argument("--resume", action="store_true", help="keep the episodes OUT already holds a report of")
        e.add_argument("--no-video", action="store_true", help="no per-episode MP4")
        e.add_argument("--fault", type=_faults, help="break the live path on purpose, comma list of "
                       f"{', '.join(FAULTS)} (the tests that watch the checks fail)")
    return p


def _episodes(args, conv):
    suites = args.suite or ["libero_spatial"]
    for s in suites:
        table = conv.setting("max_steps")
        if s in sm.SUITE_NAMES and args.max_steps is None and s not in table:
            raise sm.TaskError(f"suite {s}: upstream's eval sets no episode length for it (only "
                               f"{', '.join(table)}): pass --max-steps")
        if args.cmd == "eval" and args.task == "all":
            tasks = [sm.task(s, i) for i in range(len(sm.task_names(s)))]
        else:
            tasks = [sm.task(s, x.strip()) for x in args.task.split(",")]
        for t in tasks:
            cv.instruction_id(conv, t.language, args.instruction_id)
            for i in range(args.episodes if args.cmd == "eval" else 1):
                yield t, args.init + i


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = _parser().parse_args(argv)
    try:
        if args.cmd == "tasks":
            for i, name in enumerate(sm.task_names(args.suite)):
                print(f"{i}\t{name}\t{sm.language_of(name)}")
            return 0
        if args.cmd == "demo":
            out = args.out.resolve()
            out.mkdir(parents=True, exist_ok=True)
            bundle = cv.fixture_bundle(out / "bundle") if args.policy == "fastwam" else cv.MOLMOACT2_FIXTURE
            if args.fault and "no-gripper-inversion" in args.fault:
                vlad = dm.vlad_binary(args.vlad)
                bundle = cv.without_gripper_inversion(bundle, lambda b, obs: ck.run_once_chunk(vlad, b, obs))
            args = _parser().parse_args(
                ["episode", "--bundle", str(bundle), "--suite", "libero_spatial", "--task", "0", "--max-steps", "20",
                 "--instruction-id", "0", "--publish-hz", "4", "--out", str(out)]
                + (["--vlad", args.vlad] if args.vlad else []) + (["--fault", ",".join(args.fault)] if args.fault else []))
        if args.cmd == "eval" and args.workers > 1:
            return _parallel(args, argv)
        return _run(args)
    except (sm.TaskError, cv.BundleError, rg.RingError, dm.DaemonError, ep.LockstepError) as e:
        print(f"vla-libero: {e}", file=sys.stderr)
        return 1


def _parallel(args, argv: list) -> int:
    """`eval --workers N`: N workers (this tool again, each with its own vlad, rings and
    OUT/worker-K), episode i to worker i mod N; then one table over all of them."""
    import subprocess
    conv = cv.from_bundle(args.bundle)
    plan = list(_episodes(args, conv))  # bad input refused before anything starts
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    rest, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a in ("--workers", "--out"):
            skip = True
        elif not a.startswith(("--workers=", "--out=")):
            rest.append(a)
    n = min(args.workers, len(plan))
    procs = [subprocess.Popen([sys.executable, "-m", "vla_libero", *rest, "--shard", f"{k}/{n}",
                               "--out", str(out / f"worker-{k}")]) for k in range(n)]
    codes = [p.wait() for p in procs]
    summaries = [json.loads(p.read_text()) for p in sorted(out.glob("worker-*/*/report.json"))]
    run = json.loads((out / "worker-0" / "run.json").read_text())
    run["vlad_warnings"] = sorted({w for k in range(n) for w in json.loads(
        (out / f"worker-{k}" / "run.json").read_text()).get("vlad_warnings", [])})
    run["workers"] = n
    (out / "run.json").write_text(json.dumps(run, indent=1))
    table = rp.header_text(run) + "\n\n" + rp.suite_table(summaries, conv.policy) + "\n\n" + rp.task_table(summaries)
    (out / "success-rates.md").write_text(table + "\n")
    (out / "episodes.json").write_text(json.dumps(summaries, indent=1))
    print(table)
    if any(c not in (0, 3) for c in codes):
        print(f"vla-libero: a worker failed (exit codes {codes}; logs in {out}/worker-*/vlad.log)", file=sys.stderr)
        return 1
    return 0 if all(c == 0 for c in codes) else 3


def _episode_dir(args, out: Path, task, init_index: int) -> Path:
    return out / (f"{task.suite}-{task.index}-{init_index}" if args.cmd == "eval" else "episode")


def _write_table(args, conv, out: Path, run: dict, summaries: list) -> None:
    """`eval`: success-rates.md (the run's header, the suite and task tables) and episodes.json."""
    if args.cmd != "eval":
        return
    table = rp.header_text(run) + "\n\n" + rp.suite_table(summaries, conv.policy) + "\n\n" + rp.task_table(summaries)
    (out / "success-rates.md").write_text(table + "\n")
    (out / "episodes.json").write_text(json.dumps(summaries, indent=1))
    print(table)


def _run(args) -> int:
    conv = cv.from_bundle(args.bundle)
    plan = list(_episodes(args, conv))  # every task checked before anything starts
    if args.shard:
        k, n = (int(x) for x in args.shard.split("/"))
        plan = plan[k::n]
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    tag = f"{os.getpid()}"
    if not 0 <= args.record_every_s <= 300:
        raise dm.DaemonError(f"--record-every-s {args.record_every_s}: expected 0..300 (a recording covers 600 s "
                             "at most)")
    if args.resume and plan and all((_episode_dir(args, out, t, i) / "report.json").exists() for t, i in plan):
        # Nothing left to run: the table from the reports, without starting vlad.
        summaries = [json.loads((_episode_dir(args, out, t, i) / "report.json").read_text()) for t, i in plan]
        print(f"vla-libero: all {len(plan)} episodes done before, kept (--resume); vlad not started", file=sys.stderr)
        if not (out / "run.json").exists():
            (out / "run.json").write_text(json.dumps(rp.run_header(conv, args.bundle, out, args.publish_hz,
                                                                   args.fault), indent=1))
        _write_table(args, conv, out, json.loads((out / "run.json").read_text()), summaries)
        return 0 if all(s["checks_passed"] and not s.get("error") for s in summaries) else 3
    config = dm.eval_config(args.board_bundle or args.bundle, out, tag, args.publish_hz, conv.execute_steps,
                            args.record_every_s)
    if args.board:
        if not args.bridge:
            raise dm.DaemonError("--board needs --bridge: the rings are on the board")
        daemon = dm.BoardDaemon(args.board, args.board_vlad, config, out, args.board_dir, args.board_qnn_lib_dir)
    else:
        daemon = dm.Daemon(dm.vlad_binary(args.vlad), config, out)
    writer = reader = None
    stopped = None
    summaries: list = []
    sims: dict = {}
    try:
        if args.bridge:
            bridge = br.Bridge(str(br.local_bridge()) if args.bridge == "local" else args.bridge, daemon.obs_path,
                               daemon.act_path, conv.geometry)
            writer, reader = br.RemoteObservationWriter(bridge), br.RemoteActionReader(bridge)
        else:
            bridge = None
            writer = rg.ObservationWriter(daemon.obs_path, conv.geometry)
            reader = rg.ActionReader(daemon.act_path, conv.geometry)
        run = rp.run_header(conv, args.bundle, out, args.publish_hz, args.fault)
        (out / "run.json").write_text(json.dumps(run, indent=1))
        print(rp.header_text(run), flush=True)
        started, done_s = time.monotonic(), []
        for n, (task, init_index) in enumerate(plan):
            ep_dir = _episode_dir(args, out, task, init_index)
            if args.resume and (ep_dir / "report.json").exists():
                summaries.append(json.loads((ep_dir / "report.json").read_text()))
                print(f"[{n + 1}/{len(plan)}] {ep_dir.name}: done before, kept (--resume)", file=sys.stderr)
                continue
            create_seed, reset_seed = conv.env_seed(init_index)
            if task.name not in sims:
                for s in sims.values():
                    s.close()
                sims = {task.name: sm.Sim(task, conv.geometry.height, conv.geometry.width, create_seed)}
            simulator = sims[task.name]
            t0 = time.monotonic()
            while not reader.try_open():  # vlad gates the bundle first
                daemon.check_alive()
                writer.heartbeat()
                if time.monotonic() - t0 > 900:
                    raise dm.DaemonError(f"vlad made no action ring in 900 s (log {daemon.log_path})")
                time.sleep(0.1)
            inits = sm.init_states(task)
            instruction = cv.instruction_id(conv, task.language, args.instruction_id)
            max_steps = args.max_steps or conv.max_steps(task.suite)
            ep_dir.mkdir(parents=True, exist_ok=True)
            recordings: list[Path] = []
            last = [time.monotonic()]

            def take_recording():
                target = ep_dir / f"recording-{len(recordings):03d}.mcap"
                daemon.record().replace(target)
                recordings.append(target)
                last[0] = time.monotonic()

            def between_chunks():
                # A long episode outlasts one recording's history: take one on the way.
                if time.monotonic() - last[0] >= args.record_every_s:
                    take_recording()

            video = None if args.no_video else rp.Video(ep_dir / "video.mp4")
            meta = {"bundle": str(args.bundle), "suite": task.suite, "task_index": task.index, "task": task.language,
                    "init_index": init_index, "max_steps": max_steps, "execute_steps": conv.execute_steps,
                    "publish_hz": args.publish_hz, "frame": f"{conv.geometry.height}x{conv.geometry.width}",
                    "env_seed": {"at_creation": create_seed, "at_reset": reset_seed}, "recordings": recordings}
            ep_t0 = time.monotonic()
            try:
                log = ep.run(simulator, inits[init_index % len(inits)], conv, writer, reader, instruction, max_steps,
                             alive=daemon.check_alive, between_chunks=between_chunks, reset_seed=reset_seed,
                             on_frame=video.add if video else (lambda o: None), fault=args.fault)
            except (ep.LockstepError, dm.DaemonError) as e:
                # Recorded; the run goes on with the next episode, or, vlad gone, stops
                # with the table of what was done.
                summary = dict(meta, recordings=[], error=str(e), success=False, checks=[], checks_passed=False)
                rp.write_failed(summary, ep_dir)
                summaries.append(summary)
                print(f"vla-libero: episode {ep_dir.name} failed: {e}", file=sys.stderr)
                if isinstance(e, dm.DaemonError):
                    stopped = e
                    break
                continue
            finally:
                if video:
                    meta["video"] = str(video.close())
            ep.save(log, ep_dir / "robot.npz")
            take_recording()
            saved = dict(np.load(ep_dir / "robot.npz"))
            rec = rc.read_all(recordings)
            results = ck.run(saved, rec, conv, instruction)
            if not args.board:
                # vlad's own preprocessing and gripper mapping, rerun on the recorded observation.
                try:
                    results += ck.vlad_glue(rec, saved, conv, args.bundle, daemon.vlad, ep_dir / "glue",
                                            dm.vlad_env())
                except RuntimeError as e:
                    results.append(ck.Check("vlad's own preprocessing of the first observation", False, str(e)))
            summary = rp.summarize(saved, rec, results, meta)
            summary["error"] = log.error
            summary["contact_sheet"] = str(rp.contact_sheet(saved, ep_dir / "contact-sheet.png", args.sheet_rows))
            if bridge:
                summary["bridge_rtt_ms"] = rp.rtt(bridge.rtt_s)
                for v in bridge.rtt_s.values():
                    v.clear()
            rp.write(summary, ep_dir)
            print(rp.text(summary), flush=True)
            summaries.append(summary)
            done_s.append(time.monotonic() - ep_t0)
            left = len(plan) - n - 1
            eta = left * sum(done_s) / len(done_s)
            print(f"{rp.progress_bar(n + 1, len(plan))} {n + 1}/{len(plan)} episodes, "
                  f"{time.monotonic() - started:.0f} s so far, ETA {eta / 60:.1f} min", file=sys.stderr, flush=True)
    finally:
        for s in sims.values():
            s.close()
        if writer:
            writer.close()
        if reader:
            reader.close()
        code = daemon.stop()
    warnings = rp.vlad_warnings(daemon.log_path)
    for w in warnings:
        print(f"vlad warned: {w}", flush=True)
    if args.cmd == "eval" or summaries:
        run = json.loads((out / "run.json").read_text()) if (out / "run.json").exists() else {}
        run["vlad_warnings"] = warnings
        (out / "run.json").write_text(json.dumps(run, indent=1))
    _write_table(args, conv, out, run if args.cmd == "eval" or summaries else {}, summaries)
    if code not in (0, None) or stopped:
        print(f"vla-libero: vlad exited with {code} (log {daemon.log_path})", file=sys.stderr)
        return 1
    return 0 if all(s["checks_passed"] and not s.get("error") for s in summaries) else 3


if __name__ == "__main__":
    sys.exit(main())
