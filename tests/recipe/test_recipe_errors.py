"""Bad recipes get `path:line: key.path: problem (expected ...)`, all errors of a file at once."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_inferbench.recipe.launch import packaged_launch_dir
from pytest_inferbench.recipe.schema import RecipeError, load_recipe

GOOD = """\
k-fp4-mi355x-atom:
  image: img
  model: amd/MiniMax-M3-MXFP4
  model-prefix: minimaxm3
  runner: mi355x
  precision: fp4
  framework: atom
  multinode: false
  scenarios:
    fixed-seq-len:
      - isl: 1024
        osl: 1024
        search-space:
          - { tp: 4, conc-start: 1, conc-end: 8 }
"""


def errors_of(tmp_path: Path, text: str) -> list[str]:
    path = tmp_path / "amd-master.yaml"
    path.write_text(text)
    with pytest.raises(RecipeError) as info:
        load_recipe(path)
    return [m.replace(f"{path}:", "L") for m in info.value.messages]


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [
        (
            "  precision: fp4\n",
            "  precision: fp4\n  flavour: x\n",
            "L7: k-fp4-mi355x-atom.flavour: unknown key (expected one of: image, model, "
            "model-prefix, runner, precision, framework, multinode, scenarios, disagg, router, "
            "kv-p2p-transfer, recipe-fingerprint)",
        ),
        ("  multinode: false\n", "", "L2: k-fp4-mi355x-atom.multinode: missing required key"),
        (
            "  multinode: false\n",
            "  multinode: nope\n",
            "L8: k-fp4-mi355x-atom.multinode: got str 'nope' (expected true or false)",
        ),
        (
            "      - isl: 1024\n",
            "      - isl: '1024'\n",
            "L11: k-fp4-mi355x-atom.scenarios.fixed-seq-len[0].isl: got str '1024' "
            "(expected an integer)",
        ),
        (
            "{ tp: 4,",
            "{ tp: 0,",
            "L14: k-fp4-mi355x-atom.scenarios.fixed-seq-len[0].search-space[0].tp: got 0 "
            "(expected an integer >= 1)",
        ),
        (
            "{ tp: 4,",
            "{ tp: -2,",
            "L14: k-fp4-mi355x-atom.scenarios.fixed-seq-len[0].search-space[0].tp: got -2 "
            "(expected an integer >= 1)",
        ),
        (
            "conc-start: 1, conc-end: 8",
            "conc-start: 16, conc-end: 8",
            "L14: k-fp4-mi355x-atom.scenarios.fixed-seq-len[0].search-space[0].conc-start: "
            "conc-start (16) > conc-end (8) (expected start <= end)",
        ),
        (
            "conc-start: 1, conc-end: 8",
            "conc-start: 1, conc-end: 1099511627776",
            "L14: k-fp4-mi355x-atom.scenarios.fixed-seq-len[0].search-space[0].conc-end: "
            "got 1099511627776 (expected an integer <= 65536)",
        ),
        (
            "conc-end: 8 }",
            "conc-end: 8, conc-list: [4] }",
            "L14: k-fp4-mi355x-atom.scenarios.fixed-seq-len[0].search-space[0]: both 'conc-list' "
            "and 'conc-start'/'conc-end' given (expected either a list or a range, not both)",
        ),
        (
            "conc-start: 1, conc-end: 8",
            "conc-start: 1",
            "L14: k-fp4-mi355x-atom.scenarios.fixed-seq-len[0].search-space[0]: no concurrency "
            "(expected 'conc-list' or both 'conc-start' and 'conc-end')",
        ),
        (
            "          - { tp: 4, conc-start: 1, conc-end: 8 }\n",
            "          []\n",
            "L14: k-fp4-mi355x-atom.scenarios.fixed-seq-len[0].search-space: empty search-space "
            "(expected at least one row)",
        ),
        (
            "{ tp: 4,",
            "{ tp: 4, spec-decoding: eagle3,",
            "L14: k-fp4-mi355x-atom.scenarios.fixed-seq-len[0].search-space[0].spec-decoding: got "
            "str 'eagle3' (expected one of: mtp, draft_model, none)",
        ),
        (
            "  runner: mi355x\n",
            "  runner: tpu-v5\n",
            "L5: k-fp4-mi355x-atom.runner: unknown runner 'tpu-v5' (expected a name starting with "
            "one of: b200, b300, cpu, gb200, gb300, h100, h200, mi300x, mi325x, mi355x, "
            "rtx6000pro, optionally after 'cluster:')",
        ),
        (
            "  model: amd/MiniMax-M3-MXFP4\n",
            "  model: [a, b]\n",
            "L3: k-fp4-mi355x-atom.model: got a list (expected a non-empty string)",
        ),
        (
            "k-fp4-mi355x-atom:",
            "k-fp4-*-atom:",
            "L1: k-fp4-*-atom: '*' is reserved for changelog wildcards (expected a config key "
            "without '*')",
        ),
    ],
    ids=[
        "unknown-key",
        "missing-required",
        "wrong-type-bool",
        "wrong-type-int",
        "tp-zero",
        "tp-negative",
        "start-after-end",
        "conc-end-too-large",
        "list-and-range",
        "no-concurrency",
        "empty-search-space",
        "bad-spec-decoding",
        "unknown-runner",
        "model-not-string",
        "star-in-key",
    ],
)
def test_each_bad_input_names_file_line_and_key(
    tmp_path: Path, old: str, new: str, expected: str
) -> None:
    assert old in GOOD
    assert errors_of(tmp_path, GOOD.replace(old, new)) == [expected]


def test_yaml_syntax_error_has_line(tmp_path: Path) -> None:
    text = GOOD.replace("{ tp: 4, conc-start: 1, conc-end: 8 }", "{ tp: 4, conc-start: 1")
    (message,) = errors_of(tmp_path, text)
    assert message.startswith("L15: YAML syntax error: ")


def test_duplicate_config_key(tmp_path: Path) -> None:
    assert errors_of(tmp_path, GOOD + "\n" + GOOD) == [
        "L16: k-fp4-mi355x-atom: duplicate config key (first defined at line 1)"
    ]


def test_a_point_given_twice_runs_once_and_says_so(pytester: pytest.Pytester) -> None:
    (pytester.path / "amd-master.yaml").write_text(
        GOOD.replace("conc-start: 1, conc-end: 8 }", "conc-list: [4, 8] }\n"
                     "          - { tp: 4, conc-list: [8, 16] }"))
    result = pytester.runpytest("--collect-only", "-q", "-k", "duplicate")
    # Two rows of one server merge; conc 8 (given by both) is one point, marked as repeated.
    assert [line for line in result.outlines if "::" in line] == [
        "amd-master.yaml::k-fp4-mi355x-atom-tp4::isl1024-osl1024-conc8"]
    items, _ = pytester.inline_genitems("-q")
    assert [i.name for i in items] == [f"isl1024-osl1024-conc{c}" for c in (4, 8, 16)]
    assert items[1].keywords["duplicate"] == "also at line 15"


def test_all_errors_of_a_file_are_reported_at_once(tmp_path: Path) -> None:
    bad_one = GOOD.replace("{ tp: 4,", "{ tp: 0,")
    bad_two = (
        GOOD.replace("k-fp4-mi355x-atom:", "other-fp4-mi355x-atom:")
        .replace("  runner: mi355x\n", "  runner: tpu\n")
        .replace("  precision: fp4\n", "")
    )
    messages = errors_of(tmp_path, bad_one + "\n" + bad_two)
    # The second entry starts at line 16: its mapping at 17, its runner at 20.
    assert [m.split(":")[0] for m in messages] == ["L14", "L17", "L20"]
    assert "other-fp4-mi355x-atom.precision: missing required key" in messages[1]
    assert "unknown runner 'tpu'" in messages[2]


def test_a_bad_entry_fails_its_own_item_and_the_others_collect(
    pytester: pytest.Pytester,
) -> None:
    other = GOOD.replace("k-fp4-mi355x-atom:", "other-fp4-mi355x-atom:")
    bad = GOOD.replace("{ tp: 4,", "{ tp: 0,").replace("  runner: mi355x\n", "  runner: tpu\n")
    (pytester.path / "amd-master.yaml").write_text(bad + "\n" + other)
    result = pytester.runpytest("-q", "-p", "no:cacheprovider", "--inferbench-backend=sim",
                                "-k", "k-fp4")
    # One failing item for the bad entry, with every problem of that entry; no collection error.
    result.assert_outcomes(failed=1)
    out = result.stdout.str()
    assert "amd-master.yaml:5: k-fp4-mi355x-atom.runner: unknown runner 'tpu'" in out
    assert ("amd-master.yaml:14: k-fp4-mi355x-atom.scenarios.fixed-seq-len[0].search-space[0]"
            ".tp: got 0 (expected an integer >= 1)") in out
    assert "Traceback" not in out
    collected = pytester.runpytest("--collect-only", "-q").outlines
    assert [line for line in collected if "::" in line] == [
        "amd-master.yaml::k-fp4-mi355x-atom",
        *(f"amd-master.yaml::other-fp4-mi355x-atom-tp4::isl1024-osl1024-conc{c}"
          for c in (1, 2, 4, 8)),
    ]


def test_missing_launch_spec_errors_every_point_at_setup(pytester: pytest.Pytester) -> None:
    # A config neither a local launch directory nor the package has a spec for.
    unshipped = GOOD.replace("mi355x", "mi300x")
    (pytester.path / "amd-master.yaml").write_text(unshipped)
    assert not (packaged_launch_dir() / "minimaxm3_fp4_mi300x_atom.yaml").exists()
    recorder = pytester.inline_run("-p", "no:cacheprovider")
    setup_errors = [r for r in recorder.getreports("pytest_runtest_logreport")
                    if r.when == "setup" and r.failed]
    assert len(setup_errors) == 4
    local = pytester.path / "launch" / "minimaxm3_fp4_mi300x_atom.yaml"
    packaged = packaged_launch_dir() / local.name
    for report in setup_errors:
        # The whole message, no traceback into the plugin.
        assert report.longreprtext == (
            "k-fp4-mi300x-atom-tp4: no launch spec for k-fp4-mi300x-atom "
            f"(looked for {local} and the packaged {packaged}; "
            "expected <model-prefix>_<precision>_<gpu>_<framework>.yaml)")
