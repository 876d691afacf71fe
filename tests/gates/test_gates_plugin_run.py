"""Spec-decode gates in a real plugin run on the simulator: a forced (synthetic) acceptance
length is reproduced within tolerance and recorded next to the golden AL."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_inferbench.testing.recipes import master_entry

REPO = Path(__file__).resolve().parents[2]
RECIPE = master_entry(
    "minimaxm3-fp4-mi355x-atom-mtp",
    ["{ tp: 4, spec-decoding: mtp, conc-start: 2, conc-end: 2 }"],
    isl=512,
    osl=64,
)


def project(pytester: pytest.Pytester, launch_edit: tuple[str, str]) -> None:
    (pytester.path / "bench-master.yaml").write_text(RECIPE)
    (pytester.path / "launch").mkdir()
    launch = (REPO / "benchmarks/launch/minimaxm3_fp4_mi355x_atom.yaml").read_text()
    assert launch_edit[0] in launch
    (pytester.path / "launch/minimaxm3_fp4_mi355x_atom.yaml").write_text(
        launch.replace(*launch_edit)
    )


def test_forced_acceptance_length_is_met_and_recorded(pytester: pytest.Pytester) -> None:
    forced = '--num-speculative-tokens, "3", --spec-decode-acceptance-length, "2.5"]'
    project(pytester, ('--num-speculative-tokens, "3"]', forced))
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
    (point,) = json.loads((pytester.path / "inferbench-results/summary.json").read_text())["points"]
    assert point["synthetic_acceptance_length"] == 2.5
    assert abs(point["acceptance_length"] - 2.5) / 2.5 <= 0.03
    assert point["golden_acceptance_length"] == 2.83  # k=3, thinking on


def test_spec_decode_without_chat_template_fails_in_a_run(pytester: pytest.Pytester) -> None:
    project(
        pytester, ("client: { use-chat-template: true }", "client: { use-chat-template: false }")
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "*speculative decoding (eagle3) without the chat template: "
            "set client.use-chat-template: true in *launch/minimaxm3_fp4_mi355x_atom.yaml;*"
        ]
    )
