"""Golden acceptance lengths: what speculative decoding should reach, per model, method, mode, k.

The table ships with the package (`data/golden_al/<model-prefix>_<method>.yaml`, InferenceX's
`golden_al_distribution` format: `<model>: {thinking_on: {k: AL}, thinking_off: {k: AL}}`), so
the simulator aims at the same number the gates compare against. A project may add or override
files in a `golden_al/` directory next to its recipes.

Models are matched by their name with everything but letters and digits dropped and lower-cased:
the recipe's model prefix `minimaxm3`, the architecture `MiniMax-M3` and the file's
`minimax-m3` are one model.
"""

from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass
from pathlib import Path

from ..frameworks.specdecode import THINKING_OFF, THINKING_ON
from ..util.yamllines import MappingNode, YamlSyntaxError, compose, line_of, read_text, to_python

__all__ = ["PACKAGED_DIR", "GoldenAL", "GoldenALError", "load_golden_al", "model_key", "packaged"]

PACKAGED_DIR = Path(__file__).parent.parent / "data" / "golden_al"


class GoldenALError(Exception):
    """A golden AL file is malformed or lacks a value; the message names the file."""


def model_key(name: str) -> str:
    """`MiniMax-M3`, `minimax-m3` and `minimaxm3` -> `minimaxm3`."""
    return re.sub(r"[^a-z0-9]", "", name.lower())


@dataclass(frozen=True)
class GoldenAL:
    """Golden acceptance lengths keyed by (model key, method, thinking mode, k)."""

    table: tuple[tuple[tuple[str, str, str, int], float], ...] = ()
    sources: tuple[tuple[tuple[str, str], str], ...] = ()  # (model key, method) -> file

    def lookup(self, model: str, method: str, thinking: str, k: int | None) -> float | None:
        if k is None:
            return None
        return dict(self.table).get((model_key(model), method.lower(), thinking, k))

    def source(self, model: str, method: str) -> str | None:
        return dict(self.sources).get((model_key(model), method.lower()))

    def require(self, model: str, method: str, thinking: str, k: int) -> float:
        """The golden AL, or `GoldenALError` saying which file and which k exist."""
        value = self.lookup(model, method, thinking, k)
        if value is not None:
            return value
        source = self.source(model, method)
        if source is None:
            raise GoldenALError(
                f"no golden acceptance length for {model} with {method}: no "
                f"{model_key(model)}_{method.lower()}.yaml in {PACKAGED_DIR}; force one with the "
                "server's synthetic acceptance flag")
        known = sorted(k for (m, meth, mode, k), _ in self.table
                       if (m, meth, mode) == (model_key(model), method.lower(), thinking))
        raise GoldenALError(f"{source}: no golden acceptance length for {thinking} k={k}; "
                            f"known k: {', '.join(str(x) for x in known)}")

    def merged(self, other: GoldenAL) -> GoldenAL:
        """This table with `other`'s files added; a file for the same model and method wins."""
        replaced = {key for key, _ in other.sources}
        table = {key: al for key, al in self.table if key[:2] not in replaced}
        table.update(other.table)
        return GoldenAL(tuple(table.items()), tuple({**dict(self.sources),
                                                     **dict(other.sources)}.items()))


@functools.cache
def packaged() -> GoldenAL:
    """The table shipped with the package."""
    return load_golden_al(PACKAGED_DIR)


def load_golden_al(directory: Path) -> GoldenAL:
    """Read every `<model-prefix>_<method>.yaml` in `directory` (missing directory: empty)."""
    if not directory.is_dir():
        return GoldenAL()
    table: dict[tuple[str, str, str, int], float] = {}
    sources: dict[tuple[str, str], str] = {}
    for path in sorted(directory.glob("*.yaml")):
        prefix, _, method = path.stem.partition("_")
        if not method:
            raise GoldenALError(f"{path}: name must be <model-prefix>_<method>.yaml")
        key = (model_key(prefix), method.lower())
        for (mode, k), al in _curves(path).items():
            table[(key[0], key[1], mode, k)] = al
        sources[key] = path.name
    return GoldenAL(tuple(table.items()), tuple(sources.items()))


def _curves(path: Path) -> dict[tuple[str, int], float]:
    """`{(thinking mode, k): AL}` of one file; `GoldenALError` with file:line otherwise."""
    try:
        root = compose(read_text(path))
    except YamlSyntaxError as exc:
        raise GoldenALError(f"{path}:{exc.line}: invalid YAML: {exc.problem}") from None
    if not isinstance(root, MappingNode) or len(root.value) != 1:
        raise GoldenALError(f"{path}:{line_of(root) if root else 1}: expected one top-level "
                            "model key")
    modes = root.value[0][1]
    if not isinstance(modes, MappingNode):
        raise GoldenALError(f"{path}:{line_of(modes)}: expected thinking_on/thinking_off "
                            "mappings")
    curves: dict[tuple[str, int], float] = {}
    for mode_node, by_k in modes.value:
        mode = to_python(mode_node)
        if mode not in (THINKING_ON, THINKING_OFF) or not isinstance(by_k, MappingNode):
            raise GoldenALError(f"{path}:{line_of(mode_node)}: {mode!r} must be thinking_on or "
                                "thinking_off mapping k to an acceptance length")
        for k_node, al_node in by_k.value:
            k, al = to_python(k_node), to_python(al_node)
            if (not isinstance(k, int) or isinstance(al, bool)
                    or not isinstance(al, (int, float)) or not math.isfinite(al) or al < 1):
                raise GoldenALError(f"{path}:{line_of(k_node)}: {mode}.{k}: expected integer "
                                    "k -> a finite acceptance length >= 1")
            curves[(mode, k)] = float(al)
    return curves
