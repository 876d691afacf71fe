"""A point never hangs and never loses what it measured: stalled streams fail within the stall
timeout with the tokens received, failures name their causes, and a gate that raises fails
only its point, after the result is on disk."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from lifecycle_helpers import load_node, write_recipe

from pytest_inferbench.backends.base import LoadSettings
from pytest_inferbench.backends.process import ProcessBackend

if TYPE_CHECKING:
    from pytest_inferbench.backends.base import StartContext

STALL_S = 1.0


def test_a_stalled_stream_fails_within_twice_the_stall_timeout(
        tmp_path: Path, start_context: StartContext) -> None:
    server, spec = load_node(write_recipe(tmp_path, python=sys.executable,
                                          sim_options={"fp4": ("--stall-after-tokens", "3")}))
    handle = ProcessBackend().start(server, spec, start_context)
    try:
        load = LoadSettings(prompts_per_conc=2, warmup_per_conc=0, stall_timeout_s=STALL_S)
        records = handle.run_point(server.points()[0], load).records
    finally:
        handle.stop()
    assert len(records) == 2 and not any(r.success for r in records)
    for record in records:
        assert record.error == (f"no data for {STALL_S:g} s after token 3 "
                                "(--inferbench-stall-timeout)")
        last_data = record.chunk_times[-1] if len(record.chunk_times) else record.send_time
        assert record.end_time - last_data < 2 * STALL_S, record.end_time - last_data


def test_a_simulated_point_records_how_far_the_server_fell_behind(
        tmp_path: Path, start_context: StartContext) -> None:
    """In real time the simulated server reports its delivery lag; the point records the lag of
    its own steps (checked against the bound in `results.measurement_failures`)."""
    from lifecycle_helpers import with_settings

    from pytest_inferbench.backends.simserver import SimServerBackend

    server, spec = load_node(write_recipe(tmp_path))
    handle = SimServerBackend().start(server, spec, with_settings(start_context, time_scale=1.0))
    try:
        load = LoadSettings(prompts_per_conc=2, warmup_per_conc=1)
        lag = handle.run_point(server.points()[0], load).server_metrics["delivery_lag"]
    finally:
        handle.stop()
    assert lag["steps"] >= 16  # 2 requests x 16 tokens at concurrency 1, one step per token
    assert 0.0 <= lag["mean_s"] <= lag["max_s_since_start"]


@pytest.mark.parametrize("rate", [float("inf"), 50.0], ids=["closed-loop", "open-loop"])
def test_a_point_ends_at_its_deadline_and_keeps_what_it_measured(
        tmp_path: Path, start_context: StartContext, rate: float) -> None:
    server, spec = load_node(write_recipe(tmp_path, python=sys.executable,
                                          sim_options={"fp4": ("--stall-after-tokens", "3")}))
    handle = ProcessBackend().start(server, spec, start_context)
    deadline = 1.5
    try:
        load = LoadSettings(prompts_per_conc=3, warmup_per_conc=0, stall_timeout_s=60.0,
                            point_timeout_s=deadline, request_rate=rate)
        measurement = handle.run_point(server.points()[0], load)
    finally:
        handle.stop()
    records = measurement.records
    assert len(records) == 3 and not any(r.success for r in records)  # none lost
    assert records[0].error == (f"the point's deadline of {deadline:g} s passed after token 3 "
                                "(--inferbench-point-timeout)")
    assert [r.error for r in records[1:]] == [
        f"not sent: the point's deadline of {deadline:g} s had passed "
        "(--inferbench-point-timeout)"] * 2
    assert measurement.duration_s < 2 * deadline  # the stall timeout (60 s) never came into it


def _points_dir(pytester: pytest.Pytester) -> Path:
    return pytester.path / "inferbench-results" / "points"


def test_failures_name_their_causes_and_the_result_is_kept(pytester: pytest.Pytester) -> None:
    write_recipe(pytester.path, python=sys.executable,
                 sim_options={"fp4": ("--stall-after-tokens", "2")})
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "--inferbench-backend", "process", "-k", "conc1",
        "--inferbench-prompts-per-conc", "2", "--inferbench-stall-timeout", "0.5")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*2/2 requests failed (100.0% > allowed 0.0%, "
                                 "--inferbench-max-failure-ratio): 2 x no data for 0.5 s after "
                                 "token 2 (--inferbench-stall-timeout)*"])
    (raw,) = [p for p in _points_dir(pytester).glob("*.json") if not p.name.startswith("agg_")]
    data = json.loads(raw.read_text())
    assert data["completed"] == 0 and data["num_prompts"] == 2


CONFTEST_GATE_RAISES = """
import pytest_inferbench.gates as gates

def check_point(*args, **kwargs):
    raise RuntimeError("gate exploded")

gates.check_point = check_point  # a gate with a bug: the runner calls it through the module
"""


def test_a_gate_that_raises_fails_its_point_and_the_result_is_kept(
        pytester: pytest.Pytester) -> None:
    write_recipe(pytester.path, python=sys.executable)
    pytester.makeconftest(CONFTEST_GATE_RAISES)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-k", "conc1",
                                           "--inferbench-prompts-per-conc", "1")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*gates could not be evaluated: RuntimeError: gate exploded*"])
    assert "Traceback" not in result.stdout.str()
    (raw,) = [p for p in _points_dir(pytester).glob("*.json") if not p.name.startswith("agg_")]
    data = json.loads(raw.read_text())
    assert data["completed"] == data["num_prompts"] == 1
    assert data["inferbench"]["gate_failures"] == [
        "gates could not be evaluated: RuntimeError: gate exploded"]
    summary = json.loads((pytester.path / "inferbench-results/summary.json").read_text())
    assert [p["completed"] for p in summary["points"]] == [1]


# The served model's tokenizer renders its chat template with jinja2, which is not installed.
CONFTEST_NO_JINJA2 = """
import sys

from pytest_inferbench.backends.http import HttpServerHandle


class JinjaTokenizer:
    vocab_size = 64

    def encode(self, text, add_special_tokens=False):
        return [ord(c) % 64 for c in text]

    def decode(self, ids):
        return "".join(chr(65 + i % 26) for i in ids)

    def apply_chat_template(self, conversation, **kwargs):
        import jinja2  # as transformers does when a template is rendered

        return jinja2.Template("{{ m }}").render(m=conversation[-1]["content"])


sys.modules["jinja2"] = None
HttpServerHandle.tokenizer = lambda self: JinjaTokenizer()
"""


def test_a_missing_optional_package_fails_the_point_naming_the_extra(
        pytester: pytest.Pytester) -> None:
    write_recipe(pytester.path, python=sys.executable)
    launch = next((pytester.path / "launch").glob("*.yaml"))
    launch.write_text(launch.read_text() + "client: { use-chat-template: true }\n")
    pytester.makeconftest(CONFTEST_NO_JINJA2)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-k", "conc1",
                                           "--inferbench-backend", "sim-server",
                                           "--inferbench-prompts-per-conc", "1")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*pip install 'pytest-inferbench[[]tokenizer[]]'*"])
    assert "Traceback" not in result.stdout.str()
