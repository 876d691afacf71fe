"""Datasets: ShareGPT JSON, JSONL prompts and shared-prefix groups, drawn once for every backend."""

from __future__ import annotations

import itertools
import json
import shutil
from pathlib import Path

import pytest

from pytest_inferbench.loadgen.datasets import DatasetError, parse_dataset
from pytest_inferbench.loadgen.prompts import point_workload, render
from pytest_inferbench.loadgen.tokenizer import count_tokens
from pytest_inferbench.loadgen.workload import LoadSettings
from pytest_inferbench.recipe.launch import ClientOptions
from pytest_inferbench.testing.recipes import master_entry

REPO = Path(__file__).resolve().parents[2]
PLAIN = ClientOptions(use_chat_template=False)


def sharegpt(path: Path, n: int) -> Path:
    conversations = [{"conversations": [
        {"from": "human", "value": " ".join(["ask"] * (5 + i))},
        {"from": "gpt", "value": " ".join(["reply"] * (3 + i))}]} for i in range(n)]
    conversations.append({"conversations": [{"from": "human", "value": "no reply"}]})  # skipped
    path.write_text(json.dumps(conversations))
    return path


def test_sharegpt_prompts_are_sent_as_written_with_the_replys_length(tmp_path: Path) -> None:
    spec = parse_dataset(f"sharegpt:{sharegpt(tmp_path / 'sg.json', 6)}")
    load = LoadSettings(prompts_per_conc=3, warmup_per_conc=1, dataset=spec)
    workload = point_workload(1024, 256, 2, load, PLAIN)
    rendered = render(workload)
    assert len(rendered.prompts) == 6
    # Every prompt of the file once (6 needed, 6 usable), counted by the simulator's tokenizer,
    # max_tokens the reply's length, in an order the seed fixed.
    assert sorted(p.text for p in rendered.prompts) == sorted(
        " ".join(["ask"] * (5 + i)) for i in range(6))
    for prompt in rendered.prompts:
        assert prompt.input_tokens == count_tokens(prompt.text)
        assert prompt.output_tokens == prompt.input_tokens - 2  # 3 + i reply words, 5 + i asked
    assert workload.describe()["dataset"] == f"sharegpt:{spec.path}"
    again = render(point_workload(1024, 256, 2, load, PLAIN))
    assert [p.text for p in again.prompts] == [p.text for p in rendered.prompts]


def test_jsonl_prompts_repeat_when_the_point_needs_more(tmp_path: Path) -> None:
    path = tmp_path / "prompts.jsonl"
    path.write_text('{"prompt": "one two three"}\n\n{"prompt": "four five", "output_tokens": 7}\n')
    load = LoadSettings(prompts_per_conc=2, dataset=parse_dataset(f"jsonl:{path}"))
    rendered = render(point_workload(64, 16, 4, load, PLAIN))
    assert len(rendered.prompts) == 8
    assert {p.text for p in rendered.prompts} == {"one two three", "four five"}
    assert {(p.input_tokens, p.output_tokens) for p in rendered.prompts} == {(3, 16), (2, 7)}


def test_prefix_groups_share_their_first_tokens() -> None:
    load = LoadSettings(prompts_per_conc=4, warmup_per_conc=0, range_ratio=1.0,
                        dataset=parse_dataset("prefix:2:100"))
    rendered = render(point_workload(300, 16, 2, load, PLAIN))
    words = [p.text.split() for p in rendered.prompts]
    assert all(len(w) == 300 for w in words)
    heads = [" ".join(w[:100]) for w in words]
    assert heads[0::2] == [heads[0]] * 4 and heads[1::2] == [heads[1]] * 4
    assert heads[0] != heads[1]
    assert len({" ".join(w[100:]) for w in words}) == 8  # the rest of each prompt is its own


@pytest.mark.parametrize(("text", "message"), [
    ("words", "expected random, sharegpt:PATH"),
    ("prefix:0:10", "expected random"),
    ("jsonl:/no/such.jsonl", "/no/such.jsonl is not a file"),
])
def test_bad_dataset_specs_name_the_option(text: str, message: str) -> None:
    with pytest.raises(DatasetError, match="--inferbench-dataset") as info:
        parse_dataset(text)
    assert message in str(info.value)


def test_a_dataset_run_on_sim_and_a_bad_file_is_a_usage_error(pytester: pytest.Pytester) -> None:
    (pytester.path / "bench-master.yaml").write_text(
        master_entry(rows=["{ tp: 4, conc-list: [2] }"], isl=256, osl=32))
    shutil.copytree(REPO / "benchmarks" / "launch", pytester.path / "launch")
    (pytester.path / "prompts.jsonl").write_text('{"prompt": "hello there friend"}\n')
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--inferbench-no-plots",
                                           "--inferbench-prompts-per-conc=2",
                                           "--inferbench-dataset=jsonl:prompts.jsonl")
    result.assert_outcomes(passed=1)
    summary = json.loads((pytester.path / "inferbench-results" / "summary.json").read_text())
    (point,) = summary["points"]
    assert point["workload"]["dataset"] == "jsonl:prompts.jsonl"
    # The per-request arrays live in the point's raw file, not in summary.json.
    assert "input_lens" not in point
    (raw_file,) = (p for p in (pytester.path / "inferbench-results" / "points").iterdir()
                   if not p.name.startswith("agg_"))
    assert json.loads(raw_file.read_text())["input_lens"] == [3] * 4
    (pytester.path / "bad.jsonl").write_text('{"prompt": "fine"}\n{"text": "no prompt"}\n')
    bad = pytester.runpytest_subprocess("-p", "no:cacheprovider",
                                        "--inferbench-dataset=jsonl:bad.jsonl")
    assert bad.ret == pytest.ExitCode.USAGE_ERROR
    bad.stderr.fnmatch_lines(['*bad.jsonl:2: expected {"prompt": TEXT} with a text*'])


def test_multiturn_prompts_grow_by_the_conversation_so_far() -> None:
    load = LoadSettings(prompts_per_conc=3, warmup_per_conc=0, range_ratio=1.0,
                        dataset=parse_dataset("multiturn:3"))
    workload = point_workload(300, 20, 2, load, PLAIN)
    # Six requests: two conversations of three turns, each turn after the one before.
    assert workload.chains() == [[0, 1, 2], [3, 4, 5]]
    # A new message of ISL / TURNS = 100 tokens a turn, replies of 20: 100, 220, 340.
    assert workload.input_lens == [100, 220, 340] * 2
    rendered = render(workload)
    texts = [p.text for p in rendered.prompts]
    assert [count_tokens(t) for t in texts] == workload.input_lens
    assert texts[1].startswith(texts[0] + " ") and texts[2].startswith(texts[1] + " ")
    assert not texts[3].startswith(texts[0])


def test_multiturn_on_sim_sends_each_turn_after_the_previous_one(
        pytester: pytest.Pytester) -> None:
    (pytester.path / "bench-master.yaml").write_text(
        master_entry(rows=["{ tp: 4, conc-list: [2] }"], isl=256, osl=32))
    shutil.copytree(REPO / "benchmarks" / "launch", pytester.path / "launch")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--inferbench-no-plots",
                                           "--inferbench-prompts-per-conc=4",
                                           "--inferbench-dataset=multiturn:4",
                                           "--inferbench-save-requests")
    result.assert_outcomes(passed=1)
    (path,) = (pytester.path / "inferbench-results" / "requests").iterdir()
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(lines) == 8
    for conversation in (lines[:4], lines[4:]):
        for before, turn in itertools.pairwise(conversation):
            assert turn["input_tokens"] > before["input_tokens"]
            # Sent no earlier than the previous turn's end.
            assert turn["send_time_s"] >= before["send_time_s"] + before["e2el_ms"] / 1000 - 1e-9
    bad = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--inferbench-request-rate=2",
                                        "--inferbench-dataset=multiturn:4")
    assert bad.ret == pytest.ExitCode.USAGE_ERROR
    bad.stderr.fnmatch_lines(["*multi-turn runs closed loop only*"])
