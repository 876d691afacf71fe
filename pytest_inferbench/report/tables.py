"""Per-server-node tables (terminal text and GitHub markdown) from report property rows."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from pathlib import PurePath

from ..results import catalog, metric_kinds
from ..results.measurement import SIMULATED_NOTE

# A table row: a point's JUnit properties (or its record) and verdict, or an eval's.
Row = Mapping[str, object]

EVAL_PREFIX = "eval_"
NOT_TIMED_NOTE = ("TIMINGS NOT MEANINGFUL: the simulated server ran at time scale 0 (as fast as "
                  "it can); functional results only")
ESTIMATED_NOTE = ("TOKEN COUNTS ESTIMATED: no local tokenizer for the served model, prompts are "
                  "English words (install the `tokenizer` extra and the model's tokenizer files)")


def _number(value: object, scale: float = 1.0, digits: int = 1) -> str:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return "-"
    return f"{value * scale:.{digits}f}"


def _metric_cell(column: metric_kinds.Column) -> Callable[[Row], str]:
    """The renderer of a metric's column: its value, and the value `beside` it in parentheses
    (the golden AL beside the measured one) where the row has one."""
    def render(row: Row) -> str:
        value = _number(row.get(column.key), column.scale, column.digits)
        other = row.get(column.beside) if column.beside else None
        if isinstance(other, bool) or not isinstance(other, (int, float)):
            return value
        return f"{value} ({other * column.scale:.{column.digits}f})"
    return render


def load_label(row: Row) -> str:
    """`64` for a closed loop at concurrency 64; `64 @5/s` when a request rate limited it."""
    rate = row.get("request_rate")
    if isinstance(rate, bool) or not isinstance(rate, (int, float)):
        return str(row.get("conc", "?"))
    return f"{row.get('conc', '?')} @{rate:g}/s"


def shape_label(row: Row) -> str:
    """`1024/1024`; an agentic replay's traces instead (`traces:synthetic`, `traces:FILE`)."""
    source = row.get("agentic_traces")
    if isinstance(source, str):
        return "traces:" + ("synthetic" if source.startswith("synthetic") else
                            PurePath(source).name)
    return f"{row.get('isl', '?')}/{row.get('osl', '?')}"


TableColumn = tuple[str, Callable[[Row], str]]  # (header, renderer of a row)
LEADING: tuple[TableColumn, ...] = (
    ("ISL/OSL", shape_label),
    ("conc @rate", load_label),
)
TRAILING: tuple[TableColumn, ...] = (("verdict", lambda row: str(row.get("verdict"))),)


def columns(rows: Iterable[Row] = ()) -> tuple[TableColumn, ...]:
    """The point, the metric catalog's columns in its order, the verdict; an optional column
    (an agentic point's metrics) only where one of `rows` has its key."""
    rows = list(rows)
    shown = tuple((c.header, _metric_cell(c)) for c in catalog.columns()
                  if not c.optional or any(c.key in row for row in rows))
    return (*LEADING, *shown, *TRAILING)


def node_rows(rows: Iterable[Row]) -> dict[str, dict[str, list[Row]]]:
    """{node: {"points": rows sorted by isl/osl/conc, "evals": eval rows}}, nodes in name order."""
    nodes: dict[str, dict[str, list[Row]]] = {}
    for row in rows:
        node = str(row.get("server_node") or row.get("eval_node") or "?")
        kind = "points" if "server_node" in row else "evals"
        nodes.setdefault(node, {"points": [], "evals": []})[kind].append(dict(row))
    for entry in nodes.values():
        entry["points"].sort(key=lambda r: tuple(_order(r.get(k)) for k in ("isl", "osl", "conc")))
    return dict(sorted(nodes.items()))


def _order(value: object) -> float:
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else 0


def _cells(row: Row, shown: tuple[TableColumn, ...]) -> list[str]:
    return [render(row) for _, render in shown]


def _simulated(entry: Mapping[str, list[Row]]) -> bool:
    return any(r.get("simulated") is True for kind in ("points", "evals") for r in entry[kind])


def _not_timed(entry: Mapping[str, list[Row]]) -> bool:
    return any(r.get("timings_meaningful") is False for r in entry["points"])


def _estimated(entry: Mapping[str, list[Row]]) -> bool:
    return any(r.get("token_counts_estimated") is True for r in entry["points"])


def _error_lines(entry: Mapping[str, list[Row]]) -> list[str]:
    """The expected error of the node's simulated points: one line, or where its points fall in
    several regimes, one per regime with the points it covers."""
    loads: dict[str, list[str]] = {}
    for row in entry["points"]:
        text = row.get("expected_error_label")
        if isinstance(text, str):
            loads.setdefault(text, []).append(
                f"{row.get('isl', '?')}/{row.get('osl', '?')} conc {load_label(row)}")
    if len(loads) == 1:
        return list(loads)
    return [f"{text}: {', '.join(points)}" for text, points in loads.items()]


def _eval_line(row: Row) -> str:
    scores = []
    # Every filter of the task (GSM8K: strict-match, flexible-extract; GPQA: extract_abcd).
    for key, score in row.items():
        name = key.partition(",")[2]
        if key.startswith("exact_match,") and isinstance(score, (int, float)):
            stderr = row.get(f"exact_match_stderr,{name}", 0.0)
            scores.append(f"{name} {score:.4f} ± {stderr:.4f}")
    detail = ", ".join(scores) if scores else (row.get("reason") or "no scores")
    threshold = row.get("eval_threshold")
    bound = f", threshold {threshold:g}" if isinstance(threshold, (int, float)) else ""
    samples = row.get("eval_samples")
    count = f" (n={samples}{bound})" if samples is not None else ""
    return f"eval {row.get('eval_task', 'gsm8k')}: {detail}{count}: {row.get('verdict')}"


def terminal_tables(nodes: Mapping[str, Mapping[str, list[Row]]]) -> list[str]:
    lines: list[str] = []
    for node, entry in nodes.items():
        title = f"{node}" + (f"  [{SIMULATED_NOTE}]" if _simulated(entry) else "") + (
            f"  [{NOT_TIMED_NOTE}]" if _not_timed(entry) else "") + (
            f"  [{ESTIMATED_NOTE}]" if _estimated(entry) else "")
        lines += ["", title]
        if entry["points"]:
            shown = columns(entry["points"])
            table = [[h for h, _ in shown]] + [_cells(r, shown) for r in entry["points"]]
            widths = [max(len(row[i]) for row in table) for i in range(len(shown))]
            for index, row in enumerate(table):
                lines.append("  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)))
                if index == 0:
                    lines.append("  ".join("-" * w for w in widths))
            lines += [f"  {line}" for line in _error_lines(entry)]
        lines += [f"  {_eval_line(r)}" for r in entry["evals"]]
    return lines


def markdown_tables(
    nodes: Mapping[str, Mapping[str, list[Row]]], meta: Row
) -> str:
    out = [f"## inferbench results (backend {meta.get('backend')})", ""]
    if meta.get("simulated"):
        out += [f"> **{SIMULATED_NOTE}.**", ""]
    for node, entry in nodes.items():
        out += [f"### {node}" + (" (simulated)" if _simulated(entry) else "")
                + (" (token counts estimated)" if _estimated(entry) else ""), ""]
        if _not_timed(entry):
            out += [f"> **{NOT_TIMED_NOTE}.**", ""]
        if _estimated(entry):
            out += [f"> {ESTIMATED_NOTE}.", ""]
        if entry["points"]:
            shown = columns(entry["points"])
            out.append("| " + " | ".join(h for h, _ in shown) + " |")
            out.append("|" + "---:|" * len(shown))
            out += ["| " + " | ".join(_cells(r, shown)) + " |" for r in entry["points"]]
            out.append("")
            out += [f"- {line}" for line in _error_lines(entry)]
        out += [f"- {_eval_line(r)}" for r in entry["evals"]]
        out.append("")
    return "\n".join(out) + "\n"
