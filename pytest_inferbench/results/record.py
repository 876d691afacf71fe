"""The result record's types: JSON values, and one point's record, read-only once built.

A record is one flat JSON object: InferenceX's keys (vLLM `benchmark_serving`'s and
`process_result.py`'s) and the plugin's own (identity, server metrics, self-check, verdict).
Gates and baselines look metrics up by the names a gates file gives, so the record stays a
mapping of names to JSON values; what the type adds is that nobody writes to it after it is
built (`PointRecord.with_values` makes a new one) and that every value is JSON.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypeAlias

# Read-only views (Sequence, Mapping): a reader of a record never changes its nested values.
JSONValue: TypeAlias = (bool | int | float | str | Sequence["JSONValue"]
                        | Mapping[str, "JSONValue"] | None)
# A record as read: a point's, a baseline's, a report row, a file's JSON object.
Record: TypeAlias = Mapping[str, JSONValue]


@dataclass(frozen=True, eq=False)  # eq from Mapping: equal to a dict of the same items
class PointRecord(Mapping[str, JSONValue]):
    """One point's record, in the order its files write it; never changed once built."""

    data: Mapping[str, JSONValue] = field(default_factory=dict)

    def __getitem__(self, key: str) -> JSONValue:
        return self.data[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.data)

    def __len__(self) -> int:
        return len(self.data)

    def __repr__(self) -> str:
        return f"PointRecord({dict(self.data)!r})"

    def with_values(self, **changes: JSONValue) -> PointRecord:
        """A new record: changed keys stay where they were, new ones come last."""
        return PointRecord({**self.data, **changes})

    @property
    def result_filename(self) -> str:
        return str(self.data["result_filename"])

    @property
    def gate_failures(self) -> tuple[str, ...]:
        return strings(self.data.get("gate_failures"))

    @property
    def notes(self) -> tuple[str, ...]:
        return strings(self.data.get("notes"))


def strings(value: JSONValue) -> tuple[str, ...]:
    """A list of texts in a record (notes, failures); nothing for anything else."""
    if isinstance(value, str) or not isinstance(value, Sequence):
        return ()
    return tuple(str(item) for item in value)


def number(value: JSONValue) -> float | None:
    """A finite number, or None (a bool, text, null, NaN or infinity is none)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if value == value and abs(value) != float("inf") else None


def mapping(value: JSONValue) -> Mapping[str, JSONValue]:
    """A nested JSON object of a record (server metrics, self-check); empty for anything else."""
    return value if isinstance(value, Mapping) else {}


def to_float(value: JSONValue) -> float:
    """A number a record must hold (NaN and infinity kept); TypeError for anything else."""
    if isinstance(value, (int, float)):
        return float(value)
    raise TypeError(f"expected a number, got {value!r}")


def to_int(value: JSONValue) -> int:
    """A whole number a record must hold (a float is truncated, as `int()` does)."""
    return int(to_float(value))
