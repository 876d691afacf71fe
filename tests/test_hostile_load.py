"""Hostile load inputs: `inferbench_load` arguments, text datasets and request rates. Each gets
a clear message naming the argument, the option or `file:line`, and no traceback; an argument is
held to the rule of its command-line option (`options/rules.py`), with the same words."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from pytest_inferbench.loadgen.datasets import parse_dataset, text_prompts
from pytest_inferbench.testing.recipes import master_entry

# (the call's arguments, as Python source; fragments its failure must hold)
LOAD_CASES: list[tuple[str, tuple[str, ...]]] = [
    ("isl=64, osl=8, conc=-1", ("conc=-1: expected an integer within [1, 65536]",)),
    ("isl=64, osl=8, conc=2.5", ("conc=2.5: expected an integer within [1, 65536]",)),
    ("isl=64, osl=8, conc='4'", ("conc='4': expected an integer",)),
    ("isl=0, osl=8, conc=1", ("isl=0: expected an integer >= 1 (tokens)",)),
    ("isl=64, osl=0, conc=1", ("osl=0: expected an integer >= 1 (tokens)",)),
    ("isl=64, osl=True, conc=1", ("osl=True: expected an integer >= 1",)),
    ("isl=64, osl=8, conc=1, request_rate=0", ("request_rate=0: expected requests per second "
                                               "> 0 with a mean gap of at most a day",)),
    ("isl=64, osl=8, conc=1, request_rate=float('nan')", ("request_rate=nan: expected",)),
    ("isl=64, osl=8, conc=1, request_rate=-float('inf')", ("request_rate=-inf: expected",)),
    ("isl=64, osl=8, conc=1, request_rate=1e-300", ("request_rate=1e-300: expected requests "
                                                    "per second > 0",)),
    ("isl=64, osl=8, conc=1, request_rate='fast'", ("request_rate='fast': expected",)),
    ("isl=64, osl=8, conc=1, seed=-1", ("seed=-1: expected an integer within [0, ",)),
    ("isl=64, osl=8, conc=1, seed=2**40", ("seed=1099511627776: expected an integer within",)),
    ("isl=64, osl=8, conc=1, seed=1.5", ("seed=1.5: expected an integer",)),
    ("isl=64, osl=8, conc=1, prompts_per_conc=0", ("prompts_per_conc=0: expected an integer "
                                                   "within [1, 100000]",)),
    ("isl=64, osl=8, conc=1, prompts_per_conc=2.5", ("prompts_per_conc=2.5: expected",)),
    ("prompts='abc', osl=8", ("prompts='abc': expected a non-empty list of non-empty prompt "
                              "texts",)),
    ("prompts=['ok', ''], osl=8", ("prompts=['ok', '']: expected a non-empty list",)),
    ("prompts=[1, 2], osl=8", ("prompts=[1, 2]: expected",)),
    ("isl=64, osl=8, conc=1, check='yes'", ("check='yes': expected True or False",)),
    ("isl=64, osl=8, conc=1, server='minimax'", ("server='minimax': expected a Server",)),
    # Every problem of a call at once.
    ("isl=0, osl=8, conc=-1, seed=-1", ("isl=0: expected", "conc=-1: expected",
                                        "seed=-1: expected")),
]


def _text(result: pytest.RunResult) -> str:
    text = result.stdout.str() + result.stderr.str()
    assert "Traceback" not in text and "INTERNALERROR" not in text, text
    return text


def test_inferbench_load_names_every_bad_argument(pytester: pytest.Pytester) -> None:
    (pytester.path / "bench-master.yaml").write_text(master_entry(isl=256, osl=16))
    # One run, a test per call. No server: the arguments are judged before any server is
    # looked for or started.
    calls = "".join(f"    {call!r},\n" for call, _ in LOAD_CASES)
    pytester.makepyfile(test_bench=f"""
import pytest

CALLS = [
{calls}]

@pytest.mark.parametrize("call", CALLS, ids=[str(i) for i in range(len(CALLS))])
def test_bad_call(inferbench_load, call):
    inferbench_load(**eval(f"dict({{call}})"))
""")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-p", "no:benchmark",
                                           "test_bench.py")
    text = _text(result)
    result.assert_outcomes(failed=len(LOAD_CASES))
    # The failures section: one block per test, headed by its id.
    blocks = dict(re.findall(r"_+ test_bad_call\[(\d+)\] _+\n(.*?)(?=\n_+ test_bad_call|\n=+)",
                             text, flags=re.S))
    assert sorted(blocks, key=int) == [str(i) for i in range(len(LOAD_CASES))], text
    for i, (call, messages) in enumerate(LOAD_CASES):
        block = blocks.get(str(i), "")
        for message in messages:
            assert "inferbench_load: " in block and message in block, (
                f"{call}: {message!r}:\n{block or text}")


# (file name, its bytes, the usage error's fragment)
DATASET_CASES: list[tuple[str, bytes, str]] = [
    ("data.jsonl", b'{"prompt": "a"}\n{"prompt": "caf\xe9"}\n',
     "data.jsonl:2: not UTF-8 text (byte 0xe9)"),
    ("data.jsonl", b'{"prompt": "a"}\n\n' + b"[" * 100_000 + b"]" * 100_000 + b"\n",
     "data.jsonl:3: not JSON: nested too deeply"),
    ("data.json", b"[" * 100_000 + b"]" * 100_000,
     "data.json: not a readable ShareGPT JSON file: nested too deeply"),
    ("data.json", b'[{"conversations": []},\n{"x": "\xff"}]', "data.json:2: not UTF-8 text"),
]


@pytest.mark.parametrize("name, content, message", DATASET_CASES,
                         ids=["jsonl-not-utf8", "jsonl-nested", "sharegpt-nested",
                              "sharegpt-not-utf8"])
def test_a_bad_dataset_is_a_usage_error_naming_its_line(
        pytester: pytest.Pytester, name: str, content: bytes, message: str) -> None:
    (pytester.path / "bench-master.yaml").write_text(master_entry(isl=256, osl=16))
    (pytester.path / name).write_bytes(content)
    kind = "jsonl" if name.endswith(".jsonl") else "sharegpt"
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-p", "no:benchmark",
                                           f"--inferbench-dataset={kind}:{name}")
    text = _text(result)
    assert result.ret == pytest.ExitCode.USAGE_ERROR, text
    assert message in text, text


# The line breaks str.splitlines() knows that JSON leaves unescaped in a string (it escapes
# the control characters below U+0020).
@pytest.mark.parametrize("separator", ["\u2028", "\u2029", "\x85"],
                         ids=["U+2028", "U+2029", "NEL"])
def test_a_unicode_line_break_inside_a_jsonl_string_is_text(tmp_path: Path,
                                                             separator: str) -> None:
    """JSON allows these unescaped inside a string; JSON Lines ends a line at \\n only."""
    path = tmp_path / "data.jsonl"
    prompt = f"line one{separator}line two"
    path.write_text(json.dumps({"prompt": prompt}, ensure_ascii=False) + "\n"
                    + json.dumps({"prompt": "second"}) + "\r\n", encoding="utf-8")
    prompts = text_prompts(parse_dataset(f"jsonl:{path}"))
    assert [p.text for p in prompts] == [prompt, "second"]


# (option words, fragments of the usage error)
RATE_CASES: list[tuple[tuple[str, ...], tuple[str, ...]]] = [
    (("--inferbench-request-rate=5", "--inferbench-request-rates=1,2"),
     ("--inferbench-request-rate 5 and --inferbench-request-rates 1,2: give one of them",)),
    (("--inferbench-request-rate=inf", "--inferbench-request-rates=1,inf"),
     ("--inferbench-request-rate inf and --inferbench-request-rates 1,inf",)),
    (("--inferbench-request-rate=1e-300",),
     ("--inferbench-request-rate 1e-300: expected requests per second > 0 with a mean gap of "
      "at most a day",)),
    (("--inferbench-request-rates=1,1e-300",),
     ("--inferbench-request-rates '1,1e-300': '1e-300' is not a rate > 0 (expected requests "
      "per second > 0 with a mean gap of at most a day",)),
]


@pytest.mark.parametrize("words, messages", RATE_CASES, ids=["rate-and-rates",
                                                             "inf-and-rates", "tiny-rate",
                                                             "tiny-rate-in-sweep"])
def test_a_rate_nobody_would_wait_for_or_two_rates_are_refused(
        pytester: pytest.Pytester, words: tuple[str, ...], messages: tuple[str, ...]) -> None:
    (pytester.path / "bench-master.yaml").write_text(master_entry(isl=256, osl=16))
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-p", "no:benchmark",
                                           *words)
    text = _text(result)
    assert result.ret == pytest.ExitCode.USAGE_ERROR, text
    for message in messages:
        assert message in text, f"{message!r}:\n{text}"
    assert not (pytester.path / "inferbench-results").exists()  # nothing ran


def test_a_request_the_simulated_server_rejects_fails_its_point_with_the_reason(
        pytester: pytest.Pytester) -> None:
    # Longer than the launch argv's --max-model-len: the simulated server rejects it as a real
    # one does (HTTP 400); the point fails naming why, without a traceback, and the run goes on.
    repo = Path(__file__).resolve().parents[1]
    spec = (repo / "benchmarks/launch/minimaxm3_fp4_mi355x_atom.yaml").read_text()
    assert '--max-model-len, "32768"' in spec
    (pytester.path / "launch").mkdir()
    (pytester.path / "launch/minimaxm3_fp4_mi355x_atom.yaml").write_text(
        spec.replace('--max-model-len, "32768"', '--max-model-len, "512"'))
    (pytester.path / "bench-master.yaml").write_text(master_entry(isl=1024, osl=16))
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    text = _text(result)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    assert "the simulated server rejects a request of this point" in text, text
    assert "maximum context length is 512 tokens" in text, text
    assert "During handling" not in text, text
