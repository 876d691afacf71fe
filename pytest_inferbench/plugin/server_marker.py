"""Which recipe server a Python test means: `@pytest.mark.inferbench_server(key, tp=4, ...)`.

The config key is looked up in the recipes of the run, as the collector finds them: the recipe
files collected in this session first, then every file under the rootdir that matches the
`inferbench_recipes` globs (directories pytest would not enter are skipped, except the recipe
directories of an InferenceX checkout). Keyword selectors pick one server of an entry that
has several (`tp=8, ep=8, dp_attn=True`); a marker that matches none, or servers that differ,
is an error that lists the candidates.
"""

from __future__ import annotations

import fnmatch
import os
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from ..recipe.model import Parallelism
from ..recipe.schema import RecipeError, load_recipe
from ..state import get_session_state

if TYPE_CHECKING:
    from ..recipe.model import ServerConfig

MARKER = "inferbench_server"
FIXTURE = "inferbench_server"  # also indirectly parametrized by a config key
MARKER_HELP = (
    "inferbench_server(config_key, *, recipe=None, tp=..., ep=..., dp_attn=..., "
    "spec_decoding=...): the recipe server the test's inferbench_server fixture starts "
    "(shared with every other user of the same server)")
PARALLEL_SELECTORS = tuple(f.name for f in fields(Parallelism))  # asked of `server.parallel`
SELECTORS = (*PARALLEL_SELECTORS, "spec_decoding", "runner", "hardware", "framework",
             "precision", "model_prefix", "scenario")


class ServerSelectError(Exception):
    """The marker names no server, or several different ones (the message lists them)."""


@dataclass
class RecipeIndex:
    """The recipe files this session knows of, parsed once each."""

    collected: list[Path] = field(default_factory=list)  # in collection order
    parsed: dict[Path, tuple[ServerConfig, ...]] = field(default_factory=dict)
    discovered: list[Path] | None = None


INDEX_KEY = pytest.StashKey[RecipeIndex]()


def _index(config: pytest.Config) -> RecipeIndex:
    return config.stash.setdefault(INDEX_KEY, RecipeIndex())


def note_collected(config: pytest.Config, path: Path) -> None:
    """A recipe file was collected in this session: searched first."""
    _index(config).collected.append(path)


def _discover(config: pytest.Config) -> list[Path]:
    settings = get_session_state(config).settings
    skip = list(config.getini("norecursedirs"))
    entered = {p.resolve() for p in settings.layout.unignored()}
    found: list[Path] = []
    for top, dirs, files in os.walk(config.rootpath):
        here = Path(top)
        dirs[:] = sorted(d for d in dirs if (here / d).resolve() in entered
                         or not any(fnmatch.fnmatch(d, pattern) for pattern in skip))
        found += [here / f for f in sorted(files)
                  if any(fnmatch.fnmatch(f, g) for g in settings.recipe_globs)]
    return found


def _servers(index: RecipeIndex, path: Path) -> tuple[ServerConfig, ...]:
    if path not in index.parsed:
        try:
            index.parsed[path] = load_recipe(path, strict=False).servers
        except RecipeError:
            index.parsed[path] = ()  # an unreadable file fails its own collection
    return index.parsed[path]


def marker_server(config: pytest.Config, mark: pytest.Mark) -> ServerConfig:
    """The server a test's `inferbench_server` marker names."""
    if len(mark.args) != 1 or not isinstance(mark.args[0], str):
        raise ServerSelectError(f"{MARKER}: give one config key as the first argument, e.g. "
                                f'@pytest.mark.{MARKER}("minimaxm3-fp4-mi355x-atom-mtp", tp=4)')
    kwargs = dict(mark.kwargs)
    recipe = kwargs.pop("recipe", None)
    return find_server(config, mark.args[0], recipe=recipe, **kwargs)


def param_server(config: pytest.Config, param: object) -> ServerConfig:
    """The server an indirect parameter of `inferbench_server` names: a config key, or a
    mapping with `config_key` and selectors (`{"config_key": "...", "tp": 8}`)."""
    if isinstance(param, str):
        return find_server(config, param)
    if isinstance(param, dict) and isinstance(param.get("config_key"), str):
        selectors = dict(param)
        key = selectors.pop("config_key")
        recipe = selectors.pop("recipe", None)
        return find_server(config, key, recipe=recipe, **selectors)
    raise ServerSelectError(f"inferbench_server parameter {param!r}: expected a config key or "
                            "a dict with config_key and selectors")


def item_server(config: pytest.Config, item: pytest.Item) -> ServerConfig | None:
    """The server a test names, by an indirect `inferbench_server` parameter or the marker;
    None when it names none."""
    callspec = getattr(item, "callspec", None)
    if callspec is not None and FIXTURE in callspec.params:
        return param_server(config, callspec.params[FIXTURE])
    mark = item.get_closest_marker(MARKER)
    return marker_server(config, mark) if mark is not None else None


def names_server(item: pytest.Item) -> bool:
    callspec = getattr(item, "callspec", None)
    return (callspec is not None and FIXTURE in callspec.params) or (
        item.get_closest_marker(MARKER) is not None)


def find_server(config: pytest.Config, config_key: str, *, recipe: str | os.PathLike[str] | None
                = None, **selectors: object) -> ServerConfig:
    unknown = sorted(set(selectors) - set(SELECTORS))
    if unknown:
        raise ServerSelectError(f"{MARKER}({config_key!r}): unknown selector "
                                f"{', '.join(unknown)} (expected one of {', '.join(SELECTORS)})")
    index = _index(config)
    if recipe is not None:
        path = Path(recipe)
        files = [path if path.is_absolute() else config.rootpath / path]
        if not files[0].is_file():
            raise ServerSelectError(f"{MARKER}({config_key!r}): recipe file {files[0]} not found")
    else:
        if index.discovered is None:
            index.discovered = _discover(config)
        files = list(dict.fromkeys([*index.collected, *index.discovered]))
    named = [s for f in files for s in _servers(index, f) if s.config_key == config_key]
    chosen = [s for s in named if all(getattr(s.parallel if k in PARALLEL_SELECTORS else s, k) == v
                                      for k, v in selectors.items())]
    wanted = ", ".join([repr(config_key), *(f"{k}={v!r}" for k, v in selectors.items())])
    if not named:
        where = ", ".join(str(f) for f in files) or f"no recipe files under {config.rootpath}"
        raise ServerSelectError(f"{MARKER}({wanted}): no such config key in {where}")
    if not chosen:
        raise ServerSelectError(f"{MARKER}({wanted}): no server of {config_key} matches; it has "
                                + ", ".join(s.node_name for s in named))
    shapes = {s.identity for s in chosen}
    if len(shapes) > 1:
        raise ServerSelectError(f"{MARKER}({wanted}) matches several servers: "
                                + ", ".join(sorted({s.node_name for s in chosen}))
                                + "; add selectors (tp=, ep=, dp_attn=, spec_decoding=)")
    return chosen[0]
