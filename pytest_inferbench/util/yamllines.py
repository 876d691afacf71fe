"""YAML read as nodes that keep their line numbers, for messages that say `file:line`.

Every YAML file the plugin reads (recipes, gates files, launch specs, golden ALs) is composed
here, so a syntax error and a bad value name the line the same way everywhere. libyaml composes
the same marked nodes about ten times faster than the pure-Python parser; it is used when
PyYAML was built with it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

if TYPE_CHECKING:
    from pathlib import Path

__all__ = ["MappingNode", "Node", "ScalarNode", "SequenceNode", "YamlSyntaxError",
           "compose", "describe", "line_of", "load_data", "read_text", "scalar", "to_python"]

_LOADER: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_constructor = yaml.SafeLoader("")

# Bounds on a document as its readers see it, aliases expanded: an alias costs nothing to
# compose, but every reader that walks or builds the tree pays for each expansion, so a few
# hundred bytes of nested aliases ("billion laughs") would take minutes to read. InferenceX's
# largest master file is about 30,000 nodes deep 10; these leave room for far larger ones.
MAX_EXPANDED_NODES = 2_000_000
MAX_DEPTH = 100


class YamlSyntaxError(ValueError):
    """Text that is not YAML; `line` (1-based) and `problem` say where and what."""

    def __init__(self, line: int, problem: str) -> None:
        super().__init__(f"line {line}: {problem}")
        self.line = line
        self.problem = problem


def read_text(path: Path) -> str:
    """A YAML file's text; bytes that are not UTF-8 are a `YamlSyntaxError` naming the line."""
    data = path.read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise YamlSyntaxError(line, f"not UTF-8 text (byte 0x{data[exc.start]:02x})") from None


def load_data(text: str | bytes) -> object:
    """Plain data (no line numbers) through the same safe loader and bounds, for files read
    whole and judged elsewhere (master files' keys, changelog history, catalog data). Raises
    `yaml.YAMLError`."""
    try:
        _check_nesting(text)
    except YamlSyntaxError as exc:
        raise yaml.YAMLError(str(exc)) from None
    root = yaml.compose(text, Loader=_LOADER)
    if root is None:
        return None
    problem = _oversize(root)
    if problem is not None:
        raise yaml.YAMLError(f"line {problem[0]}: {problem[1]}")
    return to_python(root)


def compose(text: str) -> Node | None:
    """The document's root node (None for an empty document).

    Values the safe schema cannot build (an unknown `!tag`, `2001-13-45` read as a date, an
    integer too long to convert) are syntax errors here, with their line, so no reader meets
    them later as an exception without one.
    """
    try:
        _check_nesting(text)
        root = yaml.compose(text, Loader=_LOADER)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        raise YamlSyntaxError(mark.line + 1 if mark else 1, str(exc.problem or exc)) from None
    except yaml.YAMLError as exc:
        raise YamlSyntaxError(1, str(exc)) from None
    if root is not None:
        problem = _oversize(root)
        if problem is not None:
            raise YamlSyntaxError(*problem)
        _check_values(root)
    return root


_OPENS = (yaml.MappingStartEvent, yaml.SequenceStartEvent)
_CLOSES = (yaml.MappingEndEvent, yaml.SequenceEndEvent)


def _check_nesting(text: str | bytes) -> None:
    """`MAX_DEPTH` held before anything is composed: libyaml's composer recurses once per
    level in C, so a document nested some 100,000 levels deep (a few hundred kilobytes of
    brackets) would crash the interpreter, not raise. Its parser keeps its own stack, so
    the events are read flat, at about a third of what composing costs."""
    depth = 0
    try:
        for event in yaml.parse(text, Loader=_LOADER):
            if isinstance(event, _OPENS):
                depth += 1
                if depth > MAX_DEPTH:
                    mark = event.start_mark
                    raise YamlSyntaxError(mark.line + 1 if mark else 1,
                                          f"nested deeper than {MAX_DEPTH} levels")
            elif isinstance(event, _CLOSES):
                depth -= 1
    except yaml.MarkedYAMLError as exc:
        # Newer libyaml builds have a limit of their own, which their scanner may reach before
        # the parser hands over the events that reach ours: the same problem, in our words.
        if "maximum nesting depth" not in str(exc.problem):
            raise
        mark = exc.problem_mark or exc.context_mark
        raise YamlSyntaxError(mark.line + 1 if mark else 1,
                              f"nested deeper than {MAX_DEPTH} levels") from None


def _children(node: Node) -> list[Node]:
    if isinstance(node, MappingNode):
        return [part for pair in node.value for part in pair]
    if isinstance(node, SequenceNode):
        return list(node.value)
    return []


def _oversize(root: Node) -> tuple[int, str] | None:
    """(line, problem) when the document, aliases expanded, passes `MAX_EXPANDED_NODES` or
    `MAX_DEPTH`; None otherwise. Each distinct node is visited once (sizes of shared nodes are
    remembered), so the check costs what composing did, however large the expansion."""
    expanded: dict[int, int] = {}
    stack: list[tuple[Node, int, bool]] = [(root, 1, False)]
    while stack:
        node, depth, children_done = stack.pop()
        if depth > MAX_DEPTH:
            return line_of(node), f"nested deeper than {MAX_DEPTH} levels"
        if children_done:
            size = 1 + sum(expanded[id(child)] for child in _children(node))
            if size > MAX_EXPANDED_NODES:
                return line_of(node), (f"aliases expand it past {MAX_EXPANDED_NODES:,} values "
                                       "(nested aliases that multiply, a \"billion laughs\")")
            expanded[id(node)] = size
        elif id(node) not in expanded:
            stack.append((node, depth, True))
            stack += [(child, depth + 1, False) for child in _children(node)
                      if id(child) not in expanded]
    return None


_STANDARD_TAGS = frozenset(f"tag:yaml.org,2002:{name}" for name in (
    "map", "seq", "str", "int", "float", "bool", "null", "timestamp", "binary", "omap",
    "pairs", "set", "merge", "value"))
_CHECKED_TAGS = frozenset(f"tag:yaml.org,2002:{name}" for name in (
    "timestamp", "binary", "int", "float"))


def _check_values(root: Node) -> None:
    stack = [root]
    seen: set[int] = set()
    while stack:
        node = stack.pop()
        if id(node) in seen:  # aliases share nodes
            continue
        seen.add(id(node))
        if node.tag not in _STANDARD_TAGS:
            raise YamlSyntaxError(line_of(node), f"tag {node.tag!r} is not supported (plain "
                                  "YAML values only)")
        if isinstance(node, ScalarNode):
            if node.tag in _CHECKED_TAGS and (node.tag.endswith(("timestamp", "binary"))
                                              or len(node.value) > 64):
                try:
                    to_python(node)
                except (yaml.YAMLError, ValueError, OverflowError) as exc:
                    kind = node.tag.rsplit(":", 1)[-1]
                    why = (f"{len(node.value)} characters" if kind in ("int", "float")
                           else str(exc))
                    raise YamlSyntaxError(line_of(node), f"{node.value[:40]!r} cannot be read "
                                          f"as a {kind} ({why}); quote it to keep it as "
                                          "text") from None
        elif isinstance(node, MappingNode):
            for key, value in node.value:
                stack += [key, value]
        elif isinstance(node, SequenceNode):
            stack += node.value


def line_of(node: Node) -> int:
    return int(node.start_mark.line) + 1


def scalar(node: ScalarNode) -> object:
    """The Python value of a scalar, typed as YAML's safe schema reads it."""
    return to_python(node)


def to_python(node: Node | None) -> object:
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
