"""A point's GPU power: what a backend hands over (`PowerReading`) and the fields the record
and the agg file carry, with InferenceX's keys and rounding.

InferenceX (`utils/aggregate_power.py`) keeps the GPU-metrics samples that fall in the
benchmark's window [`benchmark_start_time_unix`, `benchmark_end_time_unix`], averages each
sample's power over the GPUs it lists, takes the mean of those (`avg_power_w`, per GPU, 3
decimals), counts every GPU the CSV lists (not TP), and divides the energy
`avg_power_w * num_gpus * duration` by the output tokens and by all tokens
(`joules_per_output_token`, `joules_per_total_token`, 6 decimals). `power_valid` (1 or 0, an
int) says whether those fields are there; without a usable telemetry they are left out, never
invented. `total_gpu_energy_j` (3 decimals) is the energy itself.

The record adds two keys of its own: `power_source` (the tool that sampled, or `simulated` for
the simulator's power model) and, when invalid, `power_invalid_reason`.
"""

from __future__ import annotations

import csv
import io
import re
from dataclasses import dataclass
from datetime import datetime, timezone
from statistics import fmean
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .record import JSONValue

SIMULATED_SOURCE = "simulated"
# The agg file's power keys, in the order InferenceX adds them (power_valid and the energy
# first, then aggregate_power.py's three).
AGG_KEYS = ("power_valid", "total_gpu_energy_j", "avg_power_w", "joules_per_output_token",
            "joules_per_total_token")


@dataclass(frozen=True)
class PowerReading:
    """Each GPU's mean power over a point's measured phase, or why there is none.
    `samples_csv`: the telemetry as the tool wrote it (a real backend's), kept as a file."""

    source: str
    avg_power_w: float | None = None
    num_gpus: int = 0
    invalid_reason: str | None = None
    samples_csv: str | None = None

    @property
    def valid(self) -> bool:
        return self.avg_power_w is not None and self.num_gpus > 0

    @classmethod
    def missing(cls, source: str, reason: str, samples_csv: str | None = None) -> PowerReading:
        return cls(source=source, invalid_reason=reason, samples_csv=samples_csv)


def power_fields(reading: PowerReading, *, duration_s: float, total_input_tokens: int,
                 total_output_tokens: int) -> dict[str, JSONValue]:
    """The record's power keys for a point of these totals."""
    out: dict[str, JSONValue] = {"power_source": reading.source}
    if not reading.valid or reading.avg_power_w is None:
        return out | {"power_valid": 0,
                      "power_invalid_reason": reading.invalid_reason or "no power samples"}
    if total_output_tokens <= 0 or duration_s <= 0:
        return out | {"power_valid": 0, "power_invalid_reason":
                      "no output tokens or no duration: no energy per token"}
    energy = reading.avg_power_w * reading.num_gpus * duration_s
    total_tokens = total_input_tokens + total_output_tokens
    return out | {
        "power_valid": 1,
        "power_num_gpus": reading.num_gpus,
        "total_gpu_energy_j": round(energy, 3),
        "avg_power_w": round(reading.avg_power_w, 3),
        "joules_per_output_token": round(energy / total_output_tokens, 6),
        "joules_per_total_token": round(energy / total_tokens, 6),
    }


# --- the samples of nvidia-smi / amd-smi, windowed as aggregate_power.py windows them --------

_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
_GPU_COLUMN = re.compile(r"^(index|gpu|gpu_id|gpu_index|card|device)$", re.IGNORECASE)


def _unix_time(text: str) -> float | None:
    """A sample's time: nvidia-smi's `YYYY/MM/DD HH:MM:SS.fff` and amd-smi's ISO 8601 (both
    local time when they carry no zone), or epoch seconds / milliseconds."""
    text = text.strip()
    if _NUMBER.fullmatch(text):
        value = float(text)
        return value / 1000.0 if value > 1e12 else value
    for layout in ("%Y/%m/%d %H:%M:%S.%f", "%Y/%m/%d %H:%M:%S"):
        try:
            return datetime.strptime(text, layout).timestamp()
        except ValueError:
            pass
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError:
        return None
    return parsed.astimezone(timezone.utc).timestamp() if parsed.tzinfo else parsed.timestamp()


def _watts(text: str) -> float | None:
    """`412.34 W` (nvidia-smi), a bare number (amd-smi); `[N/A]` is none."""
    found = _NUMBER.search(text)
    return float(found.group(0)) if found else None


def _columns(header: list[str]) -> tuple[str | None, str | None, str | None]:
    """(time, power draw, GPU index) columns: a power column that is no limit or cap."""
    time_col = next((c for c in header if "time" in c.lower()), None)
    power_col = next((c for c in header if "power" in c.lower()
                      and not re.search("limit|cap|max|min", c, re.IGNORECASE)), None)
    gpu_col = next((c for c in header if _GPU_COLUMN.match(c)), None)
    return time_col, power_col, gpu_col


def window_power(samples_csv: str, start_unix: float, end_unix: float
                 ) -> tuple[float, int] | str:
    """(mean power per GPU, GPUs listed) over the samples in [start, end], or why none."""
    if end_unix <= start_unix:
        return "the measured phase has no duration"
    reader = csv.DictReader(io.StringIO(samples_csv), skipinitialspace=True)
    header = [name.strip() for name in reader.fieldnames or []]
    reader.fieldnames = header
    time_col, power_col, gpu_col = _columns(header)
    if time_col is None or power_col is None:
        return "the GPU metrics have no time or power column"
    totals: dict[float, float] = {}
    rows: dict[float, int] = {}
    gpus_at: dict[float, set[str]] = {}
    for row in reader:
        when = _unix_time(row.get(time_col) or "")
        watts = _watts(row.get(power_col) or "")
        if when is None or watts is None or not start_unix <= when <= end_unix:
            continue
        at = round(when, 3)  # one sample of every GPU shares its time to the millisecond
        totals[at] = totals.get(at, 0.0) + watts
        rows[at] = rows.get(at, 0) + 1
        gpu = (row.get(gpu_col) or "").strip() if gpu_col else ""
        if gpu:
            gpus_at.setdefault(at, set()).add(gpu)
    if not totals:
        return "no GPU power sample fell in the measured phase"
    if gpus_at:
        per_gpu = [total / max(len(gpus_at.get(at, ())), 1) for at, total in totals.items()]
        return fmean(per_gpu), len(set().union(*gpus_at.values()))
    return fmean(total / rows[at] for at, total in totals.items()), max(rows.values())
