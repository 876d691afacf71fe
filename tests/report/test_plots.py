"""Matrix-sized plot runs: figures are shared out to child interpreters, and none is lost."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from pytest_inferbench.report import plots

PNG = b"\x89PNG\r\n\x1a\n"


def matrix_points(models: int) -> list[dict[str, object]]:
    """Points of `models` model prefixes (one figure each), two nodes of three points each."""
    return [{"model_prefix": f"model{m}", "isl": 1024, "osl": 1024, "server_node": f"node{n}",
             "conc": conc, "tput_per_gpu": 100.0 * conc / (n + 1), "median_intvty": 200.0 / conc,
             "median_e2el": 0.5 * conc, "simulated": True, "request_rate": "inf"}
            for m in range(models) for n in range(2) for conc in (4, 16, 64)]


def test_many_figures_are_all_drawn(tmp_path: Path) -> None:
    models = plots.PARALLEL_FIGURES + 1
    written = plots.plot_results(matrix_points(models), tmp_path)
    assert written == [tmp_path / f"model{m}_isl1024_osl1024.png" for m in range(models)]
    for path in written:
        assert path.read_bytes()[:8] == PNG


def test_figures_of_a_child_that_fails_are_drawn_in_process(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "executable", "/bin/false")  # every child exits 1 at once
    monkeypatch.setattr(plots.os, "sched_getaffinity", lambda pid: {0, 1, 2}, raising=False)
    written = plots.plot_results(matrix_points(plots.PARALLEL_FIGURES), tmp_path)
    assert written is not None and len(written) == plots.PARALLEL_FIGURES
    for path in written:
        assert path.read_bytes()[:8] == PNG


def test_a_dense_figure_labels_only_each_curve_s_ends() -> None:
    curve = [(1.0, 2.0, "4"), (2.0, 3.0, "16"), (3.0, 4.0, "64")]
    assert plots.labelled(curve, dense=False) == curve
    assert plots.labelled(curve, dense=True) == [curve[0], curve[-1]]
    assert plots.labelled(curve[:1], dense=True) == curve[:1]


def test_agentic_points_get_one_pareto_figure_per_model(tmp_path: Path) -> None:
    """An agentic point is drawn on AgentX's axes, in its model's figure; a fixed-length point
    of the same model keeps its own figure."""
    agentic = [{"model_prefix": "qwen3.5", "isl": 0, "osl": 0, "server_node": f"node{n}",
                "conc": conc, "tput_per_gpu": 50.0 * conc, "median_intvty": 100.0 / conc,
                "agentic_tput_per_gpu": 40.0 * conc, "p90_e2e_norm_intvty": 90.0 / conc,
                "simulated": True} for n in range(2) for conc in (4, 8)]
    fixed = [{**p, "model_prefix": "qwen3.5", "isl": 1024, "osl": 1024}
             for p in matrix_points(1)]
    written = plots.plot_results([*agentic, *fixed], tmp_path)
    assert written == [tmp_path / "qwen3.5_agentic.png", tmp_path / "qwen3.5_isl1024_osl1024.png"]
    assert all(path.read_bytes()[:8] == PNG for path in written)
    (x,), y = plots.panels(plots.AGENTIC)
    assert (x.key, y.key) == ("p90_e2e_norm_intvty", "agentic_tput_per_gpu")
