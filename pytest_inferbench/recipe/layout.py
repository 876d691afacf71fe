"""Where a checkout keeps its recipes, changelog, eval thresholds and launch specs.

InferenceX keeps its master configs in `.github/configs/` (newer checkouts: `configs/`), the
changelog at the repository root and the eval thresholds in `utils/evals/thresholds.yaml`. A
checkout that looks like that (a root `perf-changelog.yaml` and master configs in one of those
directories) gets those places by default; ini options name them anywhere else. Without either,
the plugin looks beside each recipe file (`perf-changelog.yaml`, `evals/thresholds.yaml`,
`launch/`), as in this project's `benchmarks/`.

Newer checkouts keep retired master configs in `configs/deprecated/`: a `deprecated/` directory
inside a recipe directory is left out unless asked for (`include_deprecated`) or named on the
command line. Run at an InferenceX checkout's root with no path named, pytest would also walk
InferenceX's own Python tests (`utils/test_*.py`, which need InferenceX's environment); the
plugin then collects only what it owns there: the recipe directories and the changelog.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass
from pathlib import Path

INFERENCEX_RECIPE_DIRS = (".github/configs", "configs")
INFERENCEX_CHANGELOG = "perf-changelog.yaml"
# Newer checkouts keep YAML, older ones JSON; the first that exists is read.
INFERENCEX_THRESHOLDS = ("utils/evals/thresholds.yaml", "utils/evals/thresholds.json")
BESIDE_THRESHOLDS = ("evals/thresholds.yaml", "evals/thresholds.json")


def first_existing(directory: Path, names: tuple[str, ...]) -> Path:
    """The first of `names` under `directory` that is a file, else the first name."""
    return next((directory / n for n in names if (directory / n).is_file()), directory / names[0])
DEPRECATED_DIR = "deprecated"  # retired master configs, inside a recipe directory


@dataclass(frozen=True)
class Layout:
    root: Path
    recipe_dirs: tuple[Path, ...]  # collected even where pytest skips dot-directories
    changelog: Path | None  # None: a perf-changelog.yaml beside master configs
    thresholds: Path | None  # None: evals/thresholds.yaml (or .json) beside each recipe file
    launch_dir: Path | None  # None: launch/ beside each recipe file
    inferencex: bool  # the checkout looks like InferenceX's repository
    # Directories of retired recipes left out (empty when asked to include them).
    left_out: tuple[Path, ...] = ()

    def unignored(self) -> frozenset[Path]:
        """Recipe directories and the directories above them, up to the root: pytest must
        enter these even when their names start with a dot."""
        out: set[Path] = set()
        for directory in self.recipe_dirs:
            out.add(directory)
            out.update(p for p in directory.parents if self.root in p.parents)
        return frozenset(out)

    def owned(self) -> tuple[Path, ...]:
        """What the plugin collects in an InferenceX checkout when no path is named."""
        return (*self.recipe_dirs, *([self.changelog] if self.changelog is not None else []))

    def ignores(self, path: Path, *, whole_checkout: bool) -> bool | None:
        """Whether pytest must skip `path` (True), must enter it although its name starts with
        a dot (False), or decides itself (None). `whole_checkout`: no path was named at the
        root of an InferenceX checkout, so only what `owned()` lists is collected."""
        if path in self.left_out:
            return True
        if path in self.unignored():
            return False
        if not (whole_checkout and self.inferencex) or self.root not in path.parents:
            return None
        owned = self.owned()
        keep = any(path == p or p in path.parents or path in p.parents for p in owned)
        return None if keep else True

    def thresholds_for(self, recipe_file: Path) -> Path:
        if self.thresholds is not None:
            return self.thresholds
        return first_existing(recipe_file.resolve().parent, BESIDE_THRESHOLDS)

    def launch_dir_for(self, recipe_file: Path) -> Path:
        return self.launch_dir or Path(recipe_file).parent / "launch"

    def is_changelog(self, path: Path, recipe_globs: tuple[str, ...]) -> bool:
        if path.name != INFERENCEX_CHANGELOG:
            return False
        if self.changelog is not None:
            return path.resolve() == self.changelog.resolve()
        return bool(_recipes_in(path.parent, recipe_globs))

    def changelog_recipe_dirs(self, changelog: Path) -> tuple[Path, ...]:
        """Where the config keys a changelog names are defined."""
        if self.changelog is not None and changelog.resolve() == self.changelog.resolve():
            return self.recipe_dirs or (changelog.parent,)
        return (changelog.parent,)


# No InferenceX checkout and no ini options: everything beside the recipe files.
BESIDE_RECIPES = Layout(root=Path("/"), recipe_dirs=(), changelog=None, thresholds=None,
                        launch_dir=None, inferencex=False)


def _recipes_in(directory: Path, globs: tuple[str, ...]) -> list[Path]:
    if not directory.is_dir():
        return []
    return [p for p in directory.iterdir() if any(fnmatch.fnmatch(p.name, g) for g in globs)]


def discover(root: Path, recipe_globs: tuple[str, ...], *, recipe_dirs: list[str],
             changelog: str, thresholds: str, launch_dir: str,
             include_deprecated: bool = False) -> Layout:
    """The layout from ini values (relative to the root; empty = default)."""
    # Paths are kept as pytest gives them (absolute, not resolved) to compare with its own.
    found = [root / d for d in INFERENCEX_RECIPE_DIRS if _recipes_in(root / d, recipe_globs)]
    inferencex = bool(found) and (root / INFERENCEX_CHANGELOG).is_file()
    dirs = tuple(root / d for d in recipe_dirs) or (tuple(found) if inferencex
                                                                 else ())
    default_changelog = root / INFERENCEX_CHANGELOG if inferencex else None
    default_thresholds = first_existing(root, INFERENCEX_THRESHOLDS) if inferencex else None
    return Layout(
        root=root,
        recipe_dirs=dirs,
        changelog=root / changelog if changelog else default_changelog,
        thresholds=root / thresholds if thresholds else default_thresholds,
        launch_dir=root / launch_dir if launch_dir else None,
        inferencex=inferencex,
        left_out=() if include_deprecated else tuple(
            d / DEPRECATED_DIR for d in dirs if (d / DEPRECATED_DIR).is_dir()),
    )
