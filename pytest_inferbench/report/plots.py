"""PNG plots (optional `plot` extra): throughput per GPU against interactivity and E2E latency.

The axes are the metric catalog's plot axes: its y axis (throughput per GPU) against each x
axis in a panel of its own. One figure per (model prefix, ISL/OSL), one curve per server node
(points in concurrency order, each labelled with its concurrency; in a figure of more than
`DENSE_POINTS` points only each curve's ends), the way InferenceX charts its sweeps.
Agentic-coding points get one figure per model instead, AgentX's Pareto axes (the catalog's
`agentic-x` and `agentic-y`: E2E-normalized interactivity against throughput per GPU).
Simulated results say so in the title.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from ..results import catalog, metric_kinds
from ..results.file_names import bounded
from .tables import Row, load_label

if TYPE_CHECKING:
    from collections.abc import Sequence


_P = TypeVar("_P")
LINE_STYLES = ("-", "--", ":", "-.")
LEGEND_COLUMNS = 4
LEGEND_ROW_INCHES = 0.175  # one 8-point legend line (measured: 0.172)
LEGEND_FRAME_INCHES = 0.25  # the legend's title and frame (measured: 0.205)
TITLE_INCHES = 0.45  # above the panels: the figure's title
PANEL_INCHES = 5.0
AXIS_LABEL_INCHES = 0.65  # under the panels: tick labels and the axis label
EDGE_INCHES = 0.1


def _value(point: Row, key: str) -> float | None:
    value = point.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


# What a figure reads of a point besides its axes: a child process gets these and the axes'
# keys, not the whole record.
POINT_KEYS = ("model_prefix", "isl", "osl", "server_node", "conc", "request_rate", "simulated",
              "timings_meaningful")

# Below this many figures one process draws them all: a drawing process takes about a second
# to start (Python, matplotlib), about what one figure takes.
PARALLEL_FIGURES = 4
# Above this many points a figure labels only each curve's lowest and highest load.
DENSE_POINTS = 150


FIXED, AGENTIC = "", "agentic-"  # a figure's kind: the prefix of its catalog axes


def panels(kind: str = FIXED) -> tuple[tuple[metric_kinds.PlotAxis, ...], metric_kinds.PlotAxis]:
    """(the x axes, one panel each; the y axis) of a kind of figure, from the catalog."""
    axes = catalog.plot_axes()
    (y,) = [a for a in axes if a.axis == f"{kind}y"]
    return tuple(a for a in axes if a.axis == f"{kind}x"), y


def plot_results(points: Sequence[Row], out_dir: Path) -> list[Path] | None:
    """Write the PNGs and return their paths; None when matplotlib is not installed."""
    pending = start_plots(points, out_dir)
    return None if pending is None else pending.finish()


Job = tuple[tuple[str, int, int, str], list[Row], Path]  # (model, ISL, OSL, kind)


class PendingPlots:
    """Figures being drawn: by child interpreters, and here once `finish` is called."""

    def __init__(self, jobs: list[Job], here: list[int],
                 children: list[tuple[list[int], subprocess.Popen[bytes] | None]]) -> None:
        self.jobs, self.here, self.children = jobs, here, children

    def finish(self) -> list[Path]:
        """Draw this process's share, wait for the children; every figure's path."""
        for i in self.here:
            draw_figure(*self.jobs[i])
        for indices, child in self.children:
            if child is None or child.wait() != 0:  # drawn here: the same error, if any, raises
                for i in indices:
                    draw_figure(*self.jobs[i])
        return [path for _, _, path in self.jobs]


def start_plots(points: Sequence[Row], out_dir: Path) -> PendingPlots | None:
    """Start drawing the PNGs (None when matplotlib is not installed).

    Figures are independent: a matrix run's dozen or more are drawn by one child interpreter
    per CPU while the caller goes on (each figure with dozens of curves and hundreds of
    points takes a second or two of matplotlib's text layout and rasterizing); a few are
    drawn by `finish` in the caller."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return None
    (x_axes, y_axis), (agentic_x, agentic_y) = panels(), panels(AGENTIC)
    plotted = (*POINT_KEYS, *(a.key for a in (y_axis, *x_axes, agentic_y, *agentic_x)))
    groups: dict[tuple[str, int, int, str], list[Row]] = {}
    for p in points:
        model = str(p.get("model_prefix", "model"))
        if _value(p, agentic_y.key) is not None:  # an agentic point: its model's Pareto plot
            key = (model, 0, 0, AGENTIC)
        elif _value(p, y_axis.key) is not None:
            key = (model, int(_value(p, "isl") or 0), int(_value(p, "osl") or 0), FIXED)
        else:
            continue
        groups.setdefault(key, []).append({k: p[k] for k in plotted if k in p})
    out_dir.mkdir(parents=True, exist_ok=True)
    names = [bounded(f"{_slug(key[0])}_agentic" if key[3] == AGENTIC else
                     f"{_slug(key[0])}_isl{key[1]}_osl{key[2]}") for key in sorted(groups)]
    jobs = [(key, rows, out_dir / f"{name}.png")
            for (key, rows), name in zip(sorted(groups.items()), names, strict=True)]
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    if len(jobs) < PARALLEL_FIGURES or (cpus or 1) < 2:
        return PendingPlots(jobs, list(range(len(jobs))), [])
    # Largest figures first, each to the least loaded child (a plain subprocess, not
    # multiprocessing: that would re-run the caller's main module, and pytest's xdist
    # controller runs threads).
    shares = min(len(jobs), cpus or 1)
    loads = [0] * shares
    assigned: list[list[int]] = [[] for _ in range(shares)]
    for index in sorted(range(len(jobs)), key=lambda i: -len(jobs[i][1])):
        share = loads.index(min(loads))
        assigned[share].append(index)
        loads[share] += len(jobs[index][1])
    return PendingPlots(jobs, [], [(indices, _start_child([jobs[i] for i in indices]))
                                   for indices in assigned])


def _start_child(jobs: list[Job]) -> subprocess.Popen[bytes] | None:
    """A child drawing `jobs`; None if it could not be started."""
    try:
        child = subprocess.Popen(
            [sys.executable, "-c", "from pytest_inferbench.report.plots import draw_from_stdin;"
             " draw_from_stdin()"], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL)
    except OSError:
        return None
    assert child.stdin is not None
    try:
        with child.stdin:
            child.stdin.write(json.dumps([[list(key), rows, str(path)]
                                          for key, rows, path in jobs]).encode())
    except OSError:  # it died before reading them: its exit status says so
        pass
    return child


def draw_from_stdin() -> None:
    """A child interpreter's share of the figures: JSON `[[key, rows, path], ...]` on stdin."""
    for key, rows, path in json.load(sys.stdin):
        draw_figure((str(key[0]), int(key[1]), int(key[2]), str(key[3])), rows, Path(path))


def draw_figure(key: tuple[str, int, int, str], group: list[Row], path: Path) -> Path:
    """One (model prefix, ISL/OSL) figure, or a model's agentic one: its panels, one curve per
    server node."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    model, isl, osl, kind = key
    x_axes, y_axis = panels(kind)
    by_node: dict[str, list[Row]] = {}
    for p in group:
        by_node.setdefault(str(p.get("server_node", "?")), []).append(p)
    # The legend sits under the panels: the figure grows by its rows (a matrix plot can
    # hold dozens of nodes), so the panels keep their height. The margins are laid out here
    # (inches): a layout engine would draw the figure once more to measure it, and a matrix
    # figure's hundreds of point labels make every drawing cost.
    legend_columns = min(LEGEND_COLUMNS, len(by_node))
    legend_rows = -(-len(by_node) // legend_columns)
    legend_inches = LEGEND_FRAME_INCHES + LEGEND_ROW_INCHES * legend_rows
    width = 13.0
    height = TITLE_INCHES + PANEL_INCHES + AXIS_LABEL_INCHES + legend_inches + EDGE_INCHES
    dense = len(group) > DENSE_POINTS
    fig, axes = plt.subplots(1, len(x_axes), figsize=(width, height), squeeze=False)
    axes = axes[0]
    fig.subplots_adjust(left=0.8 / width, right=1 - 0.25 / width, wspace=0.22,
                        top=1 - TITLE_INCHES / height,
                        bottom=(legend_inches + AXIS_LABEL_INCHES + EDGE_INCHES) / height)
    for ax, x_axis in zip(axes, x_axes, strict=True):
        for index, (node, rows) in enumerate(sorted(by_node.items())):
            rows = sorted(rows, key=lambda r: int(_value(r, "conc") or 0))
            xy = [(_value(r, x_axis.key), _value(r, y_axis.key), load_label(r)) for r in rows]
            xy = [(x, y, c) for x, y, c in xy if x is not None and y is not None]
            if not xy:
                continue
            # A node keeps its color and line style in both panels (one shared legend).
            ax.plot([x for x, _, _ in xy], [y for _, y, _ in xy], marker="o", label=node,
                    color=f"C{index % 10}", linestyle=LINE_STYLES[index // 10 % 4])
            for x, y, label in labelled(xy, dense):
                # Every point lies inside its autoscaled axes: no clip test per label.
                ax.annotate(label, (x, y), textcoords="offset points", xytext=(4, 4),
                            fontsize=7, annotation_clip=False)
        ax.set_xlabel(x_axis.label)
        ax.set_ylabel(y_axis.label)
        ax.grid(True, alpha=0.3)
    # Both panels draw the same nodes: one legend below them. (A legend per panel placed
    # at "best" searched every point of every curve: most of a matrix plot's time.)
    legend = {label: handle for ax in axes
              for handle, label in zip(*ax.get_legend_handles_labels(), strict=True)}
    labels = sorted(legend)
    handles = [legend[label] for label in labels]
    if handles:
        fig.legend(handles, labels, loc="lower center", bbox_to_anchor=(0.5, EDGE_INCHES / height),
                   fontsize=8, ncols=legend_columns, title_fontsize=8,
                   title="server node (labels: concurrency @request rate)")
    simulated = any(p.get("simulated") is True for p in group)
    not_timed = any(p.get("timings_meaningful") is False for p in group)
    fig.suptitle(
        (f"{model} agentic coding (traces)" if kind == AGENTIC else
         f"{model} ISL {isl} / OSL {osl}")
        + ("  -  SIMULATED (performance model, not hardware)" if simulated else "")
        + ("  -  TIMINGS NOT MEANINGFUL (time scale 0)" if not_timed else "")
    )
    try:
        fig.savefig(path, dpi=110)
    except OSError:  # a full disk: no half-written figure stays
        path.unlink(missing_ok=True)
        raise
    finally:
        plt.close(fig)
    return path


def labelled(curve: list[_P], dense: bool) -> list[_P]:
    """The points of a curve that get their load label: all of them, or in a dense figure,
    where labels would pile up unreadably, its ends (its lowest and highest load)."""
    return curve if not dense or len(curve) < 3 else [curve[0], curve[-1]]


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-") or "model"
