"""Inside a copy of InferenceX at its current layout (`../shared/inferencex-0801/`): master
configs in `configs/`, retired ones in `configs/deprecated/`, InferenceX's own Python tests
under `utils/`. At the root with no path named, only the configs and the changelog are
collected; a path named on the command line is collected as pytest would."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from .conftest import REPO, copy_checkout

SOURCE = Path(os.environ.get("INFERBENCH_INFERENCEX_CURRENT_DIR")
              or REPO.parent / "shared" / "inferencex-0801")


@pytest.fixture
def checkout(pytester: pytest.Pytester) -> Path:
    if not (SOURCE / "configs" / "amd-master.yaml").is_file():
        pytest.skip(f"no InferenceX checkout of the current layout at {SOURCE} "
                    "(set INFERBENCH_INFERENCEX_CURRENT_DIR)")
    root = pytester.path
    for name in ("configs", "utils", "perf-changelog.yaml"):
        source = SOURCE / name
        if source.is_dir():
            copy_checkout(source, root / name)
        else:
            (root / name).write_bytes(source.read_bytes())
    # Fewer points to parse: the NVIDIA master goes, the AMD master keeps its first entries
    # and the retired configs two files. The layout itself is as InferenceX has it.
    (root / "configs" / "nvidia-master.yaml").unlink()
    amd = root / "configs" / "amd-master.yaml"
    lines = amd.read_text(encoding="utf-8").splitlines(keepends=True)
    starts = [n for n, line in enumerate(lines)
              if line[:1].isalnum() and line.rstrip().endswith(":")]
    amd.write_text("".join(lines[:starts[6]]), encoding="utf-8")
    for retired in (root / "configs" / "deprecated").iterdir():
        if retired.name not in ("amd-gptoss-master.yaml", "amd-glm5-glm5.1-master.yaml"):
            retired.unlink()
    return root


def files_of(result: pytest.RunResult) -> set[str]:
    return {line.split("::")[0] for line in result.outlines if "::" in line}


def test_at_the_root_only_configs_and_the_changelog_are_collected(checkout: Path,
                                                                   pytester: pytest.Pytester
                                                                   ) -> None:
    # InferenceX's own tests would fail to import here (they need its environment).
    assert list((checkout / "utils").glob("test_*.py"))
    result = pytester.runpytest("--collect-only", "-q", "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()[-2000:]
    # Not utils/, not configs/deprecated/, and runners.yaml and ci-priority.yaml are no recipes.
    assert files_of(result) == {"configs/amd-master.yaml", "perf-changelog.yaml"}
    assert "error" not in result.stdout.str().lower()
    said = [line for line in result.outlines if line.startswith("inferbench: ")]
    assert said.count("inferbench: InferenceX checkout: collecting configs/ and "
                      "perf-changelog.yaml (name a path to collect other tests)") == 1
    assert said.count("inferbench: retired configs in configs/deprecated/ left out "
                      "(--inferbench-include-deprecated collects them)") == 1


def test_retired_configs_are_collected_when_asked_for_or_named(checkout: Path,
                                                                pytester: pytest.Pytester
                                                                ) -> None:
    retired = {"configs/deprecated/amd-gptoss-master.yaml",
               "configs/deprecated/amd-glm5-glm5.1-master.yaml"}
    asked = pytester.runpytest("--collect-only", "-q", "-p", "no:cacheprovider",
                               "--inferbench-include-deprecated")
    assert asked.ret == pytest.ExitCode.OK
    assert files_of(asked) == {"configs/amd-master.yaml", "perf-changelog.yaml", *retired}
    assert not [line for line in asked.outlines if "left out" in line]
    # Naming a file in it collects that file; naming configs/ leaves the directory out.
    named = pytester.runpytest("--collect-only", "-q", "-p", "no:cacheprovider",
                               "configs/deprecated/amd-gptoss-master.yaml")
    assert files_of(named) == {"configs/deprecated/amd-gptoss-master.yaml"}
    assert files_of(pytester.runpytest("--collect-only", "-q", "-p", "no:cacheprovider",
                                       "configs")) == {"configs/amd-master.yaml"}


def test_a_named_path_outside_the_configs_is_collected_as_pytest_would(
        checkout: Path, pytester: pytest.Pytester) -> None:
    # A test of InferenceX's that imports only the standard library and its own module.
    named = "utils/test_ci_priority.py"
    result = pytester.runpytest("--collect-only", "-p", "no:cacheprovider", named)
    assert result.ret == pytest.ExitCode.OK
    # utils/pytest.ini makes utils/ the rootdir: InferenceX's own pytest setup, untouched.
    result.stdout.fnmatch_lines(["*<Module test_ci_priority.py>*", "* tests collected in *"])
    assert not [line for line in result.outlines if line.startswith("inferbench:")]
