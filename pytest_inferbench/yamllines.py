"""YAML read as nodes that keep their line numbers, for messages that say `file:line`.

Every YAML file the plugin reads (recipes, gates files, launch specs, golden ALs) is composed
here, so a syntax error and a bad value name the line the same way everywhere. libyaml composes
the same marked nodes about ten times faster than the pure-Python parser; it is used when
PyYAML was built with it.
"""

from __future__ import annotations

from typing import Any

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

__all__ = ["MappingNode", "Node", "ScalarNode", "SequenceNode", "YamlSyntaxError",
           "compose", "describe", "line_of", "scalar", "to_python"]

_LOADER: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_constructor = yaml.SafeLoader("")


class YamlSyntaxError(ValueError):
    """Text that is not YAML; `line` (1-based) and `problem` say where and what."""

    def __init__(self, line: int, problem: str) -> None:
        super().__init__(f"line {line}: {problem}")
        self.line = line
        self.problem = problem


def compose(text: str) -> Node | None:
    """The document's root node (None for an empty document)."""
    try:
        return yaml.compose(text, Loader=_LOADER)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        raise YamlSyntaxError(mark.line + 1 if mark else 1, str(exc.problem or exc)) from None
    except yaml.YAMLError as exc:
        raise YamlSyntaxError(1, str(exc)) from None


def line_of(node: Node) -> int:
    return int(node.start_mark.line) + 1


def scalar(node: ScalarNode) -> Any:
    """The Python value of a scalar, typed as YAML's safe schema reads it."""
    return to_python(node)


def to_python(node: Node | None) -> Any:
    """The Python value of a node and everything below it (safe schema)."""
    if node is None:
        return None
    try:
        return _constructor.construct_object(node, deep=True)
    finally:  # the constructor remembers every node it built; nothing here is built twice
        _constructor.constructed_objects.clear()


def describe(node: Node) -> str:
    """`a mapping`, `a list`, or the scalar's type and value, for "got ..." messages."""
    if isinstance(node, MappingNode):
        return "a mapping"
    if isinstance(node, SequenceNode):
        return "a list"
    value = scalar(node)  # type: ignore[arg-type]
    return f"{type(value).__name__} {value!r}"
