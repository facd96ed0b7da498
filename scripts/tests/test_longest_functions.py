"""scripts/longest_functions.py measures by brace depth: braces in strings, chars, raw
strings and comments do not count, lifetimes are not chars, and a body-less `fn` is
skipped."""

import importlib.util
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("longest_functions", REPO / "scripts" / "longest_functions.py")
longest = importlib.util.module_from_spec(spec)
spec.loader.exec_module(longest)

SOURCE = r'''
trait T {
    fn declared(&self) -> u8;
}

fn tricky<'a>(x: &'a str) -> Result<(), String> {
    let open = '{';
    let text = "}} not a close {";
    let raw = r#"a "}" inside"#;
    // a comment with a }
    /* and a block { with /* a nested } */ one */
    if x.is_empty() {
        for c in x.chars() {
            match c {
                'a' => {}
                _ => {}
            }
        }
    }
    Ok(())
}

fn after() {}
'''


def test_braces_in_literals_and_comments_do_not_count(tmp_path):
    f = tmp_path / "lib.rs"
    f.write_text(SOURCE)
    found = {name: (line, length, nest) for name, line, length, nest in longest.functions(f)}
    assert "declared" not in found
    # `tricky` runs from its `fn` line to its closing brace; if > for > match > arm.
    assert found["tricky"] == (6, 16, 4)
    assert found["after"] == (23, 1, 0)


def test_the_workspace_is_measured():
    rows = {crate: files for crate, files in longest.crates(tests=False)}
    assert "vlad" in rows and "vla-control" in rows
    assert all(f.suffix == ".rs" for files in rows.values() for f in files)
