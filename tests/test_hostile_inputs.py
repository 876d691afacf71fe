"""Hostile options, ini values and config files: each gets a clear message naming the option or
the file and line, and no traceback, before any server starts.

The table is long; a pytest run costs about a second, so the inputs that can share a run do:
every option problem is reported at once, so each run carries many of them (one value per
option), and the config-file problems of one run sit in different files.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import yaml

from pytest_inferbench.sim import catalog
from pytest_inferbench.testing.recipes import master_entry
from pytest_inferbench.util.yamllines import YamlSyntaxError, compose, load_data

# (option words, a fragment its message must hold)
OPTION_CASES: list[tuple[tuple[str, ...], str]] = [
    (("--inferbench-max-failure-ratio", "5"), "--inferbench-max-failure-ratio 5: expected a "
                                              "fraction within [0, 1]"),
    (("--inferbench-max-failure-ratio", "nan"), "--inferbench-max-failure-ratio nan:"),
    (("--inferbench-max-failure-ratio", "-0.1"), "--inferbench-max-failure-ratio -0.1:"),
    (("--inferbench-request-rate", "0"), "--inferbench-request-rate 0: expected requests per "
                                         "second > 0"),
    (("--inferbench-request-rate", "-5"), "--inferbench-request-rate -5:"),
    (("--inferbench-request-rate", "nan"), "--inferbench-request-rate nan:"),
    (("--inferbench-request-rate", "1e-300"), "--inferbench-request-rate 1e-300: expected "
                                              "requests per second > 0 with a mean gap of at "
                                              "most a day"),
    (("--inferbench-prompts-per-conc", "0"), "--inferbench-prompts-per-conc 0: expected an "
                                             "integer within [1, 100000]"),
    (("--inferbench-prompts-per-conc", "-1"), "--inferbench-prompts-per-conc -1:"),
    (("--inferbench-prompts-per-conc", "1000000000"), "--inferbench-prompts-per-conc 1e+09:"),
    (("--inferbench-time-scale", "nan"), "--inferbench-time-scale nan: expected a finite"),
    (("--inferbench-time-scale", "-1"), "--inferbench-time-scale -1:"),
    (("--inferbench-startup-timeout", "nan"), "--inferbench-startup-timeout nan:"),
    (("--inferbench-startup-timeout", "0"), "--inferbench-startup-timeout 0:"),
    (("--inferbench-startup-timeout", "-3"), "--inferbench-startup-timeout -3:"),
    (("--inferbench-stall-timeout", "nan"), "--inferbench-stall-timeout nan:"),
    (("--inferbench-stall-timeout", "0"), "--inferbench-stall-timeout 0:"),
    (("--inferbench-point-timeout", "-1"), "--inferbench-point-timeout -1:"),
    (("--inferbench-point-timeout", "nan"), "--inferbench-point-timeout nan:"),
    (("--inferbench-eval-limit", "-1"), "--inferbench-eval-limit -1: expected a number of "
                                        "questions >= 1"),
    (("--inferbench-eval-limit", "0"), "--inferbench-eval-limit 0:"),
    (("--inferbench-random-range-ratio", "1.5"), "--inferbench-random-range-ratio 1.5:"),
    (("--inferbench-random-range-ratio", "nan"), "--inferbench-random-range-ratio nan:"),
    (("--inferbench-seed", "-1"), "--inferbench-seed -1: expected an integer within"),
    (("--inferbench-seed", "99999999999"), "--inferbench-seed 1e+11:"),
    (("--inferbench-pr", "0"), "--inferbench-pr 0: expected a PR number >= 1"),
    (("--inferbench-base-url", "http://u:TOKEN@host:abc"), "--inferbench-base-url: not a URL"),
    (("--inferbench-base-url", "ftp://host/x"), "--inferbench-base-url: expected http://HOST"),
    (("--inferbench-base-url", "localhost:8000"), "--inferbench-base-url: expected http://HOST"),
    (("--inferbench-results", "afile.txt"), "--inferbench-results afile.txt: exists and is not "
                                            "a directory"),
    (("--inferbench-save-baseline", "adir"), "--inferbench-save-baseline adir: is a directory"),
    (("--inferbench-save-baseline", "afile.txt/b.json"), "--inferbench-save-baseline "
                                                         "afile.txt/b.json: its directory"),
    (("--inferbench-gates", "adir"), "--inferbench-gates adir: is not a file"),
    (("--inferbench-gates", "missing.yaml"), "--inferbench-gates missing.yaml: does not exist"),
    (("--inferbench-baseline", "missing.json"), "--inferbench-baseline missing.json: does not "
                                                "exist"),
    (("--inferbench-eval-data", "adir"), "--inferbench-eval-data adir: is not a file"),
    (("--inferbench-launch-dir", "afile.txt"), "--inferbench-launch-dir afile.txt: is not a "
                                               "directory"),
    (("--inferbench-pass-env", "HF_TOKEN,BAD NAME"), "--inferbench-pass-env: 'BAD NAME' is not "
                                                     "an environment variable name"),
    (("--inferbench-gpus", "0-x"), "--inferbench-gpus: GPU ids '0-x'"),
]


def option_runs() -> list[list[tuple[tuple[str, ...], str]]]:
    """The cases split into runs that give each option at most once."""
    runs: list[list[tuple[tuple[str, ...], str]]] = []
    for case in OPTION_CASES:
        for run in runs:
            if case[0][0] not in {words[0] for words, _ in run}:
                run.append(case)
                break
        else:
            runs.append([case])
    return runs


def no_traceback(text: str) -> None:
    assert "Traceback" not in text and "INTERNALERROR" not in text, text


@pytest.mark.parametrize("run", option_runs(), ids=lambda run: f"{len(run)}-options")
def test_hostile_options_are_all_reported_at_once(
        pytester: pytest.Pytester, run: list[tuple[tuple[str, ...], str]]) -> None:
    (pytester.path / "bench-master.yaml").write_text(master_entry(isl=256, osl=16))
    (pytester.path / "afile.txt").write_text("x")
    (pytester.path / "adir").mkdir()
    # --opt=VALUE: a path given as a second word is refused before any of these checks.
    args = ["=".join(words) for words, _ in run]
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", *args)
    text = result.stdout.str() + result.stderr.str()
    assert result.ret == pytest.ExitCode.USAGE_ERROR, text
    assert f"{len(run)} problem" in text, text
    for _, message in run:
        assert message in text, f"{message!r} not in:\n{text}"
    assert "passed" not in text and "inferbench-results" not in {
        p.name for p in pytester.path.iterdir()}  # nothing ran, nothing was written
    no_traceback(text)


# --- config files: (relative path, content, message fragment) -------------------------------
GATES_CASES: list[tuple[str, str]] = [
    ("  - match: {isll: 256}\n    require: [p99_ttft <= 2.0]\n",
     "gates.yaml:2: unknown match key 'isll'"),
    ("  - require: [p99_ttfx <= 2.0]\n", "gates.yaml:4: 'p99_ttfx' is not a result key (did you "
                                         "mean 'p99_ttft'?)"),
    ("  - require: [p99_ttft < 2.0]\n", "gates.yaml:5: operator '<' in 'p99_ttft < 2.0'"),
    ("  - require: [p99_ttft <= nan]\n", "gates.yaml:6: cannot read requirement 'p99_ttft <= nan'"),
    ("  - require: [p99_ttft <= 1e999]\n", "gates.yaml:7: '1e999' in 'p99_ttft <= 1e999' is not "
                                           "a finite number"),
    ("  - match: {conc: 64-8}\n    require: [p99_ttft <= 2.0]\n", "gates.yaml:8: 'conc' must be "
                                                                  "N, 'LO-HI'"),
    ("  - match: {[a]: 1}\n    require: [p99_ttft <= 2.0]\n", "gates.yaml:10: unknown match key "
                                                              "'<a list>'"),
    ("  - match: {isl: -5}\n    require: [p99_ttft <= 2.0]\n", "gates.yaml:12: 'isl' must be a "
                                                               "positive integer"),
    ("  - require: []\n", "gates.yaml:14: 'require' must be a non-empty list"),
    ("  - require: [{a: b}]\n", "gates.yaml:15: cannot read requirement a mapping"),
    ("  - match: {config: x}\n", "gates.yaml:16: slo rule without 'require'"),
    ("  - when: {}\n    require: [p99_ttft <= 1]\n", "gates.yaml:17: unknown key 'when' in slo "
                                                     "rule"),
]
GATES_TAIL = ("regression:\n  tolerance: 1000%\n  metrics: {p99_foo: 0.1, median_ttft: abc}\n"
              "  bogus: 1\n")
GATES_TAIL_MESSAGES = [
    "gates.yaml:20: tolerance must be a fraction like 0.05 or '5%', got '1000%'",
    "gates.yaml:21: regression metric 'p99_foo' is not a result key",
    "gates.yaml:21: tolerance must be a fraction like 0.05 or '5%', got 'abc'",
    "gates.yaml:22: unknown regression key 'bogus'",
]

# Launch specs: one broken spec per server node (each its own model prefix).
LAUNCH_CASES: list[tuple[str, str]] = [
    ("command: [srv]\nport: abc\n", "port: 'abc' (expected an integer within [1, 65535])"),
    ("command: [srv]\nport: 70000\n", "port: 70000"),
    ("command: [srv]\nstartup-timeout: abc\n", "startup-timeout: 'abc' (expected a finite"),
    ("command: [srv]\nstartup-timeout: .nan\n", "startup-timeout: nan"),
    ("command: [srv]\nhealth-path: health\n", "health-path: 'health' (expected a URL path"),
    ("command: [srv]\nclient: {endpoint: /v1/embeddings}\n", "client.endpoint: '/v1/embeddings'"),
    ("command: [srv]\nclient: {use-chat-template: 'yes'}\n", "client.use-chat-template: 'yes'"),
    ("command: [srv]\nflags: [x]\n", "flags: unknown key"),
    ("command: [srv, !foo 4]\n", "tag '!foo' is not supported"),
    ("command: [srv]\nport: 0x\n", "port: '0x'"),
    ("command: [srv]\nmounts: ['/no/such/dir:/models']\n",
     "mounts: host path /no/such/dir does not exist (the Docker Engine would create it"),
]

THRESHOLDS_CASES: list[tuple[str, str]] = [
    ('{"default": {"gsm8k": NaN}}', "default.gsm8k: expected a score within [0, 1], got nan"),
    ('{"default": {"gsm8k": "0.9"}}', "default.gsm8k: expected a score within [0, 1], got '0.9'"),
    ('{"models": {"m": {"gsm8k": 9}}}', "models.m.gsm8k: expected a score within [0, 1], got 9"),
    ('{"models": [1]}', "'models' must map model prefixes to task scores"),
    ('{"default": ', "not readable JSON"),
    ("[" * 100_000, "not readable JSON"),
]


def _write(path: Path, text: str | bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)


BASELINE_CASES: list[tuple[str, str]] = [
    ('{"points": [{"conc": 1, "tput_per_gpu": "fast"}]}', "tput_per_gpu = 'fast'"),
    ('{"points": [{"conc": 1, "p99_ttft": NaN}]}', "p99_ttft = nan"),
    ('{"points": [{"conc": 1, "median_e2el": [1, 2]}]}', "median_e2el = [1, 2]"),
    ('{"points": [{"conc": 1, "tput_per_gpu": true}]}', "tput_per_gpu = True"),
    ("[" * 100_000 + "]" * 100_000, "not readable JSON: nested too deeply"),
]


def test_hostile_config_files_every_problem_at_once(pytester: pytest.Pytester) -> None:
    """One run: a gates file with every kind of typo, a broken launch spec per server node,
    broken eval thresholds in several recipe directories, a baseline of broken files."""
    entries = [master_entry(f"m{i}-fp4-mi355x-atom", model_prefix=f"m{i}", isl=256, osl=16)
               for i in range(len(LAUNCH_CASES))]
    _write(pytester.path / "bench" / "bench-master.yaml", "".join(entries))
    _write(pytester.path / "bench" / "gates.yaml", "slo:\n" + "".join(t for t, _ in GATES_CASES)
           + GATES_TAIL)
    for i, (text, _) in enumerate(LAUNCH_CASES):
        _write(pytester.path / "bench" / "launch" / f"m{i}_fp4_mi355x_atom.yaml", text)
    for i, (text, _) in enumerate(THRESHOLDS_CASES):
        directory = pytester.path / f"t{i}"
        _write(directory / "bench-master.yaml", master_entry(isl=256, osl=16))
        _write(directory / "evals" / "thresholds.json", text)
    for i, (text, _) in enumerate(BASELINE_CASES):
        _write(pytester.path / "base" / f"b{i}.json", text)
    _write(pytester.path / "gsm8k.jsonl", '{"question": "q", "answer": "a #### 1"}\n[1, 2]\n')
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--inferbench-baseline=base",
                                           "--inferbench-eval-data=gsm8k.jsonl",
                                           "--inferbench-backend", "docker")
    text = result.stdout.str() + result.stderr.str()
    lines = text.splitlines()
    assert "--inferbench-eval-data: gsm8k.jsonl:2: expected a JSON object with 'question' and " \
           "'answer'" in text, text
    assert result.ret == pytest.ExitCode.USAGE_ERROR, text
    for message in [m for _, m in GATES_CASES] + GATES_TAIL_MESSAGES:
        assert message in text, f"{message!r} not in:\n{text}"
    for i, (_, message) in enumerate(LAUNCH_CASES):
        assert any(f"m{i}_fp4_mi355x_atom.yaml:" in line and message in line
                   for line in lines), f"{message!r}:\n{text}"
    for i, (_, message) in enumerate(THRESHOLDS_CASES):
        assert any(f"t{i}/evals/thresholds.json" in line and message in line
                   for line in lines), f"{message!r}:\n{text}"
    for i, (_, message) in enumerate(BASELINE_CASES):
        assert any(f"b{i}.json" in line and message in line for line in lines), (
            f"{message!r}:\n{text}")
    assert not (pytester.path / "inferbench-results").exists()  # nothing started, nothing ran
    no_traceback(text)


# Recipe files whose YAML cannot even be read: each file errors alone, naming its line.
RECIPE_CASES: list[tuple[tuple[str, str] | bytes, str]] = [
    (("model: amd/MiniMax-M3-MXFP4", "model: 2001-13-45"),
     ":3: YAML syntax error: '2001-13-45' cannot be read as a timestamp"),
    (("{ tp: 4,", "{ tp: !foo 4,"), ":14: YAML syntax error: tag '!foo' is not supported"),
    (master_entry(isl=256, osl=16).encode().replace(b"MiniMax-M3-MXFP4", b"Mini\xff\xfeMax"),
     ":3: YAML syntax error: not UTF-8 text (byte 0xff)"),
    (("isl: 256", "isl: " + "9" * 5000), ":11: YAML syntax error: '9999"),
    (("multinode: false", "multinode: !!python/object:os.system x"),
     ":8: YAML syntax error: tag 'tag:yaml.org,2002:python/object:os.system' is not supported"),
    (("{ tp: 4,", "{ tp: [4,"), "YAML syntax error"),
    (("image: rocm", "image: *nothing"), ":2: YAML syntax error"),
    (("precision: fp4", "precision: fp4\n  bomb: " + "[" * 150 + "]" * 150),
     "YAML syntax error: nested deeper than 100 levels"),
    # Deep enough that composing it would recurse past the C stack (a crash, not an error).
    (("precision: fp4", "precision: fp4\n  bomb: " + "[" * 200_000 + "]" * 200_000),
     "YAML syntax error: nested deeper than 100 levels"),
]


def alias_bomb(size: int) -> str:
    """Ten levels of eight aliases each (8**10 values expanded), padded to `size` bytes."""
    lines = ['b0: &b0 ["lol","lol","lol","lol","lol","lol","lol","lol"]']
    lines += [f"b{i}: &b{i} [" + ",".join([f"*b{i - 1}"] * 8) + "]" for i in range(1, 10)]
    text = "\n".join(lines) + "\n"
    return text + "#" * (size - len(text) - 1) + "\n"


def test_an_alias_bomb_is_refused_at_once() -> None:
    bomb = alias_bomb(665)
    assert len(bomb.encode()) == 665
    started = time.perf_counter()
    with pytest.raises(YamlSyntaxError, match="line 7: aliases expand it past"):
        compose(bomb)
    with pytest.raises(yaml.YAMLError, match="aliases expand it past"):
        load_data(bomb)
    # Refusing costs what composing 665 bytes does; reading the expansion took minutes.
    assert time.perf_counter() - started < 1.0


def test_an_alias_bomb_in_a_recipe_or_changelog_names_the_file_and_line(
        pytester: pytest.Pytester) -> None:
    bomb = alias_bomb(665)
    _write(pytester.path / "bomb-master.yaml", bomb)
    configs = pytester.mkdir("configs")
    _write(configs / "ok-master.yaml", master_entry(isl=256, osl=16))
    _write(configs / "perf-changelog.yaml", bomb)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--collect-only")
    text = result.stdout.str() + result.stderr.str()
    for name in ("bomb-master.yaml", "perf-changelog.yaml"):
        assert any(name in line and ":7" in line and "aliases expand it past" in line
                   for line in text.splitlines()), f"{name}:\n{text}"
    assert result.ret != pytest.ExitCode.OK
    no_traceback(text)


def test_hostile_recipe_files_name_file_and_line(pytester: pytest.Pytester) -> None:
    base = master_entry(isl=256, osl=16)
    for i, (change, _) in enumerate(RECIPE_CASES):
        text: str | bytes = change if isinstance(change, bytes) else base.replace(*change)
        assert text != base
        _write(pytester.path / f"r{i}-master.yaml", text)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    text = result.stdout.str() + result.stderr.str()
    for i, (_, message) in enumerate(RECIPE_CASES):
        assert any(f"r{i}-master.yaml" in line and message in line
                   for line in text.splitlines()), f"{message!r}:\n{text}"
    no_traceback(text)


def test_the_external_backend_needs_a_url(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--inferbench-backend",
                                           "external")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert ("--inferbench-backend external: needs --inferbench-base-url URL"
            in result.stderr.str())


def test_the_table_is_long() -> None:
    count = (len(OPTION_CASES) + len(GATES_CASES) + len(GATES_TAIL_MESSAGES) + len(LAUNCH_CASES)
             + len(THRESHOLDS_CASES) + len(BASELINE_CASES) + len(RECIPE_CASES) + 2)
    assert count >= 60, count


def test_under_xdist_the_controller_reports_config_problems_cleanly(
        pytester: pytest.Pytester) -> None:
    """Workers collect, the controller checks: a usage error, not a crashed worker."""
    _write(pytester.path / "bench-master.yaml", master_entry(isl=256, osl=16))
    _write(pytester.path / "gates.yaml", "slo:\n" + GATES_CASES[1][0])
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-n", "2")
    text = result.stdout.str() + result.stderr.str()
    assert result.ret == pytest.ExitCode.USAGE_ERROR, text
    assert "gates.yaml:2: 'p99_ttfx' is not a result key (did you mean 'p99_ttft'?)" in text
    assert not (pytester.path / "inferbench-results").exists()
    no_traceback(text)


def test_a_runner_the_simulator_lacks_is_refused_before_any_start(
        pytester: pytest.Pytester) -> None:
    """A runner the recipe model accepts whose hardware the simulator's catalog has no figures
    for: a simulating backend names the entry's line at once instead of erroring at setup."""
    pytester.makeconftest(  # a runner the recipes accept, unknown to the simulator
        "from pytest_inferbench.recipe.model import GPU_BY_RUNNER_PREFIX\n"
        "GPU_BY_RUNNER_PREFIX['tpu7'] = 'TPU7'\n")
    known = master_entry(isl=256, osl=16)
    lacking = master_entry("m-fp8-tpu7-vllm", runner="tpu7-pod", isl=256, osl=16)
    _write(pytester.path / "bench-master.yaml", known + lacking)
    lacking_line = known.count("\n") + 1
    for backend in ("sim", "sim-server"):
        result = pytester.runpytest_subprocess("-p", "no:cacheprovider",
                                               "--inferbench-backend", backend)
        text = result.stdout.str() + result.stderr.str()
        assert result.ret == pytest.ExitCode.USAGE_ERROR, text
        assert "1 problem in the inferbench config files, nothing was run:" in text, text
        assert (f"bench-master.yaml:{lacking_line}: m-fp8-tpu7-vllm.runner 'tpu7-pod': the "
                f"{backend} backend cannot simulate it: unknown hardware 'TPU7'; known: "
                f"{', '.join(catalog.hardware_names())}") in text, text
        assert not (pytester.path / "inferbench-results").exists()  # nothing started
        no_traceback(text)


def test_collect_only_lists_every_invalid_entry_and_exits_non_zero(
        pytester: pytest.Pytester) -> None:
    valid = master_entry(isl=256, osl=16)
    invalid = master_entry("bad-fp4-mi355x-atom", isl=256, osl=16).replace("tp: 4", "tp: 0", 1)
    assert "tp: 0" in invalid
    _write(pytester.path / "r-master.yaml", valid + invalid)
    line = (valid + invalid).splitlines().index(
        next(x for x in invalid.splitlines() if "tp: 0" in x)) + 1
    listed = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--collect-only", "-q")
    assert listed.ret not in (pytest.ExitCode.OK, pytest.ExitCode.INTERNAL_ERROR)
    listed.stdout.fnmatch_lines([f"inferbench: invalid entry bad-fp4-mi355x-atom: "
                                 f"*r-master.yaml:{line}: *"])
    assert "r-master.yaml::minimaxm3-fp4-mi355x-atom-tp4::isl256-osl16-conc1" \
        in listed.stdout.str()
    no_traceback(listed.stdout.str() + listed.stderr.str())
    # Deselected, the invalid entry does not fail the listing.
    chosen = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--collect-only", "-q",
                                           "-k", "minimaxm3")
    assert chosen.ret == pytest.ExitCode.OK
    # A run still runs the valid entry and fails the invalid one alone.
    pytester.runpytest_subprocess("-p", "no:cacheprovider", "-m", "not eval").assert_outcomes(
        passed=1, failed=1)
