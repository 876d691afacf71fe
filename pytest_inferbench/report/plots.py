"""PNG plots (optional `plot` extra): throughput per GPU against interactivity and E2E latency.

One figure per (model prefix, ISL/OSL) with two panels, one curve per server node (points in
concurrency order, each labelled with its concurrency), the way InferenceX charts its sweeps.
Simulated results say so in the title.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from .tables import Row, load_label

if TYPE_CHECKING:
    from collections.abc import Sequence
    from pathlib import Path


LINE_STYLES = ("-", "--", ":", "-.")
LEGEND_COLUMNS = 4
LEGEND_ROW_INCHES = 0.19  # one 8-point legend line


def _value(point: Row, key: str) -> float | None:
    value = point.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def plot_results(points: Sequence[Row], out_dir: Path) -> list[Path] | None:
    """Write the PNGs and return their paths; None when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    groups: dict[tuple[str, int, int], list[Row]] = {}
    for p in points:
        if _value(p, "tput_per_gpu") is not None:
            key = (str(p.get("model_prefix", "model")), int(_value(p, "isl") or 0),
                   int(_value(p, "osl") or 0))
            groups.setdefault(key, []).append(p)
    written: list[Path] = []
    out_dir.mkdir(parents=True, exist_ok=True)
    for (model, isl, osl), group in sorted(groups.items()):
        panels = (
            ("median_intvty", "Interactivity, median (tok/s/user)"),
            ("median_e2el", "End-to-end latency, median (s)"),
        )
        by_node: dict[str, list[Row]] = {}
        for p in group:
            by_node.setdefault(str(p.get("server_node", "?")), []).append(p)
        # The legend sits under the panels: the figure grows by its rows (a matrix plot can
        # hold dozens of nodes), so the panels keep their height.
        legend_columns = min(LEGEND_COLUMNS, len(by_node))
        legend_rows = -(-len(by_node) // legend_columns)
        fig, axes = plt.subplots(1, 2, figsize=(13, 5.0 + 0.6 + LEGEND_ROW_INCHES * legend_rows),
                                 constrained_layout=True)
        for ax, (x_key, x_label) in zip(axes, panels, strict=True):
            for index, (node, rows) in enumerate(sorted(by_node.items())):
                rows = sorted(rows, key=lambda r: int(_value(r, "conc") or 0))
                xy = [(_value(r, x_key), _value(r, "tput_per_gpu"), load_label(r)) for r in rows]
                xy = [(x, y, c) for x, y, c in xy if x is not None and y is not None]
                if not xy:
                    continue
                # A node keeps its color and line style in both panels (one shared legend).
                ax.plot([x for x, _, _ in xy], [y for _, y, _ in xy], marker="o", label=node,
                        color=f"C{index % 10}", linestyle=LINE_STYLES[index // 10 % 4])
                for x, y, label in xy:
                    ax.annotate(
                        label, (x, y), textcoords="offset points", xytext=(4, 4), fontsize=7
                    ).set_in_layout(False)
            ax.set_xlabel(x_label)
            ax.set_ylabel("Throughput per GPU (tok/s/GPU)")
            ax.grid(True, alpha=0.3)
        # Both panels draw the same nodes: one legend below them. (A legend per panel placed
        # at "best" searched every point of every curve: most of a matrix plot's time.)
        legend = {label: handle for ax in axes
                  for handle, label in zip(*ax.get_legend_handles_labels(), strict=True)}
        labels = sorted(legend)
        handles = [legend[label] for label in labels]
        if handles:
            fig.legend(handles, labels, loc="outside lower center", fontsize=8,
                       ncols=legend_columns, title_fontsize=8,
                       title="server node (labels: concurrency @request rate)")
        simulated = any(p.get("simulated") is True for p in group)
        not_timed = any(p.get("timings_meaningful") is False for p in group)
        fig.suptitle(
            f"{model} ISL {isl} / OSL {osl}"
            + ("  -  SIMULATED (performance model, not hardware)" if simulated else "")
            + ("  -  TIMINGS NOT MEANINGFUL (time scale 0)" if not_timed else "")
        )
        path = out_dir / f"{_slug(model)}_isl{isl}_osl{osl}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    return written


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-") or "model"
