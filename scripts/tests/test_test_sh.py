"""scripts/test.sh's step selection: `--list` names every step of the whole run, in order,
and an unknown name is refused in one line before any set-up or step runs."""

import subprocess
from pathlib import Path

TEST_SH = Path(__file__).resolve().parents[1] / "test.sh"

# The whole run's steps in CI order; a step added to test.sh is added here too.
STEPS = [
    "fmt", "clippy", "rust", "pytest", "libero", "aarch64", "release", "qairt-aarch64",
    "bringup", "layer", "rauc", "fleet", "powercut", "soak",
]


def run(*args):
    return subprocess.run(
        [str(TEST_SH), *args], capture_output=True, text=True, timeout=60, check=False
    )


def test_list_names_every_step_in_order_with_its_title():
    out = run("--list")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert [line.split()[0] for line in lines] == STEPS
    assert all(len(line.split(maxsplit=1)) == 2 for line in lines), lines
    assert "setup:" not in out.stdout + out.stderr


def test_unknown_step_is_refused_in_one_line_naming_the_valid_ones():
    out = run("fmt", "no-such-step")
    assert out.returncode == 2
    assert out.stdout == ""
    err = out.stderr.strip().splitlines()
    assert len(err) == 1, err
    assert "'no-such-step'" in err[0]
    assert err[0].endswith(" ".join(STEPS))
