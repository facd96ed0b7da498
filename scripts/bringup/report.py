#!/usr/bin/env python3
"""Bring-up report: turns what scripts/bringup/run.sh brought back from a target into
REPORT_DIR/report.md with PNG plots beside it.

Inputs (the results directory, `REPORT_DIR/raw/` when run.sh calls this):
  target.env    key=value facts about the target and the run (written on the target)
  parity.json   `vlad parity --bundle --json`: per-context and end-to-end parity
  bench.json    `vlad bench-bundle --json`: latency per component, host overhead, load
                times, memory (optional: without it the report says what is missing)
  parity-*.json more `vlad parity --bundle --json` runs of the same bundle on other
                observations (optional; each is one more observation per output)
  dsp-probe.jsonl  `vlad dsp-probe`: contexts loaded one by one into one process, then as
                the memory plan places them, with executes per context (optional);
                dsp-probe.log holds QNN's verbose log ("PD N chosen for context M")
  *.log         the commands' own output, linked from the report
  shared-ab/    `vlad bench-context` per context with client buffers (<context>.client.log)
                and with HTP shared buffers (<context>.shared.log), when vlad has
                `--shared-buffers`; bench-shared.json: `vlad bench-bundle --shared-buffers`
                (the whole bundle on shared buffers, beside bench.json)

Besides report.md it writes REPORT_DIR/gates.json, the parity gate it proposes for every
context output: the minimum cosine measured over the N observations less a stated margin
(`--gate-margin`, default GATE_MARGIN), rounded down to 1e-6, for each output (and each stage
of the end-to-end run) whose minimum is below the bundle's default gate; one that meets the
default keeps it. `vlad bundle calibrate DIR
--from gates.json` writes the proposals below the bundle's default into its bundle.json,
with this file's SHA-256 as their reason (docs/bundle-format.md, "Parity gates").

bench.json follows `vlad bench-bundle` (runtime/vlad/src/cmd/bench_bundle.rs): durations in
microseconds (`*_us`; `*_ms` is read too), `components: [{component, p50_us, p99_us}]`,
`total_*`, `execute_*`, `host_overhead_*` (p50/p99 and `host_overhead_pct`),
`policy_load_ms`, `load: {mmap|heap: {load_ms, contexts, rss_delta, pss_delta, anon_delta,
file_delta}}` and `rss_after_policy_load`/`pss_after_policy_load`/`binaries_bytes` in
bytes. Per-iteration `samples_us` lists (per component and `total_samples_us` etc.), when
present, become histograms; without them the plot shows p50/p99. Top-level figures the
report does not use are listed verbatim, never dropped.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (the backend must be chosen first)

MIB = 1024.0


class ReportError(Exception):
    """A result file that cannot be read; the message names the file."""


@dataclass
class Latency:
    name: str
    p50_ms: float | None
    p99_ms: float | None
    samples_ms: list[float] = field(default_factory=list)


@dataclass
class LoadProbe:
    """All contexts loaded in a fresh process, one way of bringing the binaries in."""
    mode: str
    contexts: int | None
    load_ms: float | None
    rss_delta_mib: float | None
    pss_delta_mib: float | None
    anon_delta_mib: float | None
    file_delta_mib: float | None


@dataclass
class Bench:
    iterations: int | None
    warmup: int | None
    components: list[Latency]
    total: Latency | None
    execute: Latency | None
    host: Latency | None
    host_pct: float | None
    policy_load_ms: float | None
    load_probes: list[LoadProbe]
    memory_mib: dict[str, float]
    unrecognised: dict[str, object]


GATE_MARGIN = 0.0005  # below the measured minimum: fp16 noise of observations not measured
GATES_FORMAT = "vla-bringup-gates/1"


@dataclass
class SharedAB:
    """One context's `vlad bench-context` with client buffers and with shared buffers."""
    context: str
    client_p50_ms: float | None
    shared_p50_ms: float | None
    identical: bool | None
    problem: str | None


@dataclass
class Results:
    directory: Path
    target: dict[str, str]
    parity: dict | None
    parity_problem: str | None
    bench: Bench | None
    bench_problem: str | None
    more_parity: list = field(default_factory=list)  # parity-*.json: more observations
    gates: dict | None = None  # the proposed gates (gates.json)
    shared_ab: list[SharedAB] = field(default_factory=list)


def propose_gates(runs: list[dict], margin: float) -> dict:
    """Per context output: the minimum cosine over the parity runs, and that less `margin`
    (rounded down to 1e-6) as the proposed gate. A run of another bundle is refused."""
    first = runs[0]
    measured: dict[tuple[str, str], list[float]] = {}
    staged: dict[str, list[float]] = {}
    for run in runs:
        if (run.get("bundle"), run.get("version")) != (first.get("bundle"), first.get("version")):
            raise ReportError(f"parity runs of different bundles: {first.get('bundle')} {first.get('version')}"
                              f" and {run.get('bundle')} {run.get('version')}")
        for c in run.get("contexts") or []:
            for o in c.get("outputs") or []:
                cos = o.get("cosine")
                # A non-finite output (null) is no measurement to calibrate from: it stays
                # at the default and fails there.
                measured.setdefault((c.get("component"), o.get("name")), []).append(
                    float(cos) if isinstance(cos, (int, float)) else math.nan)
        for st in run.get("stages") or []:
            cos = st.get("cosine")
            staged.setdefault(st.get("name"), []).append(float(cos) if isinstance(cos, (int, float)) else math.nan)
    default = first.get("context_gate")

    def proposal(values: list) -> dict | None:
        if any(math.isnan(v) for v in values):
            return None
        low = min(values)
        # What meets the default keeps it: calibrating must not loosen the gate of a context
        # that does not need it (a tight gate there is what catches a wrong binary).
        gate = default if default is not None and low >= default else math.floor((low - margin) * 1e6) / 1e6
        return {"observations": len(values), "min_cosine": low, "max_cosine": max(values), "proposed_gate": gate}

    outputs = [{"context": c, "output": o, **p} for (c, o), v in measured.items() if (p := proposal(v))]
    stages = [{"stage": name, **p} for name, v in staged.items() if (p := proposal(v))]
    return {"format": GATES_FORMAT, "bundle": first.get("bundle"), "version": first.get("version"),
            "margin": margin, "default_gate": first.get("context_gate"),
            "end_to_end_gate": first.get("end_to_end_gate"), "outputs": outputs, "stages": stages}



def _steady_p50_ms(text: str) -> float | None:
    for line in text.splitlines():
        words = line.split()
        if "steady" in words and "p50" in words[:-1]:
            try:
                return float(words[words.index("p50") + 1])
            except ValueError:
                return None
    return None


def _error_line(text: str) -> str | None:
    errors = [l.strip() for l in text.splitlines() if l.startswith("vlad: error:")]
    return errors[-1] if errors else None


def read_shared_ab(directory: Path) -> list[SharedAB]:
    rows = []
    for client in sorted(directory.glob("*.client.log")):
        context = client.name[: -len(".client.log")]
        shared = directory / f"{context}.shared.log"
        c = client.read_text(errors="replace")
        s = shared.read_text(errors="replace") if shared.is_file() else ""
        identical = None
        if "outputs bit-identical to client buffers: yes" in s:
            identical = True
        elif "outputs bit-identical to client buffers: NO" in s:
            identical = False
        problem = _error_line(s) or (None if s else f"no {shared.name}")
        if _steady_p50_ms(c) is None:
            problem = _error_line(c) or f"{client.name} has no steady-state figure"
        rows.append(SharedAB(context, _steady_p50_ms(c), _steady_p50_ms(s), identical, problem))
    return rows


def shared_verdict(rows: list[SharedAB]) -> str:
    """Which I/O the daemon should use, by what the contexts did."""
    failed = [r for r in rows if r.problem or r.identical is not True or r.shared_p50_ms is None]
    if failed:
        r = failed[0]
        why = r.problem or ("outputs differ from client buffers" if r.identical is False
                            else "no shared-buffer figure")
        return (f"**Use client buffers** (`npu.shared_buffers: off` or `auto`): shared buffers"
                f" failed for {len(failed)} of {len(rows)} contexts; first, {r.context}: {why}")
    client = sum(r.client_p50_ms or 0.0 for r in rows)
    shared = sum(r.shared_p50_ms or 0.0 for r in rows)
    if shared <= client:
        return (f"**Use shared buffers** (`npu.shared_buffers: auto`): every context ran on them"
                f" with bit-identical outputs, p50 execute sum {shared:.3f} ms against"
                f" {client:.3f} ms with client buffers")
    return (f"**Use client buffers**: shared buffers ran with bit-identical outputs but the p50"
            f" execute sum is {shared:.3f} ms against {client:.3f} ms with client buffers")


def read_env(path: Path) -> dict[str, str]:
    facts: dict[str, str] = {}
    if not path.is_file():
        return facts
    for line in path.read_text(errors="replace").splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip():
            facts[key.strip()] = value.strip()
    return facts


def read_json(path: Path) -> dict:
    try:
        doc = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError) as e:
        raise ReportError(f"{path}: cannot read: {e}") from e
    except json.JSONDecodeError as e:
        raise ReportError(f"{path}: not valid JSON: {e}") from e
    if not isinstance(doc, dict):
        raise ReportError(f"{path}: top level is {type(doc).__name__}, expected an object")
    return doc


def _number(v) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    return float(v) if math.isfinite(v) else None


def _ms(d: dict, stem: str) -> tuple[float | None, list[str]]:
    """`stem_us` (or `stem_ms`) of `d` in milliseconds, and the key it came from."""
    for suffix, scale in (("_us", 1e-3), ("_ms", 1.0)):
        v = _number(d.get(stem + suffix))
        if v is not None:
            return v * scale, [stem + suffix]
    return None, []


def _samples_ms(d: dict, stem: str) -> tuple[list[float], list[str]]:
    for suffix, scale in (("samples_us", 1e-3), ("samples_ms", 1.0)):
        key = stem + suffix
        if isinstance(d.get(key), list):
            return [v * scale for v in map(_number, d[key]) if v is not None], [key]
    return [], []


def _latency(name: str, d: dict, prefix: str = "") -> tuple[Latency | None, list[str]]:
    """A p50/p99 (+ samples) figure stored as `{prefix}p50_us`... in `d`."""
    p50, k1 = _ms(d, prefix + "p50")
    p99, k2 = _ms(d, prefix + "p99")
    samples, k3 = _samples_ms(d, prefix)
    if p50 is None and p99 is None and not samples:
        return None, []
    return Latency(name, p50, p99, samples), k1 + k2 + k3


def _mib(v) -> float | None:
    n = _number(v)
    return None if n is None else n / (MIB * MIB)


def parse_bench(doc: dict) -> Bench:
    used = {"bundle", "name", "policy", "version", "iterations", "warmup"}
    components: list[Latency] = []
    if isinstance(doc.get("components"), list):
        used.add("components")
        for i, c in enumerate(doc["components"]):
            if isinstance(c, dict):
                lat, _ = _latency(str(c.get("component") or c.get("name") or f"#{i}"), c)
                if lat:
                    components.append(lat)
    figures = {}
    for stem, name in (("total", "end to end"), ("execute", "execute sum"),
                       ("host_overhead", "host overhead")):
        lat, keys = _latency(name, doc, stem + "_")
        figures[stem] = lat
        used.update(keys)
    host_pct = _number(doc.get("host_overhead_pct"))
    policy_load_ms, keys = _ms(doc, "policy_load")
    used.update([*keys, "host_overhead_pct"])
    probes: list[LoadProbe] = []
    if isinstance(doc.get("load"), dict):
        used.add("load")
        for mode, probe in doc["load"].items():
            if not isinstance(probe, dict):
                continue
            contexts = _number(probe.get("contexts"))
            probes.append(LoadProbe(
                mode=str(probe.get("mode", mode)),
                contexts=int(contexts) if contexts is not None else None,
                load_ms=_ms(probe, "load")[0],
                rss_delta_mib=_mib(probe.get("rss_delta")),
                pss_delta_mib=_mib(probe.get("pss_delta")),
                anon_delta_mib=_mib(probe.get("anon_delta")),
                file_delta_mib=_mib(probe.get("file_delta")),
            ))
    memory: dict[str, float] = {}
    # Shown in "Shared buffers (end to end)".
    used.update(("npu_io", "npu_client_buffer_bytes_per_inference",
                 "host_copy_bytes_per_inference", "rss_after_inferences", "pss_after_inferences"))
    for key, label in (("rss_after_policy_load", "RSS after the policy is loaded"),
                       ("pss_after_policy_load", "PSS after the policy is loaded"),
                       ("binaries_bytes", "context binaries on disk")):
        v = _mib(doc.get(key))
        if v is not None:
            memory[label] = v
            used.add(key)
    iterations = _number(doc.get("iterations"))
    warmup = _number(doc.get("warmup"))
    return Bench(
        iterations=int(iterations) if iterations is not None else None,
        warmup=int(warmup) if warmup is not None else None,
        components=components,
        total=figures["total"],
        execute=figures["execute"],
        host=figures["host_overhead"],
        host_pct=host_pct,
        policy_load_ms=policy_load_ms,
        load_probes=probes,
        memory_mib=memory,
        unrecognised={k: v for k, v in doc.items() if k not in used},
    )


def load_results(directory: Path) -> Results:
    target = read_env(directory / "target.env")
    parity = None
    parity_problem = None
    parity_path = directory / "parity.json"
    if parity_path.is_file():
        try:
            parity = read_json(parity_path)
        except ReportError as e:
            parity_problem = str(e)
    else:
        parity_problem = (f"vlad parity wrote no parity.json (exit {target.get('parity_exit', '?')});"
                          " see parity.log")
    bench = None
    bench_problem = None
    bench_path = directory / "bench.json"
    if bench_path.is_file():
        try:
            bench = parse_bench(read_json(bench_path))
        except ReportError as e:
            bench_problem = str(e)
    elif target.get("bench_exit") == "unavailable":
        bench_problem = ("the deployed vlad has no `bench-bundle` command, so there are no"
                         " latency distributions, host overhead or memory figures; rebuild"
                         " vlad from a tree that has it and run again")
    else:
        bench_problem = (f"vlad bench-bundle wrote no bench.json (exit"
                         f" {target.get('bench_exit', '?')}); see bench.log")
    more = [read_json(p) for p in sorted(directory.glob("parity-*.json"))]
    shared_ab = read_shared_ab(directory / "shared-ab")
    return Results(directory, target, parity, parity_problem, bench, bench_problem, more,
                   shared_ab=shared_ab)


def action_geometry(bundle_dir: Path | None, n_values: int) -> tuple[int, int]:
    """(chunk length, action dims) of the bundle's action chunk."""
    dims = None
    if bundle_dir is not None and (bundle_dir / "bundle.json").is_file():
        manifest = read_json(bundle_dir / "bundle.json")
        section = manifest.get(str(manifest.get("policy", "")), {})
        if isinstance(section, dict):
            dims = _number(section.get("action_dims"))
    if not dims or n_values % int(dims):
        dims = 7 if n_values % 7 == 0 else 1
    return n_values // int(dims), int(dims)


# --- plots ---------------------------------------------------------------------------

def plot_actions(parity: dict, bundle_dir: Path | None, path: Path) -> bool:
    e2e = parity.get("end_to_end") or {}
    ours = [float(v) for v in e2e.get("actions") or []]
    golden = [float(v) for v in e2e.get("expected") or []]
    if not ours or len(ours) != len(golden):
        return False
    steps, dims = action_geometry(bundle_dir, len(ours))
    cols = min(dims, 4)
    rows = math.ceil(dims / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.6 * cols, 2.6 * rows), squeeze=False,
                             sharex=True)
    x = range(steps)
    for d in range(rows * cols):
        ax = axes[d // cols][d % cols]
        if d >= dims:
            ax.axis("off")
            continue
        ax.plot(x, golden[d::dims], "-", color="0.55", lw=3, label="golden (reference)")
        ax.plot(x, ours[d::dims], "o-", color="tab:blue", ms=3, lw=1.2, label="target")
        ax.set_title(f"action dim {d}", fontsize=9)
        ax.grid(alpha=0.3)
        if d // cols == rows - 1 or d + cols >= dims:
            ax.set_xlabel("step in chunk")
    handles, labels = axes[0][0].get_legend_handles_labels()
    if dims < rows * cols:
        # The spare panel holds the legend, so no curve is hidden behind it.
        axes[-1][-1].legend(handles, labels, loc="center", fontsize=9)
    else:
        fig.legend(handles, labels, loc="lower center", ncols=2, fontsize=8)
    cos = e2e.get("cosine")
    fig.suptitle(f"Action chunk: target vs golden (cosine {cos:.8f})" if cos is not None
                 else "Action chunk: target vs golden")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def plot_latency(bench: Bench, path: Path) -> str | None:
    """Histograms when per-iteration samples exist, else p50/p99 bars. Returns the kind."""
    series = [lat for lat in [*bench.components, bench.host, bench.total] if lat]
    if not series:
        return None
    with_samples = [lat for lat in series if lat.samples_ms]
    if with_samples:
        cols = min(len(with_samples), 3)
        rows = math.ceil(len(with_samples) / cols)
        fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 2.8 * rows), squeeze=False)
        for i in range(rows * cols):
            ax = axes[i // cols][i % cols]
            if i >= len(with_samples):
                ax.axis("off")
                continue
            lat = with_samples[i]
            ax.hist(lat.samples_ms, bins=min(40, max(5, len(lat.samples_ms) // 2)),
                    color="tab:blue", alpha=0.8)
            for value, style, label in ((lat.p50_ms, "--", "p50"), (lat.p99_ms, ":", "p99")):
                if value is not None:
                    ax.axvline(value, color="tab:red", ls=style, lw=1.2,
                               label=f"{label} {value:.3g} ms")
            ax.set_title(lat.name, fontsize=9)
            ax.set_xlabel("ms")
            ax.legend(fontsize=7)
        fig.suptitle(f"Latency per component ({len(with_samples[0].samples_ms)} iterations)")
        kind = "histogram"
    else:
        fig, ax = plt.subplots(figsize=(max(5.0, 1.1 * len(series) + 2), 3.4))
        names = [lat.name for lat in series]
        xs = range(len(series))
        ax.bar([x - 0.2 for x in xs], [lat.p50_ms or 0 for lat in series], 0.4, label="p50")
        ax.bar([x + 0.2 for x in xs], [lat.p99_ms or 0 for lat in series], 0.4, label="p99")
        ax.set_xticks(list(xs), names, rotation=30, ha="right", fontsize=8)
        values = [v for lat in series for v in (lat.p50_ms, lat.p99_ms) if v]
        if values and max(values) > 100 * min(values):
            # Host overhead is often 1e-4 of an inference: keep it visible.
            ax.set_yscale("log")
        ax.set_ylabel("ms")
        ax.legend()
        fig.suptitle("Latency per component, p50 and p99 (no per-iteration samples in bench.json)")
        kind = "percentiles"
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return kind


def plot_parity(parity: dict, path: Path) -> bool:
    # Each output against the gate it was held to (its own entry, else the default).
    rows = [(c.get("component", "?"), o.get("name", "?"), o.get("cosine"), o.get("gate", parity.get("context_gate")))
            for c in parity.get("contexts") or [] for o in c.get("outputs") or []]
    e2e = parity.get("end_to_end") or {}
    rows.append(("end to end", "actions", e2e.get("cosine"), parity.get("end_to_end_gate")))
    gates = [g for *_, cos, g in rows if isinstance(cos, (int, float))]
    rows = [(c, o, cos) for c, o, cos, _ in rows if isinstance(cos, (int, float))]
    if not rows:
        return False
    # 1 - cosine on a log axis: the gates (1e-4, 1e-3) and typical results (1e-6..1e-8)
    # are all visible at once.
    gaps = [max(1.0 - cos, 1e-12) for _, _, cos in rows]
    labels = [f"{c}\n{o}" for c, o, _ in rows]
    fig, ax = plt.subplots(figsize=(min(12.0, max(5.0, 0.6 * len(rows) + 2)), 3.8))
    colors = []
    for gate, gap in zip(gates, gaps):
        ok = not isinstance(gate, (int, float)) or gap <= 1.0 - gate
        colors.append("tab:green" if ok else "tab:red")
    ax.bar(range(len(rows)), gaps, color=colors)
    ax.set_yscale("log")
    for gate, style, name in ((parity.get("context_gate"), "--", "context gate"),
                              (parity.get("end_to_end_gate"), ":", "end-to-end gate")):
        if isinstance(gate, (int, float)):
            ax.axhline(1.0 - gate, color="0.3", ls=style, lw=1, label=f"{name} (cos {gate})")
    ax.set_xticks(range(len(rows)), labels, fontsize=7, rotation=30, ha="right")
    ax.set_ylabel("1 - cosine (lower is better)")
    # Headroom above the gates keeps the legend off the bars.
    ax.set_ylim(top=max(1e-2, 10 * max(gaps)))
    ax.legend(fontsize=8, loc="upper right", ncols=2)
    fig.suptitle("Parity against the golden reference")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


# --- Markdown ------------------------------------------------------------------------

def _fmt(v, spec: str = ".3f", none: str = "n/a") -> str:
    return none if v is None else format(v, spec)


def _verdict(ok) -> str:
    return "PASS" if ok else "FAIL"


def render(results: Results, bundle_dir: Path | None, target_name: str, out: Path) -> str:
    t = results.target
    p = results.parity
    lines: list[str] = []
    name = (p or {}).get("bundle") or (bundle_dir.name if bundle_dir else "bundle")
    version = (p or {}).get("version", "")
    lines.append(f"# Bring-up report: {name} {version} on {target_name}".rstrip())
    lines.append("")
    verdict = ("**Parity: " + _verdict(p.get("passed")) + "**") if p else "**Parity: NO RESULT**"
    arch = t.get("arch", "?")
    on = ("the x86_64 HTP emulator (libQnnHtp.so from onnxruntime-qnn), not an NPU"
          if arch == "x86_64" else "the Hexagon v73 NPU" if arch == "aarch64" else arch)
    lines.append(f"{verdict} — contexts executed on {on}.")
    lines.append("")

    lines.append("## Target")
    lines.append("")
    lines.append("| fact | value |")
    lines.append("|---|---|")
    for key, label in (("hostname", "host"), ("arch", "architecture"), ("os", "OS"),
                       ("kernel", "kernel"), ("soc_id", "soc_id"),
                       ("mem_total_kib", "memory (KiB)"), ("vlad_version", "vlad"),
                       ("qnn_lib_dir", "QAIRT library dir"),
                       ("adsp_library_path", "ADSP_LIBRARY_PATH"),
                       ("ring_check", "rings in /dev/shm (vla-ring-bridge: poll, publish, refusal)"),
                       ("started_utc", "started (UTC)"), ("finished_utc", "finished (UTC)")):
        if t.get(key):
            lines.append(f"| {label} | `{t[key]}` |")
    if "uploaded_files" in t:
        lines.append(f"| deployed | {t['uploaded_files']} files uploaded"
                     f" ({int(t.get('uploaded_bytes', 0)) / MIB / MIB:.1f} MiB),"
                     f" {t.get('cached_files', '?')} reused from the target's cache |")
    if t.get("workspace_removed"):
        lines.append(f"| temporary workspace removed | {t['workspace_removed']} |")
    lines.append("")

    lines.append("## Parity")
    lines.append("")
    if p is None:
        lines.append(f"No parity result: {results.parity_problem}.")
    else:
        lines.append(f"Gates: every context output cosine >= {p.get('context_gate')} unless the bundle"
                     " gives the output its own gate (column gate, with where it came from),"
                     f" end-to-end action chunk cosine >= {p.get('end_to_end_gate')}.")
        lines.append("")
        lines.append("| component | output | shape | cosine | max abs diff | within tol. |"
                     " execute ms | gate | verdict |")
        lines.append("|---|---|---|---:|---:|---:|---:|---|---|")
        for c in p.get("contexts") or []:
            for o in c.get("outputs") or []:
                shape = "x".join(str(s) for s in o.get("shape") or [])
                gate = o.get("gate", p.get("context_gate"))
                source = o.get("gate_from", "parity.context_cosine")
                if o.get("gate_reason"):
                    source += f": {o['gate_reason']}"
                lines.append(
                    f"| {c.get('component')} | {o.get('name')} | {shape} |"
                    f" {_fmt(o.get('cosine'), '.8f')} | {_fmt(o.get('max_abs_diff'), '.3e')} |"
                    f" {_fmt(o.get('within_tolerance'), '.1%')} |"
                    f" {_fmt(c.get('execute_ms'), '.2f')} | {gate} ({source}) | {_verdict(o.get('passed'))} |")
        e = p.get("end_to_end") or {}
        ks = e.get("keystone")
        ks_text = f", KeyStone chose {ks.get('ours')} (golden {ks.get('golden')})" if ks else ""
        lines.append(f"| **end to end** | action chunk | {len(e.get('actions') or [])} values |"
                     f" {_fmt(e.get('cosine'), '.8f')} | {_fmt(e.get('max_abs_diff'), '.3e')} |"
                     f" | | {p.get('end_to_end_gate')} | **{_verdict(e.get('passed'))}**{ks_text} |")
        lines.append("")
        gates = results.gates
        if gates is not None:
            n = max((o["observations"] for o in gates["outputs"]), default=0)
            lines.append(f"Proposed gates ([`gates.json`](gates.json)): each output below the default"
                         f" gets its minimum cosine over {n} observation(s) less {gates['margin']}; `vlad bundle calibrate DIR --from"
                         f" gates.json` writes those below the default {gates['default_gate']} into"
                         " bundle.json (the end-to-end gate is never changed).")
            ran = str(results.target.get("observations", ""))
            if ran.isdigit() and int(ran) != len(results.more_parity):
                # A run that crashed wrote no parity-<name>.json: the minimum is then over fewer
                # observations than the board was asked to measure, which the reader must know.
                lines.append("")
                lines.append(f"**Only {len(results.more_parity)} of the {ran} more observation runs wrote"
                             " a `parity-<name>.json`** (see their `parity-<name>.log`): these gates are"
                             f" from {n} observation(s), not {int(ran) + 1}.")
            lines.append("")
            lines.append("| component | output | observations | min cosine | proposed gate |")
            lines.append("|---|---|---:|---:|---:|")
            for o in gates["outputs"]:
                lines.append(f"| {o['context']} | {o['output']} | {o['observations']} |"
                             f" {o['min_cosine']:.8f} | {o['proposed_gate']:.6f} |")
            for st in gates["stages"]:
                lines.append(f"| stage | {st['stage']} | {st['observations']} |"
                             f" {st['min_cosine']:.8f} | {st['proposed_gate']:.6f} |")
            lines.append("")
        if plot_parity(p, out / "parity.png"):
            lines.append("![parity per context and end to end](parity.png)")
            lines.append("")
        if plot_actions(p, bundle_dir, out / "actions.png"):
            lines.append("Action chunk from the target (dots) over the golden reference"
                         " (grey), one panel per action dimension:")
            lines.append("")
            lines.append("![action trajectories, target vs golden](actions.png)")
            lines.append("")

    lines.append("## Latency")
    lines.append("")
    b = results.bench
    if b is None:
        lines.append(f"> **No benchmark:** {results.bench_problem}.")
        if p:
            lines.append("")
            lines.append("Single executions from the parity run (first runs, warm-up"
                         " included, so not steady-state figures):")
            lines.append("")
            lines.append("| component | execute ms |")
            lines.append("|---|---:|")
            for c in p.get("contexts") or []:
                lines.append(f"| {c.get('component')} | {_fmt(c.get('execute_ms'), '.2f')} |")
        lines.append("")
    else:
        its = f" over {b.iterations} iterations" if b.iterations else ""
        warm = f" after {b.warmup} warm-up" if b.warmup is not None else ""
        lines.append(f"Steady-state latency{its}{warm} (`vlad bench-bundle`), one inference"
                     " on the bundle's golden observation:")
        lines.append("")
        lines.append("| component | p50 ms | p99 ms |")
        lines.append("|---|---:|---:|")
        for lat in b.components:
            lines.append(f"| {lat.name} | {_fmt(lat.p50_ms)} | {_fmt(lat.p99_ms)} |")
        for lat in (b.execute, b.host, b.total):
            if lat:
                lines.append(f"| **{lat.name}** | {_fmt(lat.p50_ms)} | {_fmt(lat.p99_ms)} |")
        lines.append("")
        if b.host:
            share = (f" ({b.host_pct:.2f}% of the context execute time at the median)"
                     if b.host_pct is not None else "")
            lines.append(f"Host overhead (pre/post-processing and glue between the contexts,"
                         f" i.e. end to end minus execute): p50 {_fmt(b.host.p50_ms)} ms,"
                         f" p99 {_fmt(b.host.p99_ms)} ms{share}.")
        else:
            lines.append("bench.json reports no host overhead.")
        lines.append("")
        kind = plot_latency(b, out / "latency.png")
        if kind == "histogram":
            lines.append("![latency histogram per component](latency.png)")
        elif kind == "percentiles":
            lines.append("bench.json carries no per-iteration samples, so the plot shows"
                         " p50/p99 per component rather than histograms.")
            lines.append("")
            lines.append("![latency p50/p99 per component](latency.png)")
        lines.append("")

    lines.append("## Context load times")
    lines.append("")
    if b and b.load_probes:
        lines.append("Every context loaded in a fresh process (nothing else resident):")
        lines.append("")
        lines.append("| binaries | contexts | load ms | RSS added MiB | PSS added MiB |"
                     " of which anon | of which file |")
        lines.append("|---|---:|---:|---:|---:|---:|---:|")
        for lp in b.load_probes:
            how = {"mmap": "mapped (mmap)", "heap": "read into memory"}.get(lp.mode, lp.mode)
            lines.append(f"| {how} | {_fmt(lp.contexts, 'd')} | {_fmt(lp.load_ms, '.1f')} |"
                         f" {_fmt(lp.rss_delta_mib, '.2f')} | {_fmt(lp.pss_delta_mib, '.2f')} |"
                         f" {_fmt(lp.anon_delta_mib, '.2f')} | {_fmt(lp.file_delta_mib, '.2f')} |")
        lines.append("")
    loads = []
    if b and b.policy_load_ms is not None:
        loads.append(f"the whole policy loaded in **{b.policy_load_ms:.1f} ms** (bench-bundle)")
    if p is not None and _number(p.get("load_ms")) is not None:
        loads.append(f"{p['load_ms']:.1f} ms in the parity run")
    if loads:
        lines.append("Policy load: " + "; ".join(loads) + ".")
    elif not (b and b.load_probes):
        lines.append("No load time was reported.")
    lines.append("")

    lines.append("## Memory")
    lines.append("")
    if b and b.memory_mib:
        lines.append("| measure | MiB |")
        lines.append("|---|---:|")
        for k, v in b.memory_mib.items():
            lines.append(f"| {k} | {v:.1f} |")
    else:
        lines.append("No memory figures (they come from `vlad bench-bundle`).")
    lines.append("")
    if b and b.unrecognised:
        lines.append("Other figures in bench.json:")
        lines.append("")
        lines.append("```json")
        lines.append(json.dumps(b.unrecognised, indent=2, sort_keys=True)[:4000])
        lines.append("```")
        lines.append("")

    lines.extend(dsp_section(results.directory))

    lines.append("## Shared buffers (per context)")
    lines.append("")
    if results.shared_ab:
        lines.append("`vlad bench-context` per context, client buffers against HTP shared buffers"
                     " (rpcmem registered with QNN; outputs checked bit for bit).")
        lines.append("")
        lines.append("| context | client p50 ms | shared p50 ms | bit-identical | problem |")
        lines.append("|---|---:|---:|---|---|")
        for r in results.shared_ab:
            same = {True: "yes", False: "NO", None: "n/a"}[r.identical]
            problem = (r.problem or "").replace("|", "\\|")
            lines.append(f"| {r.context} | {_fmt(r.client_p50_ms)} | {_fmt(r.shared_p50_ms)} |"
                         f" {same} | {problem} |")
        lines.append("")
        lines.append(shared_verdict(results.shared_ab))
    else:
        lines.append("No shared-buffer A/B (run.sh `--shared-ab off`, or the deployed vlad's"
                     " `bench-context` has no `--shared-buffers`).")
    lines.append("")
    lines.extend(shared_end_to_end(results.directory))

    lines.append("## Raw results")
    lines.append("")
    raw = results.directory
    try:
        rel = raw.resolve().relative_to(out.resolve())
    except ValueError:
        rel = raw.resolve()
    for f in sorted(raw.iterdir()):
        lines.append(f"- [`{f.name}`]({rel / f.name})")
    lines.append("")
    return "\n".join(lines)


def read_probe(directory: Path) -> list[dict]:
    """The objects of dsp-probe.jsonl (lines that are not JSON objects are skipped)."""
    path = directory / "dsp-probe.jsonl"
    found: list[dict] = []
    if not path.is_file():
        return found
    for line in path.read_text(errors="replace").splitlines():
        try:
            doc = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(doc, dict) and "probe" in doc:
            found.append(doc)
    return found


def pd_choices(directory: Path) -> list[str]:
    """QNN's own process-domain choices from its verbose log, in order."""
    path = directory / "dsp-probe.log"
    if not path.is_file():
        return []
    return [line[line.index("PD "):].strip() for line in path.read_text(errors="replace").splitlines()
            if " chosen for context " in line and "PD " in line]


def placement_to_use(probe: list[dict]) -> str:
    """The placement the daemon should run with, from the probe's outcomes and executes."""
    outcome = {d.get("placement"): d for d in probe if d.get("probe") == "outcome"}
    jumps = {d.get("placement") for d in probe if d.get("probe") == "execute" and d.get("jumps")}
    plan = outcome.get("plan")
    if plan and plan.get("all_loaded") and "plan" not in jumps:
        return f"the memory plan, `npu.placement` as configured: {plan.get('use', '')}"
    if plan and plan.get("all_loaded"):
        return ("the memory plan loads, but executes jumped (graph switching suspected): lower"
                " `npu.session_mb` or place fewer contexts per session, and run again")
    if plan:
        return (f"none in one process: the plan failed at `{plan.get('failed_at')}`; the"
                " contexts need worker processes (docs/dsp-memory.md)")
    return "unknown: the probe did not reach the memory plan"


def shared_end_to_end(directory: Path) -> list[str]:
    """The whole bundle with client buffers (bench.json) and on HTP shared buffers
    (shared-ab/bench-shared.json): latency, memory after the policy load, bytes copied."""
    lines = ["## Shared buffers (end to end)", ""]
    shared_path = directory / "shared-ab" / "bench-shared.json"
    log = directory / "shared-ab" / "bench-shared.log"
    if not shared_path.is_file():
        if log.is_file():
            why = _error_line(log.read_text(errors="replace")) or "see shared-ab/bench-shared.log"
            lines += [f"`vlad bench-bundle --shared-buffers` wrote no figures: {why}", ""]
        else:
            lines += ["No end-to-end shared-buffer run (run.sh `--shared-ab off`, or the"
                      " deployed vlad's `bench-bundle` has no `--shared-buffers`).", ""]
        return lines
    docs = {}
    for mode, path in (("client", directory / "bench.json"), ("shared", shared_path)):
        try:
            docs[mode] = read_json(path) if path.is_file() else {}
        except ReportError as e:
            lines += [f"{path.name}: {e}", ""]
            docs[mode] = {}
    rows = (("end to end p50 ms", "total_p50_us", 1e-3, ".3f"),
            ("execute sum p50 ms", "execute_p50_us", 1e-3, ".3f"),
            ("RSS after policy load MiB", "rss_after_policy_load", 1 / (MIB * MIB), ".1f"),
            ("PSS after policy load MiB", "pss_after_policy_load", 1 / (MIB * MIB), ".1f"),
            ("RSS after the inferences MiB", "rss_after_inferences", 1 / (MIB * MIB), ".1f"),
            ("PSS after the inferences MiB", "pss_after_inferences", 1 / (MIB * MIB), ".1f"),
            ("NPU I/O in client buffers per inference, bytes",
             "npu_client_buffer_bytes_per_inference", 1, ".0f"),
            ("host copies per inference, bytes", "host_copy_bytes_per_inference", 1, ".0f"))
    lines += ["`vlad bench-bundle` on the bundle's golden observation with client buffers"
              " (bench.json) and with `--shared-buffers` (every context's I/O in registered"
              " memory, chained contexts sharing it). Client buffers become resident in the"
              " first inference, the arena when the policy moves onto it: compare memory"
              " after the inferences.", "",
              "| figure | client buffers | shared buffers |", "|---|---:|---:|"]
    for label, key, scale, spec in rows:
        cells = []
        for mode in ("client", "shared"):
            v = _number(docs[mode].get(key))
            cells.append(_fmt(None if v is None else v * scale, spec))
        lines.append(f"| {label} | {cells[0]} | {cells[1]} |")
    io = docs["shared"].get("npu_io")
    if io != "shared":
        lines += ["", f"The shared run reports its NPU I/O as `{io}`, not `shared`."]
    lines.append("")
    return lines


def dsp_section(directory: Path) -> list[str]:
    probe = read_probe(directory)
    lines = ["## DSP memory (`vlad dsp-probe`)", ""]
    if not probe:
        lines += ["No DSP memory probe in the results (skipped, or the deployed vlad has no"
                  " `dsp-probe` command).", ""]
        return lines
    for d in probe:
        if d.get("probe") == "platform":
            lines += [f"Platform: {d.get('info', '?')}.", ""]
    lines += ["Contexts created one by one in one process, as before the memory plan:", "",
              "| # | context | loaded | load ms | RSS MiB | PSS MiB |", "|---:|---|---|---:|---:|---:|"]
    for d in probe:
        if d.get("probe") == "load" and d.get("placement") == "one-process":
            ok = "yes" if d.get("ok") else f"**no**: {d.get('error', '')}"
            lines.append(f"| {d.get('index', '')} | {d.get('context', '')} | {ok} |"
                         f" {_fmt(_number(d.get('load_ms')), '.1f')} | {_fmt(_mib(d.get('rss')), '.1f')} |"
                         f" {_fmt(_mib(d.get('pss')), '.1f')} |")
    lines.append("")
    for d in probe:
        if d.get("probe") == "outcome" and d.get("placement") == "one-process":
            lines.append("All contexts loaded in one process." if d.get("all_loaded") else
                         f"**Loading failed at `{d.get('failed_at')}`** in one process.")
        if d.get("probe") == "plan":
            lines.append(f"Memory plan: `{d.get('summary', '')}`.")
        if d.get("probe") == "load" and d.get("placement") == "plan":
            if d.get("ok"):
                lines.append(f"As planned: loaded in {_fmt(_number(d.get('load_ms')), '.1f')} ms,"
                             f" RSS {_fmt(_mib(d.get('rss')), '.1f')} MiB, PSS"
                             f" {_fmt(_mib(d.get('pss')), '.1f')} MiB ({d.get('spill_fill', '')}).")
            else:
                lines.append(f"**As planned: loading failed at `{d.get('context')}`**: {d.get('error', '')}")
    lines.append("")
    execs = [d for d in probe if d.get("probe") == "execute"]
    if execs:
        lines += ["| placement | context | median ms | max ms | runs | jumps (run index) |",
                  "|---|---|---:|---:|---:|---|"]
        for d in execs:
            runs = d.get("runs_ms") or []
            jumps = ", ".join(str(j) for j in d.get("jumps") or []) or "none"
            lines.append(f"| {d.get('placement')} | {d.get('context')} |"
                         f" {_fmt(_number(d.get('median_ms')), '.2f')} | {_fmt(_number(d.get('max_ms')), '.2f')} |"
                         f" {len(runs)} | {jumps} |")
        lines.append("")
    pds = pd_choices(directory)
    if pds:
        lines += ["QNN's process domains (its verbose log):", ""]
        lines += [f"- {c}" for c in pds]
        lines.append("")
    lines += [f"**Placement to use:** {placement_to_use(probe)}.", ""]
    return lines


def build_report(results_dir: Path, bundle_dir: Path | None, target_name: str,
                 out: Path, margin: float = GATE_MARGIN) -> Path:
    if not results_dir.is_dir():
        raise ReportError(f"{results_dir}: no such results directory")
    out.mkdir(parents=True, exist_ok=True)
    for stale in ("parity.png", "actions.png", "latency.png"):
        (out / stale).unlink(missing_ok=True)
    results = load_results(results_dir)
    (out / "gates.json").unlink(missing_ok=True)
    if results.parity is not None:
        results.gates = propose_gates([results.parity, *results.more_parity], margin)
        (out / "gates.json").write_text(json.dumps(results.gates, indent=2) + "\n")
    text = render(results, bundle_dir, target_name, out)
    path = out / "report.md"
    path.write_text(text)
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--results", type=Path, required=True, help="directory run.sh brought back")
    ap.add_argument("--bundle", type=Path, help="the bundle that was deployed (for its geometry)")
    ap.add_argument("--target", default="the target", help="name of the target for the title")
    ap.add_argument("--out", type=Path, required=True, help="report directory")
    ap.add_argument("--gate-margin", type=float, default=GATE_MARGIN,
                    help=f"proposed gate = measured minimum cosine less this (default {GATE_MARGIN})")
    args = ap.parse_args(argv)
    if not 0 <= args.gate_margin < 1:
        ap.error(f"--gate-margin {args.gate_margin} is not in [0, 1)")
    try:
        path = build_report(args.results, args.bundle, args.target, args.out, args.gate_margin)
    except ReportError as e:
        print(f"report: {e}", file=sys.stderr)
        return 1
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
