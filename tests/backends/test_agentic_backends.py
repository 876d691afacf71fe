"""An agentic-coding point on the process backend: the trace replay over HTTP against the
server its launch spec starts, with the argv InferenceX's agentic scripts give it (the model's
native context, the prefix cache on). The same on docker (test_docker_plugin.py) and slurm
(test_slurm_plugin.py)."""

from __future__ import annotations

import sys

import pytest
from lifecycle_helpers import (
    agentic_point,
    assert_replayed_on_an_agentic_server,
    sim_command,
    write_agentic_recipe,
)

# In a subprocess: a run's httpx must be the one its `except` clauses name, and pytester's
# in-process runs forget and re-import modules.
FAST = ("-p", "no:cacheprovider", "-rs", "--inferbench-replay-duration=0.5",
        "--inferbench-no-plots")


def test_an_agentic_point_replays_against_the_server_the_process_backend_starts(
        pytester: pytest.Pytester) -> None:
    write_agentic_recipe(pytester.path, sim_command(sys.executable))
    result = pytester.runpytest_subprocess(*FAST, "--inferbench-backend=process")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*traces:synthetic*passed*"])
    assert_replayed_on_an_agentic_server(
        agentic_point(pytester.path / "inferbench-results"), "process")
