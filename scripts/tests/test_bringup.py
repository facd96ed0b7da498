"""scripts/bringup/report.py: the bring-up report from what a target sent back.

The SSH round trip itself is tested by scripts/bringup/tests/loopback.sh; here the report is
built from result files written by hand, so every branch (benchmark present, missing,
broken; parity passed, failed, absent) is covered without a target.
"""

import importlib.util
import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
FASTWAM = REPO / "golden" / "bundles" / "fastwam"

_spec = importlib.util.spec_from_file_location("bringup_report", REPO / "scripts/bringup/report.py")
report = importlib.util.module_from_spec(_spec)
sys.modules["bringup_report"] = report  # dataclasses look their module up there
_spec.loader.exec_module(report)

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def parity_doc(passed=True, steps=32, dims=7):
    golden = [((i * 37) % 11 - 5) / 10 for i in range(steps * dims)]
    ours = [v + (0.0 if passed else (0.5 if i % 3 else -0.5)) for i, v in enumerate(golden)]
    return {
        "bundle": "fastwam-libero-tiny",
        "version": "0.1.0",
        "policy": "fastwam",
        "load_ms": 6.5,
        "context_gate": 0.9999,
        "end_to_end_gate": 0.999,
        "contexts": [{
            "component": "action_step",
            "execute_ms": 118.1,
            "passed": passed,
            "outputs": [{"name": "pred_noise", "shape": [1, 32, 7],
                         "cosine": 0.99999 if passed else 0.98, "max_abs_diff": 0.01,
                         "within_tolerance": 0.8, "passed": passed}],
        }],
        "end_to_end": {"cosine": 0.9999998 if passed else 0.7, "max_abs_diff": 1e-3,
                       "keystone": None, "passed": passed,
                       "actions": ours, "expected": golden},
        "passed": passed,
    }


def bench_doc(samples=True):
    doc = {
        "bundle": "fastwam", "name": "fastwam-libero-tiny", "policy": "fastwam",
        "iterations": 20, "warmup": 3,
        "total_p50_us": 1500.0, "total_p99_us": 2500.0,
        "execute_p50_us": 1400.0, "execute_p99_us": 2400.0,
        "host_overhead_p50_us": 100.0, "host_overhead_p99_us": 120.0,
        "host_overhead_pct": 7.1,
        "components": [{"component": "action_step", "p50_us": 1400.0, "p99_us": 2400.0}],
        "policy_load_ms": 12.5,
        "rss_after_policy_load": 64 * 1024 * 1024, "pss_after_policy_load": 42 * 1024 * 1024,
        "binaries_bytes": 204800,
        "load": {
            "mmap": {"mode": "mmap", "contexts": 1, "load_ms": 9.5, "rss_delta": 2 * 1048576,
                     "pss_delta": 1048576, "anon_delta": 524288, "file_delta": 524288},
            "heap": {"mode": "heap", "contexts": 1, "load_ms": 7.25, "rss_delta": 3 * 1048576,
                     "pss_delta": 2 * 1048576, "anon_delta": 2 * 1048576, "file_delta": 0},
        },
        "npu_clock_mhz": 1000,
    }
    if samples:
        doc["components"][0]["samples_us"] = [1400.0 + 50 * (i % 5) for i in range(20)]
        doc["total_samples_us"] = [1500.0 + 50 * (i % 5) for i in range(20)]
    return doc


def write_results(tmp_path, parity=None, bench=None, env=None):
    raw = tmp_path / "out" / "raw"
    raw.mkdir(parents=True)
    facts = {"arch": "aarch64", "hostname": "iq9075", "soc_id": "77", "parity_exit": "0",
             "bench_exit": "0", "vlad_version": "vlad 0.1.0", "uploaded_files": "3",
             "uploaded_bytes": "2097152", "cached_files": "9", "workspace_removed": "yes"}
    facts.update(env or {})
    (raw / "target.env").write_text("".join(f"{k}={v}\n" for k, v in facts.items()))
    if parity is not None:
        (raw / "parity.json").write_text(parity if isinstance(parity, str) else json.dumps(parity))
    if bench is not None:
        (raw / "bench.json").write_text(bench if isinstance(bench, str) else json.dumps(bench))
    (raw / "parity.log").write_text("parity output\n")
    return raw, tmp_path / "out"


def build(raw, out, bundle=FASTWAM):
    path = report.build_report(raw, bundle, "root@board", out)
    return path.read_text()


def is_png(path):
    return path.is_file() and path.read_bytes()[:8] == PNG_MAGIC


def test_the_targets_ring_check_is_a_fact_of_the_target(tmp_path):
    raw, out = write_results(tmp_path, parity_doc(), bench_doc(),
                             env={"ring_check": "failed: /dev/shm is missing or not writable"})
    md = build(raw, out)
    assert ("| rings in /dev/shm (vla-ring-bridge: poll, publish, refusal) |"
            " `failed: /dev/shm is missing or not writable` |") in md


def test_full_report_has_every_section_and_histograms(tmp_path):
    raw, out = write_results(tmp_path, parity_doc(), bench_doc())
    md = build(raw, out)
    assert md.startswith("# Bring-up report: fastwam-libero-tiny 0.1.0 on root@board")
    assert "**Parity: PASS** — contexts executed on the Hexagon v73 NPU." in md
    assert "| action_step | pred_noise | 1x32x7 | 0.99999000 |" in md
    assert "| **end to end** | action chunk | 224 values |" in md
    # microseconds from bench-bundle shown in milliseconds
    assert "| action_step | 1.400 | 2.400 |" in md
    assert "| **host overhead** | 0.100 | 0.120 |" in md
    assert "| **end to end** | 1.500 | 2.500 |" in md
    assert "7.10% of the context execute time" in md
    assert "| mapped (mmap) | 1 | 9.5 | 2.00 | 1.00 | 0.50 | 0.50 |" in md
    assert "| read into memory | 1 | 7.2 |" in md or "| read into memory | 1 | 7.3 |" in md
    assert "whole policy loaded in **12.5 ms**" in md
    assert "| RSS after the policy is loaded | 64.0 |" in md
    assert "| deployed | 3 files uploaded (2.0 MiB), 9 reused" in md
    assert "![latency histogram per component](latency.png)" in md
    # a figure the report does not know is shown, not dropped
    assert '"npu_clock_mhz": 1000' in md
    for png in ("actions.png", "parity.png", "latency.png"):
        assert is_png(out / png), png
        assert f"]({png})" in md
    assert "[`parity.log`](raw/parity.log)" in md


def test_without_samples_the_latency_plot_shows_percentiles(tmp_path):
    raw, out = write_results(tmp_path, parity_doc(), bench_doc(samples=False))
    md = build(raw, out)
    assert "no per-iteration samples" in md
    assert "![latency p50/p99 per component](latency.png)" in md
    assert is_png(out / "latency.png")


def test_vlad_without_bench_bundle_degrades_with_a_note(tmp_path):
    raw, out = write_results(tmp_path, parity_doc(), None, {"bench_exit": "unavailable"})
    md = build(raw, out)
    assert "**No benchmark:** the deployed vlad has no `bench-bundle` command" in md
    assert "| action_step | 118.10 |" in md  # single execution from the parity run
    assert "No memory figures" in md
    assert "6.5 ms in the parity run" in md
    assert not (out / "latency.png").exists()
    assert is_png(out / "actions.png")


def test_failed_benchmark_points_at_its_log(tmp_path):
    raw, out = write_results(tmp_path, parity_doc(), None, {"bench_exit": "1"})
    md = build(raw, out)
    assert "vlad bench-bundle wrote no bench.json (exit 1); see bench.log" in md


def test_broken_bench_json_is_named_not_fatal(tmp_path):
    raw, out = write_results(tmp_path, parity_doc(), '{"total_p50_us": ')
    md = build(raw, out)
    assert f"{raw / 'bench.json'}: not valid JSON" in md
    assert "**Parity: PASS**" in md


def test_failed_parity_is_visible(tmp_path):
    raw, out = write_results(tmp_path, parity_doc(passed=False), bench_doc(),
                             {"parity_exit": "3"})
    md = build(raw, out)
    assert "**Parity: FAIL**" in md
    assert "| action_step | pred_noise | 1x32x7 | 0.98000000 |" in md and "| FAIL |" in md
    assert "| **FAIL** |" in md
    assert is_png(out / "parity.png") and is_png(out / "actions.png")


def test_missing_parity_json_says_so(tmp_path):
    raw, out = write_results(tmp_path, None, None, {"parity_exit": "1", "bench_exit": "1"})
    md = build(raw, out)
    assert "**Parity: NO RESULT**" in md
    assert "vlad parity wrote no parity.json (exit 1); see parity.log" in md
    assert not (out / "actions.png").exists()


def test_emulator_run_is_labelled_as_such(tmp_path):
    raw, out = write_results(tmp_path, parity_doc(), bench_doc(), {"arch": "x86_64"})
    md = build(raw, out)
    assert "x86_64 HTP emulator" in md and "not an NPU" in md


def test_action_geometry_comes_from_the_bundle():
    assert report.action_geometry(FASTWAM, 224) == (32, 7)
    # a chunk that does not fit the bundle's dims falls back rather than mis-plotting
    assert report.action_geometry(FASTWAM, 10) == (10, 1)
    assert report.action_geometry(None, 70) == (10, 7)


def test_stale_plots_of_an_earlier_report_are_removed(tmp_path):
    raw, out = write_results(tmp_path, parity_doc(), bench_doc())
    build(raw, out)
    (raw / "bench.json").unlink()
    md = build(raw, out)
    assert "latency.png" not in md
    assert not (out / "latency.png").exists()


def test_cli_names_a_missing_results_dir(tmp_path, capsys):
    rc = report.main(["--results", str(tmp_path / "nope"), "--out", str(tmp_path / "o")])
    assert rc == 1
    assert f"{tmp_path / 'nope'}: no such results directory" in capsys.readouterr().err


@pytest.mark.parametrize("doc", ['[1, 2]', '"text"'])
def test_bench_json_that_is_not_an_object_is_named(tmp_path, doc):
    raw, out = write_results(tmp_path, parity_doc(), doc)
    md = build(raw, out)
    assert "bench.json: top level is" in md and "expected an object" in md


def _with_outputs(doc, cosines):
    doc["contexts"][0]["outputs"] = [
        {"name": name, "shape": [1], "cosine": cos, "max_abs_diff": 0.1, "within_tolerance": 1.0,
         "passed": cos is not None and cos >= 0.9999} for name, cos in cosines.items()]
    return doc


def test_gates_are_proposed_from_the_minimum_over_every_observation(tmp_path):
    raw, out = write_results(tmp_path, parity=_with_outputs(parity_doc(), {
        "pred_noise": 0.9985, "steady": 0.99999, "broken": None}), bench=bench_doc())
    more = _with_outputs(parity_doc(), {"pred_noise": 0.9983, "steady": 0.99998, "broken": 0.5})
    (raw / "parity-1.json").write_text(json.dumps(more))
    text = build(raw, out)
    gates = json.loads((out / "gates.json").read_text())
    assert gates["format"] == "vla-bringup-gates/1" and gates["margin"] == report.GATE_MARGIN
    assert (gates["bundle"], gates["version"]) == ("fastwam-libero-tiny", "0.1.0")
    by = {o["output"]: o for o in gates["outputs"]}
    assert by["pred_noise"]["observations"] == 2 and by["pred_noise"]["min_cosine"] == 0.9983
    assert by["pred_noise"]["proposed_gate"] == 0.9978  # 0.9983 - 0.0005
    assert by["steady"]["proposed_gate"] == 0.9999, "an output meeting the default keeps it"
    assert "broken" not in by, "a non-finite observation is nothing to calibrate from"
    assert "| action_step | pred_noise | 2 | 0.99830000 | 0.997800 |" in text
    assert gates["stages"] == [], "these runs store no stages"
    assert "more observation runs wrote" not in text


def test_observation_runs_that_wrote_nothing_are_named_in_the_report(tmp_path):
    raw, out = write_results(tmp_path, parity=_with_outputs(parity_doc(), {"pred_noise": 0.9985}),
                             bench=bench_doc(), env={"observations": "2"})
    (raw / "parity-a.json").write_text(json.dumps(_with_outputs(parity_doc(), {"pred_noise": 0.9983})))
    text = build(raw, out)
    assert "Only 1 of the 2 more observation runs wrote" in text
    assert "from 2 observation(s), not 3" in text


def test_stages_of_the_end_to_end_run_get_proposals_too(tmp_path):
    doc = parity_doc()
    doc["stages"] = [{"name": "hidden_states", "cosine": 0.99985, "passed": True},
                     {"name": "pixel_values", "cosine": 1.0, "passed": True}]
    raw, out = write_results(tmp_path, parity=doc, bench=bench_doc())
    text = build(raw, out)
    stages = {s["stage"]: s for s in json.loads((out / "gates.json").read_text())["stages"]}
    assert stages["hidden_states"]["proposed_gate"] == 0.99935
    assert stages["pixel_values"]["proposed_gate"] == 0.9999
    assert "| stage | hidden_states | 1 | 0.99985000 | 0.999350 |" in text


def test_parity_runs_of_another_bundle_are_refused(tmp_path):
    raw, out = write_results(tmp_path, parity=parity_doc(), bench=bench_doc())
    other = dict(parity_doc(), bundle="another")
    (raw / "parity-1.json").write_text(json.dumps(other))
    with pytest.raises(report.ReportError, match="different bundles"):
        build(raw, out)


def probe_lines(plan_ok=True, jump=False):
    lines = [
        {"probe": "platform", "nsps": 2, "info": "platform info v1: 2 device(s): device 0 (...)"},
        {"probe": "load", "placement": "one-process", "index": 0, "context": "vision",
         "ok": True, "load_ms": 812.5, "rss": 1024 * 1048576, "pss": 1000 * 1048576},
        {"probe": "load", "placement": "one-process", "index": 1, "context": "llm_split0",
         "ok": True, "load_ms": 2100.0, "rss": 2900 * 1048576, "pss": 2800 * 1048576},
        {"probe": "load", "placement": "one-process", "index": 2, "context": "llm_split1",
         "ok": False, "load_ms": 40.0, "rss": 2900 * 1048576, "pss": 2800 * 1048576,
         "error": "contextCreateFromBinary failed for llm_split1: QNN error 1002"},
        {"probe": "outcome", "placement": "one-process", "all_loaded": False,
         "failed_at": "llm_split1"},
        {"probe": "plan", "summary": "s0 nsp0 [vision+llm_split0] 2751.0 MiB; budget 3584.0 MiB",
         "budget": 3758096384},
    ]
    if plan_ok:
        lines += [
            {"probe": "load", "placement": "plan", "ok": True, "load_ms": 9000.0,
             "rss": 9000 * 1048576, "pss": 8900 * 1048576, "spill_fill": "no shared spill-fill"},
            {"probe": "execute", "placement": "plan", "context": "vision", "median_ms": 20.0,
             "max_ms": 90.0 if jump else 22.0, "runs_ms": [25.0, 20.0, 21.0, 20.0, 90.0 if jump else 20.0],
             "jumps": [4] if jump else []},
            {"probe": "outcome", "placement": "plan", "all_loaded": True,
             "use": "s0 nsp0 [vision+llm_split0] 2751.0 MiB; budget 3584.0 MiB"},
        ]
    else:
        lines += [
            {"probe": "load", "placement": "plan", "ok": False, "context": "llm_split2",
             "error": "contextCreateFromBinary failed: QNN error 1002", "load_ms": 1.0},
            {"probe": "outcome", "placement": "plan", "all_loaded": False, "failed_at": "llm_split2"},
        ]
    return "\n".join(json.dumps(d) for d in lines) + "\n"


# Without parity and benchmark files: no plots, the DSP section alone is what is checked.
def test_the_dsp_probe_says_where_loading_failed_and_which_placement_to_use(tmp_path):
    raw, out = write_results(tmp_path)
    (raw / "dsp-probe.jsonl").write_text(probe_lines())
    (raw / "dsp-probe.log").write_text(
        "[t DEBUG qnn] <V> PD 0 chosen for context 1, estimated future space on pd ~930.14 MB\n"
        "[t DEBUG qnn] <V> PD 1 chosen for context 3, estimated future space on pd ~1830.00 MB\n")
    md = build(raw, out)
    assert "## DSP memory (`vlad dsp-probe`)" in md
    assert "| 1 | llm_split1 | **no**: contextCreateFromBinary failed for llm_split1: QNN error 1002 |" \
        not in md
    assert "| 2 | llm_split1 | **no**: contextCreateFromBinary failed for llm_split1: QNN error 1002 |" in md
    assert "| 1 | llm_split0 | yes | 2100.0 | 2900.0 | 2800.0 |" in md
    assert "**Loading failed at `llm_split1`** in one process." in md
    assert "- PD 1 chosen for context 3, estimated future space on pd ~1830.00 MB" in md
    assert ("**Placement to use:** the memory plan, `npu.placement` as configured:"
            " s0 nsp0 [vision+llm_split0] 2751.0 MiB; budget 3584.0 MiB.") in md


def test_the_dsp_probe_flags_jumps_and_a_plan_that_does_not_load(tmp_path):
    raw, out = write_results(tmp_path)
    (raw / "dsp-probe.jsonl").write_text(probe_lines(jump=True))
    md = build(raw, out)
    assert "| plan | vision | 20.00 | 90.00 | 5 | 4 |" in md
    assert "graph switching suspected" in md
    raw2, out2 = write_results(tmp_path / "b")
    (raw2 / "dsp-probe.jsonl").write_text(probe_lines(plan_ok=False))
    md = build(raw2, out2)
    assert "**As planned: loading failed at `llm_split2`**" in md
    assert "the plan failed at `llm_split2`; the contexts need worker processes" in md
    raw3, out3 = write_results(tmp_path / "c")
    assert "No DSP memory probe in the results" in build(raw3, out3)


def write_shared_ab(raw, contexts):
    d = raw / "shared-ab"
    d.mkdir()
    for name, client, shared in contexts:
        (d / f"{name}.client.log").write_text(client)
        if shared is not None:
            (d / f"{name}.shared.log").write_text(shared)


def bench_context_log(p50, shared=None):
    io = ("  I/O                            client buffers\n" if shared is None else
          "  I/O                            HTP shared buffer, 8192 bytes (rpcmem from"
          f" libcdsprpc.so.1); outputs bit-identical to client buffers: {shared}\n")
    return (f"context ctx.bin (4096 bytes)\n{io}"
            f"  steady over 5: p50 {p50:.3f} ms  p99 {p50 + 1:.3f} ms  max {p50 + 2:.3f} ms\n")


def test_shared_buffer_ab_is_tabled_with_a_verdict(tmp_path):
    raw, out = write_results(tmp_path, parity=parity_doc(), bench=bench_doc())
    write_shared_ab(raw, [("vision", bench_context_log(2.0), bench_context_log(1.5, "yes")),
                          ("action_step", bench_context_log(1.0), bench_context_log(0.9, "yes"))])
    md = build(raw, out)
    assert "## Shared buffers (per context)" in md
    assert "| vision | 2.000 | 1.500 | yes |  |" in md
    assert "**Use shared buffers** (`npu.shared_buffers: auto`)" in md
    assert "p50 execute sum 2.400 ms against 3.000 ms with client buffers" in md


def test_rss_pss_and_copies_per_mode_are_tabled_end_to_end(tmp_path):
    client = bench_doc()
    client.update(npu_io="client", npu_client_buffer_bytes_per_inference=3103536,
                  host_copy_bytes_per_inference=280, rss_after_inferences=80 * 1024 * 1024)
    shared = bench_doc()
    shared.update(npu_io="shared", total_p50_us=1200.0, execute_p50_us=1100.0,
                  rss_after_policy_load=70 * 1024 * 1024, pss_after_policy_load=45 * 1024 * 1024,
                  npu_client_buffer_bytes_per_inference=0, host_copy_bytes_per_inference=280)
    raw, out = write_results(tmp_path, parity=parity_doc(), bench=client)
    write_shared_ab(raw, [("vision", bench_context_log(2.0), bench_context_log(1.5, "yes"))])
    (raw / "shared-ab" / "bench-shared.json").write_text(json.dumps(shared))
    # The section alone (the whole report with its plots is built by the other tests).
    md = "\n".join(report.shared_end_to_end(raw))
    assert "## Shared buffers (end to end)" in md
    assert "| end to end p50 ms | 1.500 | 1.200 |" in md
    assert "| RSS after policy load MiB | 64.0 | 70.0 |" in md
    assert "| PSS after policy load MiB | 42.0 | 45.0 |" in md
    assert "| RSS after the inferences MiB | 80.0 | n/a |" in md
    assert "| NPU I/O in client buffers per inference, bytes | 3103536 | 0 |" in md
    assert "| host copies per inference, bytes | 280 | 280 |" in md
    assert "not `shared`" not in md
    # The new bench.json figures are tabled, not listed as unknown figures.
    unknown = report.parse_bench(client).unrecognised
    assert not {"npu_io", "npu_client_buffer_bytes_per_inference", "host_copy_bytes_per_inference",
                "rss_after_inferences"} & unknown.keys(), unknown


def test_a_failed_end_to_end_shared_run_is_named(tmp_path):
    raw, out = write_results(tmp_path, parity=parity_doc(), bench=bench_doc())
    write_shared_ab(raw, [("vision", bench_context_log(2.0), bench_context_log(1.5, "yes"))])
    (raw / "shared-ab" / "bench-shared.log").write_text(
        "vlad: error: molmoact2: memRegister failed: QNN error 1000\n")
    md = "\n".join(report.shared_end_to_end(raw))
    assert ("`vlad bench-bundle --shared-buffers` wrote no figures: vlad: error: molmoact2:"
            " memRegister failed: QNN error 1000") in md


def test_a_refused_registration_means_client_buffers_and_is_named(tmp_path):
    raw, out = write_results(tmp_path, parity=parity_doc(), bench=bench_doc())
    refused = ("vlad: error: memRegister failed for tensor `pixel_values` of graph vision:"
               " QNN error 1000 (not supported)\n")
    write_shared_ab(raw, [("vision", bench_context_log(2.0), refused),
                          ("action_step", bench_context_log(1.0), bench_context_log(0.9, "NO"))])
    md = build(raw, out)
    assert "| vision | 2.000 | n/a | n/a | vlad: error: memRegister failed" in md
    assert "| action_step | 1.000 | 0.900 | NO |  |" in md
    assert ("**Use client buffers** (`npu.shared_buffers: off` or `auto`): shared buffers"
            " failed for 2 of 2 contexts; first, action_step: outputs differ") in md


def test_without_shared_buffer_runs_the_report_says_so(tmp_path):
    raw, out = write_results(tmp_path, parity=parity_doc(), bench=bench_doc())
    md = build(raw, out)
    assert "No shared-buffer A/B" in md
    assert "No end-to-end shared-buffer run" in md
