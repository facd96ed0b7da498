"""The settings table and the task content against committed goldens taken from upstream
(no vlad, no simulation): every setting of `conventions.UPSTREAM` equals the hand-made copy
of upstream's values in golden/libero/upstream-settings.json and cites a file and line; the
installed stack's suites, task order, languages, bddl files and init states are official
LIBERO's (golden/libero/tasks.json, tools/goldens/vla_goldens/libero_task_golden.py); the init states load
without torch."""

import hashlib
import json
import re
from importlib.metadata import version
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]

from vla_libero import conventions, sim  # noqa: E402

SETTINGS = json.loads((REPO / "golden" / "libero" / "upstream-settings.json").read_text())
TASKS = json.loads((REPO / "golden" / "libero" / "tasks.json").read_text())


def test_every_upstream_setting_matches_the_golden_copy_and_cites_a_line():
    for policy in ("fastwam", "molmoact2"):
        table = conventions.UPSTREAM[policy]
        golden = {k: v for k, v in SETTINGS[policy].items() if not k.startswith("_")}
        assert set(table) == set(golden), policy
        for name, entry in table.items():
            assert entry["value"] == golden[name], f"{policy} {name}: {entry['value']} != golden {golden[name]}"
            assert re.search(r"\S+\.(py|yaml|mdx|md|lock|toml):\d+", entry["source"]), f"{policy} {name} cites no line"


def test_the_upstream_settings_drive_the_conventions():
    mm = conventions.from_bundle(conventions.MOLMOACT2_FIXTURE)
    assert mm.num_steps_wait == 50 and mm.execute_steps == 10 and mm.max_steps("libero_goal") == 300
    assert mm.env_seed(0) == (None, 1000) and mm.env_seed(7) == (None, 1007)
    assert any("render size 48x64" in d and "360x360" in d for d in mm.differences())


def test_the_installed_stack_has_official_liberos_task_content():
    assert version("hf-libero") == "0.1.4" and version("robosuite") == "1.4.0"
    for suite, tasks in TASKS["suites"].items():
        names = sim.task_names(suite)
        assert names == [t["name"] for t in tasks], f"{suite}: task order differs from official LIBERO"
        for i, want in enumerate(tasks):
            t = sim.task(suite, i)
            assert t.language == want["language"]
            assert hashlib.sha256(t.bddl_file.read_bytes()).hexdigest() == want["bddl_sha256"], t.bddl_file
            assert hashlib.sha256(t.init_file.read_bytes()).hexdigest() == want["init_sha256"], t.init_file
    states = sim.init_states(sim.task("libero_spatial", 0))
    assert states.shape == (50, 92) and states.dtype.name == "float64"


def test_the_init_state_reader_lets_only_numpy_through(tmp_path):
    import io
    import pickle
    import zipfile
    import pytest
    bad = tmp_path / "bad.pruned_init"
    with zipfile.ZipFile(bad, "w") as z:
        z.writestr("archive/data.pkl", pickle.dumps(io.BytesIO(b"")))
    with pytest.raises(pickle.UnpicklingError, match="is not a numpy array part"):
        sim._load_init_states(bad)


def test_the_upstream_preprocessing_the_checks_use_is_upstreams_own_on_its_golden():
    """The Fast-WAM checks hold vlad's image and state inputs to `upstream_images` +
    `upstream_model_image` and `upstream_state`: on upstream's own `_predict_action_chunk`
    golden (golden/upstream-fastwam/libero_eval.npz, made by FastWAM's eval code on a
    256x256 LIBERO observation) they give upstream's image input exactly and its state."""
    import numpy as np
    g = np.load(REPO / "golden" / "upstream-fastwam" / "libero_eval.npz")
    obs = {"agentview_image": g["agentview_image"], "robot0_eye_in_hand_image": g["wrist_image"],
           "robot0_eef_pos": g["eef_pos"].astype(np.float64), "robot0_eef_quat": g["eef_quat"].astype(np.float64),
           "robot0_gripper_qpos": g["gripper_qpos"].astype(np.float64)}
    want = g["image_levels"][g["image_index"]]
    got = conventions.upstream_model_image(conventions.upstream_images(obs), 224, 224)
    assert got.shape == want.shape and np.array_equal(got, want)
    assert np.abs(conventions.upstream_state(obs) - g["state"]).max() <= 1e-6
    # Upstream's gripper mapping, as the gripper check applies it: g*2-1, inverted, sign.
    a = g["actions"][:, -1]
    assert np.array_equal(np.sign(a), g["actions_binarized"][:, -1])
