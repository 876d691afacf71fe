"""The published reference set: the script reads its data file and computes the whole table
(every point simulated, every metric summarised). The errors themselves are not asserted: they
are what the physics gives, reported in docs/simulator.md."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import yaml

from pytest_inferbench.sim import calibration, catalog
from pytest_inferbench.sim.args import engine_config_from_argv

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks/sim_reference.py"
DATA = REPO / "benchmarks/sim_reference.yaml"
METRICS = ("ttft", "tpot", "throughput")
ROW = re.compile(r"^\| (?P<label>.+?) \| \[(?P<source>[^\]]+)\] \| (?P<metric>\w+) \| "
                 r"(?P<measured>[^|]+) \| (?P<simulated>[^|]+) \| (?P<error>[^|]+) \|$")


def run(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True,
                          env=env, check=False)


def test_every_published_value_is_simulated_and_every_metric_summarised() -> None:
    data = yaml.safe_load(DATA.read_text(encoding="utf-8"))
    published = [(p["source"], key) for p in data["points"] for key in p["measured"]]
    done = run("--data", str(DATA))
    assert done.returncode == 0, done.stderr
    rows = [m for line in done.stdout.splitlines() if (m := ROW.match(line))]
    data_rows = [m for m in rows if m["source"] != "atom"]
    assert sorted((m["source"], m["metric"]) for m in data_rows) == sorted(published)
    for m in rows:
        assert float(m["simulated"]) > 0, m.group(0)
        assert re.fullmatch(r"[+-]\d+%", m["error"].strip()), m.group(0)
    # the points whose settings the source left out are marked, and only those
    assumed = {p["label"] for p in data["points"] if p.get("assumed")}
    for m in data_rows:
        assert m["label"].endswith(" *") == (m["label"].rsplit(" (", 1)[0] in assumed)
    for metric in (*METRICS, "all"):
        line = re.search(rf"^\| {metric} \| (\d+) \| (\d+)% \| (\d+)% \|$", done.stdout, re.M)
        assert line is not None, f"no summary for {metric}"
        assert int(line[2]) <= int(line[3])  # a median never exceeds the worst
    counts = {metric: int(re.search(rf"^\| {metric} \| (\d+) \|", done.stdout, re.M)[1])
              for metric in (*METRICS, "all")}
    assert counts["all"] == len(rows) == sum(counts[m] for m in METRICS)


def test_the_set_spans_families_gpus_and_frameworks() -> None:
    data = yaml.safe_load(DATA.read_text(encoding="utf-8"))
    configs = [engine_config_from_argv(p["argv"], hardware=p["hardware"],
                                       env=p.get("env", {}))[0] for p in data["points"]]
    # the ATOM calibration rows head the table from sim/calibration.py
    hardware = {c.hardware for c in configs} | {calibration.HARDWARE}
    frameworks = {c.framework for c in configs} | {calibration.FRAMEWORK}
    models = {catalog.checkpoint(c.model).architecture.name for c in configs} | {
        catalog.checkpoint(calibration.MODEL).architecture.name}
    assert sum(len(p["measured"]) for p in data["points"]) >= 30
    assert len(hardware) >= 4 and len(frameworks) >= 3 and len(models) >= 6


def test_a_bad_point_is_named_not_a_traceback(tmp_path: Path) -> None:
    bad = tmp_path / "refs.yaml"
    bad.write_text("sources: {s: a page}\npoints:\n"
                   "  - {label: lost, source: s, argv: [vllm, serve, openai/gpt-oss-120b],\n"
                   "     hardware: H100, isl: 10, osl: 10, conc: 1, prompts: 1,\n"
                   "     measured: {mean_latency: 1}}\n")
    done = run("--data", str(bad))
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    assert f"{bad}: point 1 (lost): unknown metric(s) ['mean_latency']" in done.stderr


def test_a_point_the_simulator_cannot_serve_is_named(tmp_path: Path) -> None:
    bad = tmp_path / "refs.yaml"
    bad.write_text("sources: {s: a page}\npoints:\n"
                   "  - {label: nowhere, source: s, argv: [vllm, serve, openai/gpt-oss-120b],\n"
                   "     hardware: H999, isl: 10, osl: 10, conc: 1, prompts: 1,\n"
                   "     measured: {mean_tpot_ms: 1}}\n")
    done = run("--data", str(bad))
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    assert f"{bad}: point nowhere (10/10): unknown hardware 'H999'" in done.stderr


def test_the_chat_template_is_prefilled_with_the_prompt(tmp_path: Path) -> None:
    # A chat client asks for `isl` tokens of text; the server prefills them and its template's.
    data = tmp_path / "refs.yaml"
    point = ("source: s, argv: [vllm, serve, openai/gpt-oss-120b], hardware: H100, osl: 4, "
             "conc: 8, prompts: 8, measured: {mean_ttft_ms: 100, output_throughput: 100}")
    data.write_text("sources: {s: a page}\npoints:\n"
                    f"  - {{label: chat, isl: 100, template_tokens: 67, {point}}}\n"
                    f"  - {{label: served, isl: 167, {point}}}\n"
                    f"  - {{label: bare, isl: 100, {point}}}\n")
    done = run("--data", str(data))
    assert done.returncode == 0, done.stderr
    simulated = {(m["label"], m["metric"]): float(m["simulated"])
                 for line in done.stdout.splitlines() if (m := ROW.match(line))}
    for metric in ("mean_ttft_ms", "output_throughput"):
        assert simulated[("chat (100/4)", metric)] == simulated[("served (167/4)", metric)]
    assert simulated[("chat (100/4)", "mean_ttft_ms")] > simulated[("bare (100/4)",
                                                                    "mean_ttft_ms")]


def test_a_bad_template_count_is_named(tmp_path: Path) -> None:
    bad = tmp_path / "refs.yaml"
    bad.write_text("sources: {s: a page}\npoints:\n"
                   "  - {label: odd, source: s, argv: [vllm, serve, openai/gpt-oss-120b],\n"
                   "     hardware: H100, isl: 10, osl: 10, conc: 1, prompts: 1,\n"
                   "     template_tokens: -3, measured: {mean_tpot_ms: 1}}\n")
    done = run("--data", str(bad))
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    assert (f"{bad}: point 1 (odd): template_tokens is a count of tokens (0 or more), got -3"
            in done.stderr)
