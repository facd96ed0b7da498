"""Writes golden/libero/tasks.json from a checkout of official LIBERO
(github.com/Lifelong-Robot-Learning/LIBERO): per suite, in the benchmark's task order 0, each
task's name, its language as LIBERO's own `grab_language_from_filename` gives it (taken from
that checkout's benchmark/__init__.py, not from the project's code), and the SHA-256 of its
bddl file and init-states file. tools/vla_libero's tests hold the installed stack to it.

Usage: python -m vla_goldens.libero_task_golden LIBERO_CHECKOUT COMMIT > golden/libero/tasks.json"""

import ast
import hashlib
import json
import pathlib
import sys


def main(root: str, commit: str) -> None:
    bench = pathlib.Path(root) / "libero" / "libero" / "benchmark"
    src = (bench / "__init__.py").read_text()
    # Only LIBERO's own language function and task orders, without its imports (torch).
    tree = ast.parse(src)
    keep = [n for n in tree.body if (isinstance(n, ast.FunctionDef) and n.name == "grab_language_from_filename")
            or (isinstance(n, ast.Assign) and any(getattr(t, "id", "") == "task_orders" for t in n.targets))]
    ns: dict = {}
    exec(compile(ast.Module(body=keep, type_ignores=[]), "benchmark", "exec"), ns)  # noqa: S102
    task_map: dict = {}
    exec((bench / "libero_suite_task_map.py").read_text(), task_map)  # noqa: S102
    base = pathlib.Path(root) / "libero" / "libero"
    out = {"source": f"Lifelong-Robot-Learning/LIBERO {commit}", "suites": {}}
    for suite in ("libero_spatial", "libero_object", "libero_goal", "libero_10", "libero_90"):
        names = list(task_map["libero_task_map"][suite])
        if suite != "libero_90":
            names = [names[i] for i in ns["task_orders"][0]]
        out["suites"][suite] = [{
            "name": n, "language": ns["grab_language_from_filename"](n + ".bddl"),
            "bddl_sha256": hashlib.sha256((base / "bddl_files" / suite / f"{n}.bddl").read_bytes()).hexdigest(),
            "init_sha256": hashlib.sha256((base / "init_files" / suite / f"{n}.pruned_init").read_bytes()).hexdigest(),
        } for n in names]
    json.dump(out, sys.stdout, indent=1)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
