"""Progress while points run: where the lines go, and the runner's line at each point's ends.

On a terminal the HTTP client's live line shows each point (`loadgen/progress.py`, with an
ETA). Without one (CI logs), or with `--inferbench-progress lines`, every point gets a line when
it starts and one when it ends, and HTTP points a line every `LINE_INTERVAL_S` in between, all
written past pytest's output capture. xdist workers print nothing (the controller shows their
results).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..loadgen.progress import ProgressOutput, terminal_stream

if TYPE_CHECKING:
    from collections.abc import Callable

    import pytest

    from ..results.record import Record



def progress_output(config: pytest.Config, mode: str) -> ProgressOutput:
    """`auto`: the live line on a terminal, lines elsewhere; `lines`: lines; `off`: nothing."""
    if mode == "off" or hasattr(config, "workerinput"):
        return ProgressOutput()
    if mode == "auto" and (live := terminal_stream()) is not None:
        return ProgressOutput(live=live)
    return ProgressOutput(emit=_printer(config))


def _printer(config: pytest.Config) -> Callable[[str], None] | None:
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    capture = config.pluginmanager.get_plugin("capturemanager")
    if reporter is None:
        return None

    def say(text: str) -> None:
        if capture is None:
            reporter.write_line(f"inferbench: {text}")
            return
        with capture.global_and_fixture_disabled():  # the test's capture would swallow it
            reporter.write_line(f"inferbench: {text}")

    return say


def start_line(nodeid: str, conc: int, requests: int, rate: object) -> str:
    load = f"conc {conc}" + (f" @{rate:g}/s" if isinstance(rate, float) and rate != float("inf")
                             else "")
    return f"{nodeid}: start, {requests} requests at {load}"


def end_line(nodeid: str, result: Record, failures: list[str]) -> str:
    done = f"{result.get('completed')}/{result.get('num_prompts')} requests"
    took = result.get("duration")
    seconds = f" in {took:.1f} s" if isinstance(took, (int, float)) else ""
    verdict = f"FAILED ({len(failures)} reason{'s' if len(failures) > 1 else ''})" if failures \
        else "passed"
    return f"{nodeid}: done, {done}{seconds}, {verdict}"
