"""Tests for scripts/gen_crates_inc.py: lock parsing, rendering and the --check gate."""

import contextlib
import importlib.util
import io
import tempfile
import unittest
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent.parent / "gen_crates_inc.py"
spec = importlib.util.spec_from_file_location("gen_crates_inc", SCRIPT)
gen = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gen)

CRATES_IO = "registry+https://github.com/rust-lang/crates.io-index"
SUM_A = "a" * 64
SUM_B = "b" * 64

LOCK = f"""
version = 4

[[package]]
name = "libc"
version = "0.2.170"
source = "{CRATES_IO}"
checksum = "{SUM_A}"

[[package]]
name = "vla-tensor"
version = "0.1.0"

[[package]]
name = "zerocopy"
version = "0.8.1"
source = "sparse+https://index.crates.io/"
checksum = "{SUM_B}"
"""


class GenCratesIncTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.dir = Path(self.tmp.name)
        self.lock = self.dir / "Cargo.lock"
        self.inc = self.dir / "vlad-crates.inc"

    def tearDown(self):
        self.tmp.cleanup()

    def run_main(self, *args):
        err = io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            code = gen.main(["--lock", str(self.lock), "--output", str(self.inc), *args])
        return code, err.getvalue()

    def test_registry_packages_skip_path_members(self):
        self.lock.write_text(LOCK)
        self.assertEqual(
            gen.registry_packages(self.lock),
            [("libc", "0.2.170", SUM_A), ("zerocopy", "0.8.1", SUM_B)],
        )

    def test_render_matches_update_crates_layout(self):
        text = gen.render_inc([("libc", "0.2.170", SUM_A)], "Cargo.lock")
        self.assertEqual(
            text.splitlines()[3:],
            [
                "# from Cargo.lock",
                "# nooelint: oelint.vars.inconspaces, oelint.vars.notneededspace",
                'SRC_URI += " \\',
                "    crate://crates.io/libc/0.2.170 \\",
                '"',
                "",
                f'SRC_URI[libc-0.2.170.sha256sum] = "{SUM_A}"',
            ],
        )

    def test_check_passes_after_generation_and_fails_when_stale(self):
        self.lock.write_text(LOCK)
        self.assertEqual(self.run_main()[0], 0)
        self.assertEqual(self.run_main("--check")[0], 0)
        self.lock.write_text(LOCK.replace("0.2.170", "0.2.171"))
        code, err = self.run_main("--check")
        self.assertEqual(code, 1)
        self.assertIn("is stale", err)
        self.assertIn("+    crate://crates.io/libc/0.2.171 \\", err)

    def test_check_fails_when_inc_missing(self):
        self.lock.write_text(LOCK)
        code, err = self.run_main("--check")
        self.assertEqual(code, 1)
        self.assertIn("is missing", err)

    def test_git_source_is_refused_with_the_crate_name(self):
        self.lock.write_text(LOCK + '\n[[package]]\nname = "foo"\nversion = "1.0.0"\n'
                             'source = "git+https://example.invalid/foo#abc"\n')
        code, err = self.run_main()
        self.assertEqual(code, 2)
        self.assertIn("package foo 1.0.0 comes from", err)
        self.assertFalse(self.inc.exists())

    def test_missing_lock_is_named(self):
        code, err = self.run_main("--check")
        self.assertEqual(code, 2)
        self.assertIn(f"{self.lock}: not found", err)

    def test_missing_checksum_is_refused(self):
        self.lock.write_text(LOCK.replace(f'checksum = "{SUM_A}"\n', ""))
        code, err = self.run_main()
        self.assertEqual(code, 2)
        self.assertIn("libc 0.2.170 has no sha256 checksum", err)


if __name__ == "__main__":
    unittest.main()
