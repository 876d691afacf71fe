"""The changelog's history rule, as InferenceX's `utils/validate_perf_changelog.py` enforces it.

Existing entries are immutable byte for byte, except pr-link-only corrections to a canonical
link (which may not be mixed with additions). New entries go at the end, each after at least one
empty line (spaces on it allowed), and the file ends with one newline.
A changed, deleted, reformatted or inserted-in-the-middle entry fails with one line naming it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import yaml

from ..util.yamllines import load_data
from . import PR_URL

ENTRY_START = re.compile(rb"(?m)^- config-keys:")
# The end of the previous entry, then empty lines. A line of spaces counts as empty, and more
# than one is accepted: InferenceX's history has a line of spaces followed by an empty line
# before several entries, added by changes its sweep validator accepted.
BLANK_LINES = re.compile(rb"\S[^\n]*\n(?: *\n)+\Z")
TRAILING_EMPTY_LINES = re.compile(rb"(?:\n *)+\Z")


@dataclass
class History:
    added: set[int] = field(default_factory=set)  # 0-based indices of appended entries
    failures: list[str] = field(default_factory=list)


def _chunks(raw: bytes) -> list[bytes]:
    """The raw bytes of each entry (from its `- config-keys:` to the next one)."""
    starts = [m.start() for m in ENTRY_START.finditer(raw)]
    # Each entry ends where the next starts, the last at the end of the file; a file without
    # entries (empty at the base, or new on the branch) has no chunks.
    return [raw[a:b] for a, b in zip(starts, [*starts[1:], len(raw)][:len(starts)],
                                     strict=True)]


def _trimmed(chunk: bytes) -> bytes:
    """An entry's bytes without the empty lines after it (the separator before the next)."""
    return TRAILING_EMPTY_LINES.sub(b"", chunk)


def _data(raw: bytes) -> list[object]:
    try:
        data = load_data(raw.decode("utf-8"))
    except (UnicodeDecodeError, yaml.YAMLError):
        return []
    return data if isinstance(data, list) else []


def _name(entry: object, raw: bytes, start: int) -> str:
    line = raw[:start].count(b"\n") + 1
    keys = entry.get("config-keys") if isinstance(entry, dict) else None
    shown = ", ".join(map(str, keys)) if isinstance(keys, list) else "?"
    return f"entry at line {line} ({shown})"


def _without_link(entry: object) -> object:
    return {k: v for k, v in entry.items() if k != "pr-link"} if isinstance(entry, dict) else entry


def check_history(base_raw: bytes, head_raw: bytes) -> History:
    """Compare the changelog at the base revision with the working tree's."""
    history = History()
    base, head = _data(base_raw), _data(head_raw)
    base_chunks, head_chunks = _chunks(base_raw), _chunks(head_raw)
    head_starts = [m.start() for m in ENTRY_START.finditer(head_raw)]
    base_starts = [m.start() for m in ENTRY_START.finditer(base_raw)]
    if len(base) != len(base_chunks) or len(head) != len(head_chunks):
        history.failures.append("perf-changelog.yaml: every entry must start a line with "
                                "'- config-keys:'")
        return history
    corrections = 0
    for i, old in enumerate(base):
        new = head[i] if i < len(head) else None
        same_bytes = i < len(head_chunks) and (
            _trimmed(head_chunks[i]) == _trimmed(base_chunks[i]))
        if old == new and same_bytes:
            continue
        here = _name(new, head_raw, head_starts[i]) if new is not None else ""
        if old == new:
            problem = f"{here}: reformatted; existing entries are immutable byte for byte"
        elif new is not None and _without_link(old) == _without_link(new):
            link = str(new.get("pr-link", "")) if isinstance(new, dict) else ""
            if PR_URL.fullmatch(link):
                corrections += 1  # a pr-link-only correction to a canonical link
                continue
            problem = f"{here}: pr-link correction {link!r} is not a canonical PR URL"
        elif old in head[i + 1:]:
            problem = (f"{here}: inserted in the middle of the history; append new entries "
                       "at the end")
        elif old in head[:i]:
            problem = f"{here}: moved; existing entries keep their order"
        elif len(head) < len(base) or new is None:
            problem = f"{_name(old, base_raw, base_starts[i])} of the base revision: deleted"
        else:
            problem = f"{here}: changed; existing entries are immutable except pr-link fixes"
        history.failures.append(problem)
        break  # every later entry is shifted by the first difference: one line says it
    if history.failures:
        return history
    history.added = set(range(len(base), len(head)))
    if corrections and history.added:
        history.failures.append("perf-changelog.yaml: pr-link corrections mixed with new "
                                "entries; make them in separate changes")
    if history.added:
        history.failures += _separation(base_raw, head_raw, head, head_starts, len(base))
    return history


def _separation(base_raw: bytes, head_raw: bytes, head: list[object], starts: list[int],
                first_added: int) -> list[str]:
    failures = []
    for i in range(first_added, len(head)):
        if i > 0 and not BLANK_LINES.search(head_raw[:starts[i]]):
            failures.append(f"{_name(head[i], head_raw, starts[i])}: must follow the previous "
                            "entry after an empty line")
    if not head_raw.startswith(base_raw.rstrip(b"\n")):
        failures.append("perf-changelog.yaml: the historical bytes changed; restore them "
                        "byte for byte and append at the end")
    if head_raw.endswith(b"\n\n"):
        failures.append("perf-changelog.yaml: the last entry must end with exactly one newline")
    return failures
