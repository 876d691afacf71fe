"""Typed accessors over composed YAML nodes that record `path:line: key.path: problem` errors.

`yamllines` composes the YAML into nodes that carry their line marks; they are walked by hand,
and every accessor records what is wrong and returns None instead of raising, so one walk
reports every problem.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..util import yamllines
from ..util.yamllines import MappingNode, Node, ScalarNode, SequenceNode
from .model import MAX_CONCURRENCY, expand_concurrency

if TYPE_CHECKING:
    from pathlib import Path


class RecipeError(Exception):
    """All problems of one recipe file, one `path:line: ...` line each."""

    def __init__(self, messages: list[str]) -> None:
        super().__init__("\n".join(messages))
        self.messages = messages


@dataclass
class Errors:
    path: Path
    messages: list[str] = field(default_factory=list)

    def add(self, node: Node, key_path: str, problem: str) -> None:
        self.messages.append(f"{self.path}:{node.start_mark.line + 1}: {key_path}: {problem}")


scalar = yamllines.scalar
describe = yamllines.describe


class Walker:
    """Typed accessors over YAML nodes that record errors instead of raising."""

    def __init__(self, errors: Errors) -> None:
        self.errors = errors

    def mapping(self, node: Node, where: str, allowed: tuple[str, ...],
                required: tuple[str, ...] = ()) -> dict[str, Node] | None:
        if not isinstance(node, MappingNode):
            self.errors.add(node, where, f"got {describe(node)} (expected a mapping)")
            return None
        out: dict[str, Node] = {}
        for key_node, value_node in node.value:
            key = str(scalar(key_node)) if isinstance(key_node, ScalarNode) else "?"
            if key in out:
                self.errors.add(key_node, f"{where}.{key}", "duplicate key")
                continue
            if key not in allowed:
                self.errors.add(key_node, f"{where}.{key}",
                                f"unknown key (expected one of: {', '.join(allowed)})")
                continue
            out[key] = value_node
        for key in required:
            if key not in out:
                self.errors.add(node, f"{where}.{key}", "missing required key")
        return out

    def sequence(self, node: Node, where: str) -> list[Node] | None:
        if not isinstance(node, SequenceNode):
            self.errors.add(node, where, f"got {describe(node)} (expected a list)")
            return None
        return list(node.value)

    def string(self, node: Node, where: str) -> str | None:
        value = scalar(node) if isinstance(node, ScalarNode) else None
        if not isinstance(value, str) or not value:
            self.errors.add(node, where, f"got {describe(node)} (expected a non-empty string)")
            return None
        return value

    def integer(self, node: Node, where: str, minimum: int | None = 1,
                maximum: int | None = None) -> int | None:
        value = scalar(node) if isinstance(node, ScalarNode) else None
        if not isinstance(value, int) or isinstance(value, bool):
            self.errors.add(node, where, f"got {describe(node)} (expected an integer)")
            return None
        if minimum is not None and value < minimum:
            self.errors.add(node, where, f"got {value} (expected an integer >= {minimum})")
            return None
        if maximum is not None and value > maximum:
            self.errors.add(node, where, f"got {value} (expected an integer <= {maximum})")
            return None
        return value

    def boolean(self, node: Node, where: str) -> bool | None:
        value = scalar(node) if isinstance(node, ScalarNode) else None
        if not isinstance(value, bool):
            self.errors.add(node, where, f"got {describe(node)} (expected true or false)")
            return None
        return value

    def choice(self, node: Node, where: str, choices: tuple[str, ...]) -> str | None:
        value = scalar(node) if isinstance(node, ScalarNode) else None
        if value not in choices:
            self.errors.add(node, where,
                            f"got {describe(node)} (expected one of: {', '.join(choices)})")
            return None
        return str(value)

    def fraction(self, node: Node, where: str) -> float | None:
        """A number in (0, 1], such as a utilization."""
        value = scalar(node) if isinstance(node, ScalarNode) else None
        if (not isinstance(value, (int, float)) or isinstance(value, bool)
                or not math.isfinite(value) or not 0 < value <= 1):
            self.errors.add(node, where, f"got {describe(node)} (expected a number in (0, 1])")
            return None
        return float(value)

    def component(self, node: Node, where: str, version_required: bool) -> str | None:
        """`{name, version}` metadata of a runtime component, as `name@version` (or `name`)."""
        required = ("name", "version") if version_required else ("name",)
        fields = self.mapping(node, where, ("name", "version"), required)
        if fields is None or "name" not in fields:
            return None
        name = self.string(fields["name"], f"{where}.name")
        version = (self.string(fields["version"], f"{where}.version")
                   if "version" in fields else "")
        if name is None or version is None or (version_required and not version):
            return None
        return f"{name}@{version}" if version else name

    def concurrencies(self, node: Node, fields: dict[str, Node], where: str
                      ) -> tuple[int, ...] | None:
        has_range = "conc-start" in fields or "conc-end" in fields
        if has_range and "conc-list" in fields:
            self.errors.add(node, where, "both 'conc-list' and 'conc-start'/'conc-end' given "
                            "(expected either a list or a range, not both)")
            return None
        if "conc-list" in fields:
            items = self.sequence(fields["conc-list"], f"{where}.conc-list")
            if items is None:
                return None
            if not items:
                self.errors.add(fields["conc-list"], f"{where}.conc-list",
                                "empty list (expected at least one concurrency)")
                return None
            values = [self.integer(item, f"{where}.conc-list[{i}]", maximum=MAX_CONCURRENCY)
                      for i, item in enumerate(items)]
            return None if None in values else tuple(v for v in values if v is not None)
        if "conc-start" not in fields or "conc-end" not in fields:
            self.errors.add(node, where, "no concurrency (expected 'conc-list' or both "
                            "'conc-start' and 'conc-end')")
            return None
        start = self.integer(fields["conc-start"], f"{where}.conc-start", maximum=MAX_CONCURRENCY)
        end = self.integer(fields["conc-end"], f"{where}.conc-end", maximum=MAX_CONCURRENCY)
        if start is None or end is None:
            return None
        if start > end:
            self.errors.add(fields["conc-start"], f"{where}.conc-start",
                            f"conc-start ({start}) > conc-end ({end}) (expected start <= end)")
            return None
        return expand_concurrency(start, end)


