"""`goldens list` / `goldens make`: every file under golden/ belongs to a set, and the
command refuses, in one line and before running anything, what it cannot make."""

import subprocess
import sys
from pathlib import Path

from vla_goldens import cli

REPO = Path(__file__).resolve().parents[3]
GOLDEN = REPO / "golden"


def test_every_golden_file_belongs_to_a_set_and_every_set_path_exists():
    paths = [p for s in cli.SETS for p in s.paths]
    for p in paths:
        assert (GOLDEN / p).exists(), f"golden/{p} is named by a set but does not exist"
    files = [f.relative_to(GOLDEN).as_posix() for f in GOLDEN.rglob("*") if f.is_file() and f.name != "README.md"]
    assert files
    orphans = [f for f in files if not any(f == p or f.startswith(p + "/") for p in paths)]
    assert orphans == [], f"files under golden/ no set makes: {orphans}"


def test_list_shows_every_set_with_its_directories():
    run = subprocess.run([sys.executable, "-m", "vla_goldens.cli", "list"], capture_output=True, text=True,
                         check=True)
    lines = run.stdout.splitlines()
    assert len(lines) == len(cli.SETS)
    for s, line in zip(cli.SETS, lines):
        assert line.split()[0] == s.name
        for p in s.paths:
            assert f"golden/{p}" in line.split()
    top = sorted(d.name for d in GOLDEN.iterdir() if d.is_dir())
    for d in top:
        assert any(p == d or p.startswith(d + "/") for s in cli.SETS for p in s.paths), d


def test_sets_without_a_generator_or_an_option_are_refused_in_one_line(capsys):
    for argv, words in ((["make", "releases"], ("no generator", "model cards")),
                        (["make", "upstream"], ("needs --keystone-src",)),
                        (["make", "no-such-set"], ("unknown set 'no-such-set'", "fixtures"))):
        assert cli.main(argv) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and all(w in err for w in words), err
