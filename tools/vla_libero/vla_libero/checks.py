"""The boundary checks: what vlad's policy received (its flight recording) against what
the policy's upstream LIBERO eval feeds for the same simulator state (the robot's log:
Fast-WAM's eval code, LeRobot's env for MolmoAct2), and the lockstep protocol (rows, order,
no-op steps, gripper values). Each check is a line `PASS|FAIL name: detail`. On every
inference, vlad's Fast-WAM image glue is stood for by tools/vla_host/vla_host/reference.py, the numpy
pipeline its parity tests hold it to (docs/bundle-format.md); on the first one, `vlad_glue`
reruns vlad's own code (`run-once --stages`) and holds its inputs to upstream's: Fast-WAM's
image and state to FastWAM's eval preprocessing, MolmoAct2's pixel values and state to
LeRobot's own env and processor steps (golden/libero/molmoact2-first-observation.npz)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from . import conventions as cv
from .recording import Recording

REPO = Path(__file__).resolve().parents[3]
# vlad's state conversion in f32 against upstream's f64 (docs/bundle-format.md, step 2).
STATE_TOLERANCE = 2e-6


@dataclass
class Check:
    name: str
    ok: bool
    detail: str

    def line(self) -> str:
        return f"{'PASS' if self.ok else 'FAIL'} {self.name}: {self.detail}"


def _reference():
    from vla_host import reference  # the project's numpy host glue
    return reference


def run(log: dict, rec: Recording, conv: cv.Conventions, instruction: int) -> list[Check]:
    ref = _reference()
    chain = conv.chain
    out: list[Check] = []
    published = {int(s): int(p) for s, p, _ in log["published"]}
    taken = [inf for inf in rec.inferences if inf.obs_seq in published]
    applied_chunks = {int(r[1]) for r in log["applied"]}
    recorded_chunks = {inf.chunk_id for inf in taken}
    out.append(Check("recording covers the episode", bool(taken) and applied_chunks <= recorded_chunks,
                     f"{len(taken)} recorded inferences on this episode's observations, "
                     f"{len(applied_chunks - recorded_chunks)} applied chunks missing"))

    fastwam = conv.policy == "fastwam"
    # 1. The bytes vlad took are the robot's, cameras in upstream's order.
    frames_ok = state_ok = True
    for inf in taken:
        k = published[inf.obs_seq]
        raw = log["point_frames"][k]
        frames_ok &= len(inf.frames) == 2 and all(np.array_equal(inf.frames[c], raw[c]) for c in (0, 1))
        state_ok &= np.array_equal(inf.state, log["point_raw_state"][k].astype(np.float32))
    out.append(Check("ring frames = the robot's frames (camera 0 agent view, 1 wrist)", frames_ok and bool(taken),
                     f"{len(taken)} observations, byte for byte"))
    out.append(Check("ring state = the robot's state", state_ok and bool(taken),
                     "eef_pos, eef_quat (x,y,z,w), gripper_qpos: MuJoCo's f64 as f32" if fastwam else
                     "LeRobot's observation.state: eef_pos, axis-angle, gripper_qpos in f32"))

    # 2. Orientation: the ring carries the frames as robosuite rendered them (Fast-WAM's
    #    bundle turns them itself, `rotate_180`).
    rendered = log["point_rendered"]
    if fastwam:
        orient = all(np.array_equal(inf.frames[c], rendered[published[inf.obs_seq]][c])
                     for inf in taken for c in (0, 1))
        out.append(Check("orientation: ring frames as rendered (the bundle's rotate_180 turns them, as upstream "
                         "get_libero_image)", orient and bool(taken) and list(chain["rotate_180"]) == [True, True],
                         f"rotate_180 {chain['rotate_180']}"))
    else:
        # LeRobot's torch.flip(img, dims=[2, 3]) on [B, C, H, W] of the rendered frames.
        orient = all(np.array_equal(inf.frames[c], np.flip(rendered[published[inf.obs_seq]][c], axis=(0, 1)))
                     for inf in taken for c in (0, 1))
        out.append(Check("orientation: ring frames = LeRobot's flipped image, image2 (vlad does not turn them)",
                         orient and bool(taken), "the rendered frames flipped in H and W, as LiberoProcessorStep"))
        worst = max((float(np.abs(inf.state - log["point_upstream_state"][published[inf.obs_seq]]).max())
                     for inf in taken), default=float("inf"))
        out.append(Check("policy state input = eef_pos + quat2axisangle + gripper_qpos (robosuite's, f64)",
                         worst <= STATE_TOLERANCE, f"max abs {worst:.3g} (tolerance {STATE_TOLERANCE:g})"))

    ids = sorted({inf.instruction_id for inf in taken})
    out.append(Check("instruction id on every observation vlad took", ids == [instruction],
                     f"ids {ids}, expected {instruction}"))
    if fastwam:
        out += _fastwam_inputs(ref, chain, taken, published, log)

    out += _lockstep(log, taken, published, conv, check_gripper=fastwam, ticks=rec.ticks)
    return out


def _fastwam_inputs(ref, chain, taken, published, log) -> list[Check]:
    out = []
    # 3. The policy's image input: vlad's host glue on the recorded frames against
    #    upstream's _center_crop_resize (Pillow) on upstream's images.
    worst_img = 0.0
    for inf in taken:
        vlad_img = ref.fastwam_image(np.stack([inf.frames[0], inf.frames[1]]), chain)
        up_img = cv.upstream_model_image(log["point_upstream_images"][published[inf.obs_seq]],
                                         chain["camera_width"], chain["camera_height"])
        worst_img = max(worst_img, float(np.abs(vlad_img - up_img).max()) if vlad_img.shape == up_img.shape
                        else float("inf"))
    out.append(Check("policy image input = upstream's (crop-resize, side by side, x*2/255-1)",
                     worst_img == 0.0 and bool(taken),
                     f"max abs {worst_img:g} over {len(taken)} inputs of {chain['camera_height']}x"
                     f"{2 * chain['camera_width']}"))

    return out


def fastwam_state_input(log: dict, point: int, policy_state) -> Check:
    """The state vlad's Rust glue built from the ring's 9 raw values (run-once --stages
    `policy_state`) against upstream's `_extract_sim_state` of the same env observation
    (`cv.upstream_state`, held to FastWAM's own eval golden by test_conventions.py)."""
    want = log["point_upstream_state"][point]
    got = None if policy_state is None else np.asarray(policy_state, np.float32).reshape(-1)
    diff = float(np.abs(got - want).max()) if got is not None and got.size == want.size else float("inf")
    return Check("vlad's state input to the first context (its own Rust pipeline) = upstream _extract_sim_state "
                 "of the env observation", diff <= STATE_TOLERANCE,
                 f"max abs {diff:.3g} over {want.size} values (tolerance {STATE_TOLERANCE:g}: f32 ring against f64)")


def _lockstep(log, taken, published, conv, check_gripper: bool, ticks=()) -> list[Check]:
    out = []

    # 5. Lockstep: inference k ran on the state after k chunks of execute_steps rows, each
    #    chunk's rows were applied in order from row 0, exactly as vlad computed them.
    applied, values = log["applied"], log["applied_values"]
    chunks = {inf.chunk_id: inf for inf in taken if inf.ok}
    steps_before = log["point_steps"]
    seq_ok, rows_ok, values_ok = True, True, True
    n = conv.execute_steps
    for inf in taken:
        k = published[inf.obs_seq]
        seq_ok &= int(steps_before[k]) == min(k * n, int(log["counts"][5]))
    by_chunk: dict[int, list] = {}
    for row, v in zip(applied, values):
        by_chunk.setdefault(int(row[1]), []).append((int(row[2]), v))
    for cid, rows in by_chunk.items():
        idx = [r for r, _ in rows]
        rows_ok &= idx == list(range(len(idx))) and len(idx) <= n
        c = chunks.get(cid)
        values_ok &= c is not None and c.actions is not None and all(np.array_equal(v, c.actions[r]) for r, v in rows)
    full = sum(len(r) == n for r in by_chunk.values())
    out.append(Check("lockstep: inference k saw the state after k x execute_steps rows", seq_ok and bool(taken),
                     f"execute_steps {n}, {len(taken)} inferences"))
    # What vlad published (its recording's ticks), not what the robot applied: the robot stops
    # an episode at a row out of order, so its own log could never show one.
    published_rows: dict[int, list] = {}
    for decision, status, chunk_id, step in ticks:
        if status == "ok" and chunk_id in by_chunk:
            published_rows.setdefault(chunk_id, []).append(step)
    vlad_ok = all(rows == list(range(len(rows))) and len(rows) <= n for rows in published_rows.values())
    out.append(Check("lockstep: each chunk published and applied from row 0, in order, at most execute_steps rows",
                     rows_ok and vlad_ok and bool(by_chunk) and bool(published_rows),
                     f"{len(by_chunk)} chunks, {full} with all {n} rows; vlad's ticks: {len(published_rows)} chunks"))
    out.append(Check("applied actions = the recorded chunk rows (gripper already mapped by vlad)",
                     values_ok and bool(by_chunk), f"{len(applied)} env steps"))
    if check_gripper:
        grip = values[:, -1] if len(values) else np.zeros(0)
        out.append(Check("gripper action in {-1, 0, 1} (upstream: -(2g-1), sign)",
                         bool(np.isin(grip, (-1.0, 0.0, 1.0)).all()),
                         f"values seen {sorted(set(np.round(grip, 6).tolist()))}"))

    # 6. Warm-up, counted from what env.step received: everything before the first policy row.
    env_actions = log["env_actions"]
    want = cv.setting(conv.policy, "num_steps_wait")
    k = len(env_actions) - len(applied)
    noop_ok = k == want and bool((env_actions[:max(k, 0)] == np.array(cv.NOOP_ACTION)).all()) and \
        np.array_equal(env_actions[max(k, 0):].astype(np.float32), np.asarray(values, np.float32).reshape(-1, 7))
    out.append(Check("no-op warm-up: upstream's num_steps_wait steps of [0,0,0,0,0,0,-1], counted from the env's actions",
                     noop_ok, f"{k} no-op steps received by the env, upstream {want}"))
    return out


def run_once_chunk(vlad: Path, bundle: Path, obs: Path) -> np.ndarray:
    """vlad's chunk for an observation npz (`vlad run-once`)."""
    import subprocess
    import tempfile
    from . import daemon as dm
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "chunk.npz"
        r = subprocess.run([str(vlad), "run-once", "--bundle", str(bundle), "--obs", str(obs), "--out", str(out)],
                           env=dm.vlad_env(), capture_output=True, text=True, timeout=900)
        if r.returncode != 0:
            raise RuntimeError(f"vlad run-once on {bundle} failed: {(r.stdout + r.stderr).strip()[-300:]}")
        return np.load(out)["actions"]


# LeRobot's own env and MolmoAct2 processor steps on the MolmoAct2 test episode's first
# observation (tools/goldens/vla_goldens/upstream_libero_molmoact2.py, run in the upstream venv).
MOLMOACT2_GOLDEN = REPO / "golden" / "libero" / "molmoact2-first-observation.npz"
# LeRobot's state is torch f32 (acos, sqrt, division), the robot's numpy f32: last-bit
# differences (measured 2.4e-7, one ulp at pi).
LEROBOT_STATE_TOLERANCE = 1e-6
# Within this of a .5 tie, the exact bilinear value may round to either uint8 level.
TIE = 1e-3


def _bilinear_ties(images: np.ndarray, crop: int, patch: int) -> np.ndarray:
    """Where the exact (f64) bilinear resize of `images` [cams, H, W, 3] to crop x crop lies
    at a .5 tie, in pixel_values' patch layout (flat)."""
    ref = _reference()
    out = []
    for img in images.astype(np.float64):
        y0, y1, fy = ref._axis_taps(img.shape[0], crop)
        x0, x1, fx = ref._axis_taps(img.shape[1], crop)
        fx = fx.astype(np.float64)[None, :, None]
        fy = fy.astype(np.float64)[:, None, None]
        top = img[y0][:, x0] * (1 - fx) + img[y0][:, x1] * fx
        bottom = img[y1][:, x0] * (1 - fx) + img[y1][:, x1] * fx
        out.append(top * (1 - fy) + bottom * fy)
    exact = np.stack(out)
    grid = crop // patch
    exact = exact.reshape(len(out), grid, patch, grid, patch, 3).transpose(0, 1, 3, 2, 4, 5).reshape(-1)
    return np.abs(exact - np.floor(exact) - 0.5) < TIE


def molmoact2_inputs(log: dict, point: int, state, pixel_values, chain: dict, golden=MOLMOACT2_GOLDEN) -> list[Check]:
    """MolmoAct2's inputs as vlad had them for one observation point: its Rust pipeline's
    `pixel_values` (run-once --stages) and the state it took from the ring, against LeRobot's
    preprocess_observation + LiberoProcessorStep + MolmoAct2 pack step + image processor on
    the same env observation (the golden). Pixel values must be upstream's except at .5 ties
    of the exact bilinear interpolation, one uint8 level at most (torch's uint8 kernel rounds
    some ties the other way; vlad rounds half to even). An observation other than the
    golden's (another task, init or bundle) is compared with the project's numpy reference
    instead, and the check says so."""
    g = np.load(golden)
    rendered, env_state = log["point_rendered"][point], log["point_env_state"][point]
    same = (np.array_equal(rendered, g["env_rendered"]) and np.array_equal(env_state, g["env_state"])
            and [chain["crop_size"], chain["patch_size"]] == g["crop_patch"].tolist())
    got = None if pixel_values is None else np.asarray(pixel_values, np.float32).reshape(-1)
    if not same:
        ref = _reference().pixel_values_from_frames(log["point_frames"][point], chain["crop_size"], chain["patch_size"])
        diff = float(np.abs(got - ref.reshape(-1)).max()) if got is not None and got.size == ref.size else float("inf")
        return [Check("vlad's vision input (its own Rust pipeline) = the numpy reference's pixel_values "
                      "(not the upstream golden's observation)", diff <= 1e-6, f"max abs {diff:g} over {ref.size} values")]
    want = g["pixel_values"].reshape(-1)
    src = f"upstream golden {golden.name}"
    if got is None or got.size != want.size:
        pixels = Check("vlad's vision input (its own Rust pipeline) = LeRobot's env + MolmoAct2 processor pixel_values",
                       False, f"{'no' if got is None else got.size} values, upstream {want.size} ({src})")
    else:
        ties = _bilinear_ties(g["processor_images"], chain["crop_size"], chain["patch_size"])
        levels = np.abs(got.astype(np.float64) - want) * 127.5
        apart = levels > 1e-3
        ok = bool(np.all(levels <= 1 + 1e-3) and np.all(ties[apart]))
        pixels = Check("vlad's vision input (its own Rust pipeline) = LeRobot's env + MolmoAct2 processor pixel_values",
                       ok, f"{int(apart.sum())} of {want.size} values apart (max {levels.max():.3g} uint8 levels), "
                           f"{int(np.sum(apart & ~ties))} of them off a .5 tie (allowed: one level at a tie; "
                           f"{int(ties.sum())} ties) ({src})")
    sdiff = float(np.abs(np.asarray(state, np.float32) - g["observation_state"]).max())
    return [pixels,
            Check("state vlad took = LeRobot's LiberoProcessorStep observation.state",
                  sdiff <= LEROBOT_STATE_TOLERANCE,
                  f"max abs {sdiff:.3g} over {g['observation_state'].size} values (tolerance "
                  f"{LEROBOT_STATE_TOLERANCE:g}: torch's f32 against numpy's) ({src})")]


def _run_once(vlad: Path, bundle: Path, inf, work: Path, tag: str, env: dict) -> dict:
    """`vlad run-once` on one recorded observation (its frames, state, instruction and
    seed, as vlad took them): the chunk and the host glue's stages, from vlad's own code."""
    import subprocess
    obs = work / f"obs-{tag}.npz"
    np.savez(obs, frames=np.stack([inf.frames[0], inf.frames[1]]), state=inf.state.astype(np.float32),
             instruction_id=np.array([inf.instruction_id], np.int64), seed=np.array([inf.seed], np.uint64))
    out, stages = work / f"chunk-{tag}.npz", work / f"stages-{tag}.npz"
    r = subprocess.run([str(vlad), "run-once", "--bundle", str(bundle), "--obs", str(obs), "--out", str(out),
                        "--stages", str(stages)], env=env, capture_output=True, text=True, timeout=900)
    if r.returncode != 0:
        raise RuntimeError(f"vlad run-once on {bundle} failed: {(r.stdout + r.stderr).strip().splitlines()[-1:]}")
    return {"actions": np.load(out)["actions"], **dict(np.load(stages))}


def vlad_glue(rec: Recording, log: dict, conv: cv.Conventions, bundle: Path, vlad: Path, work: Path,
              env: dict) -> list[Check]:
    """What vlad's Rust pipeline computed from the first observation it took, rerun by
    `vlad run-once` on that recorded observation, against upstream's preprocessing of the
    same env observation:
    - Fast-WAM: the image input the first context was fed (`--stages` `image`) = upstream's
      `get_libero_image` + `_center_crop_resize` + side by side + `x*2/255-1` (exact), and
      its state (`policy_state`) = upstream's `_extract_sim_state`;
    - MolmoAct2: `pixel_values` and the state vlad took = LeRobot's (`molmoact2_inputs`);
    - Fast-WAM: the gripper mapping, from the chunk of the same bundle with `gripper_map:
      none` and no binarizing (the de-normalized g, values anywhere in between): vlad's
      rows = upstream's `sign(-(g*2 - 1))` of them, the other dims unchanged;
    - both: run-once reproduces the recorded chunk (the rerun is the live computation)."""
    import json
    import shutil
    published = {int(s): int(p) for s, p, _ in log["published"]}
    taken = [inf for inf in rec.inferences if inf.obs_seq in published and inf.ok]
    if not taken:
        return [Check("vlad's own preprocessing of the first observation", False, "no inference recorded")]
    inf = taken[0]
    point = published[inf.obs_seq]
    work.mkdir(parents=True, exist_ok=True)
    live = _run_once(vlad, bundle, inf, work, "live", env)
    out = [Check("vlad run-once on the recorded observation = the recorded chunk", inf.actions is not None and
                 np.array_equal(live["actions"], inf.actions), f"observation {inf.obs_seq}, seed {inf.seed}")]
    if conv.policy != "fastwam":
        return out + molmoact2_inputs(log, point, inf.state, live.get("pixel_values"), conv.chain)
    chain = conv.chain
    up = cv.upstream_model_image(log["point_upstream_images"][point], chain["camera_width"], chain["camera_height"])
    got = live.get("image")
    diff = float(np.abs(got - up.reshape(-1)).max()) if got is not None and got.size == up.size else float("inf")
    out.append(Check("vlad's image input to the first context (its own Rust pipeline) = upstream's preprocessing "
                     "of the env observation", diff == 0.0, f"max abs {diff:g} over {up.size} values"))
    out.append(fastwam_state_input(log, point, live.get("policy_state")))
    # The same bundle without the gripper mapping: the de-normalized g vlad maps.
    raw_bundle = work / "bundle-raw-gripper"
    if raw_bundle.exists():
        shutil.rmtree(raw_bundle)
    shutil.copytree(bundle, raw_bundle, symlinks=True)
    m = json.loads((raw_bundle / "bundle.json").read_text())
    m["fastwam"]["gripper_map"], m["fastwam"]["gripper_binarize"] = "none", False
    (raw_bundle / "bundle.json").write_text(json.dumps(m, indent=1))
    raw = _run_once(vlad, raw_bundle, inf, work, "raw", env)["actions"]
    g = raw[:, -1].astype(np.float32)
    want = np.sign(-(g * np.float32(2) - np.float32(1)))  # upstream: g*2-1, invert_gripper_action, np.sign
    mapped_ok = np.array_equal(live["actions"][:, -1], want) and np.array_equal(live["actions"][:, :-1], raw[:, :-1])
    between = int(np.sum((np.abs(g) != 1) & (g != 0)))
    out.append(Check("gripper mapping = upstream's sign(-(g*2-1)) of vlad's de-normalized g",
                     mapped_ok and between > 0,
                     f"{len(g)} rows, {between} with g outside {{-1, 0, 1}} (g from {g.min():.3f} to {g.max():.3f})"))
    return out
