"""Agentic traces: the loader against the corpus checker's oracle, file:line errors, and the
synthetic generator's output through the same checker."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from shared_data import AGENTIC_DATA

from pytest_inferbench.loadgen.synthetic_traces import (
    SyntheticTraceSettings,
    synthetic_traces,
    write_synthetic_traces,
)
from pytest_inferbench.loadgen.trace_sessions import sessions
from pytest_inferbench.loadgen.traces import TraceError, load_traces

REPO = Path(__file__).resolve().parents[2]
TURN = re.compile(r"^\s+(?P<session>\S+)\s+turn=(?P<turn>\d+) t=\s*(?P<t>[\d.]+) "
                  r"in=\s*(?P<in>\d+) out=\s*(?P<out>\d+) e2s_delay=(?P<delay>\S+) "
                  r"theo_hit=(?P<hit>\d+)/(?P<total>\d+)$")
SUBAGENT = re.compile(r"^\s+subagent (?P<agent>\S+): spawn_on_turn=(?P<spawn>\S+) "
                      r"join_on_turn=(?P<join>\S+) ")
TRACE = re.compile(r"^trace (?P<id>\S+): top=(?P<top>\d+) subagents=(?P<subs>\d+) "
                   r"peak_ctx=(?P<peak>\d+)$")


@pytest.fixture(scope="module")
def corpus() -> Path:
    """The 3-trace corpus and its checker: `INFERBENCH_AGENTIC_DATA`, else
    `../shared/data/agentic`."""
    source = AGENTIC_DATA
    if not (source / "check_traces.py").is_file():
        pytest.skip(f"no agentic trace corpus at {source}")
    return source


def oracle(checker: Path, traces: Path) -> tuple[int, dict[str, object]]:
    """The checker's exit status and what it prints, by trace, stream turn and subagent."""
    done = subprocess.run([sys.executable, str(checker), str(traces)], capture_output=True,
                          text=True, check=False, timeout=120)
    assert not done.stderr, done.stderr
    values: dict[str, object] = {}
    for line in done.stdout.splitlines():
        if m := TRACE.match(line):
            values[m["id"]] = (int(m["top"]), int(m["subs"]), int(m["peak"]))
        elif m := TURN.match(line):
            delay = None if m["delay"] == "None" else round(float(m["delay"]), 6)
            values[f"{m['session']}#{m['turn']}"] = (
                int(m["in"]), int(m["out"]), delay, int(m["hit"]), int(m["total"]))
        elif m := SUBAGENT.match(line):
            join = None if m["join"] == "None" else int(m["join"])
            values[f"sa:{m['agent']}"] = (int(m["spawn"]), join)
    return done.returncode, values


def loaded(path: Path) -> dict[str, object]:
    """The same values, from the loader."""
    values: dict[str, object] = {}
    for trace in load_traces(path):
        values[trace.id] = (len(trace.turns), len(trace.subagents), trace.peak_context)
        tree = sessions(trace)
        for session, turns in tree.streams.items():
            for turn in turns:
                r = turn.request
                values[f"{session}#{turn.index}"] = (
                    r.input_length, r.output_length,
                    None if turn.delay is None else round(turn.delay, 6),
                    turn.hit_blocks, turn.total_blocks)
        for link in tree.links:
            values["sa:" + link.session_id.split("::sa:")[1]] = (link.spawn_turn,
                                                                 link.join_turn)
    return values


def test_the_corpus_loads_with_the_checkers_values(corpus: Path) -> None:
    status, expected = oracle(corpus / "check_traces.py", corpus / "traces.jsonl")
    assert status == 0
    assert len(expected) > 3  # traces, turns and the subagent were all read back
    # A directory is read through its traces.jsonl.
    assert loaded(corpus) == expected


def test_synthetic_traces_pass_the_checker_and_load_with_its_values(
    corpus: Path, tmp_path: Path
) -> None:
    settings = SyntheticTraceSettings(traces=4, turns=5, subagents=2, subagent_turns=3, seed=7)
    file = write_synthetic_traces(tmp_path, settings)
    status, expected = oracle(corpus / "check_traces.py", file)
    assert status == 0  # valid, `in` within its blocks, duration_ms and total_tokens agree
    assert loaded(file) == expected
    traces = load_traces(file)
    assert [(len(t.turns), len(t.subagents)) for t in traces] == [(5, 2)] * 4
    # Each subagent is joined by the turn after the one that spawned it, not left behind.
    links = [link for t in traces for link in sessions(t).links]
    assert all(link.join_turn == link.spawn_turn + 1 for link in links)
    # Every turn resends the whole history: the theoretical hit grows past the first turn.
    roots = [sessions(t).streams[t.id] for t in traces]
    assert all(turns[0].hit_blocks == 0 and turns[-1].hit_blocks > 0 for turns in roots)


def test_nested_agents_are_valid_traces_and_split_out_level_by_level(
    corpus: Path, tmp_path: Path
) -> None:
    """A subagent's nested agents are recorded among its own requests, as the format has them
    (the checker accepts the file); the loader splits them out by their block hashes into
    children of the agent that spawned them, each joined by that agent's next turn."""
    settings = SyntheticTraceSettings(traces=2, turns=3, subagents=1, subagent_turns=2,
                                      nested=2, seed=5)
    file = write_synthetic_traces(tmp_path, settings)
    status, _ = oracle(corpus / "check_traces.py", file)
    assert status == 0
    for trace in load_traces(file):
        tree = sessions(trace)
        (sub,) = trace.subagents
        assert len(sub.requests) == 3 * settings.subagent_turns  # its own and two levels'
        top = f"{trace.id}::sa:{sub.agent_id}"
        parents = {link.session_id: tree.parent_of(link) for link in tree.links}
        assert parents == {top: trace.id, f"{top}:fa:000": top,
                           f"{top}:fa:001": f"{top}:fa:000"}
        assert all(len(tree.streams[s]) == settings.subagent_turns for s in parents)
        assert all(link.join_turn == link.spawn_turn + 1 for link in tree.links)
        # Every request is played once, in exactly one stream.
        played = sorted(t.request.t for turns in tree.streams.values() for t in turns)
        assert played == sorted([r.t for r in trace.turns] + [r.t for r in sub.requests])


def test_the_generator_is_seeded() -> None:
    settings = SyntheticTraceSettings(seed=1)
    assert synthetic_traces(settings) == synthetic_traces(SyntheticTraceSettings(seed=1))
    assert synthetic_traces(settings) != synthetic_traces(SyntheticTraceSettings(seed=2))


def test_the_generator_command_writes_and_refuses_bad_settings(tmp_path: Path) -> None:
    module = "pytest_inferbench.loadgen.synthetic_traces"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = tmp_path / "t.jsonl"
    done = subprocess.run([sys.executable, "-m", module, str(out), "--traces", "2"],
                          capture_output=True, text=True, env=env, check=False, timeout=60)
    assert done.returncode == 0, done.stderr
    assert len(load_traces(out)) == 2
    done = subprocess.run([sys.executable, "-m", module, str(out), "--subagents", "9"],
                          capture_output=True, text=True, env=env, check=False, timeout=60)
    assert done.returncode == 2
    assert "subagents must be in [0, turns - 1], got 9" in done.stderr
    assert "Traceback" not in done.stderr


GOOD = {"id": "a", "models": ["m"], "block_size": 64, "hash_id_scope": "local",
        "requests": [{"t": 0.0, "type": "n", "model": "m", "in": 64, "out": 1,
                      "hash_ids": [0], "api_time": 1.0}]}


def test_bad_lines_are_reported_with_file_and_line_all_at_once(tmp_path: Path) -> None:
    missing = json.loads(json.dumps(GOOD))
    del missing["requests"][0]["in"]
    extra = {**GOOD, "id": "c", "colour": "blue"}
    nested = json.loads(json.dumps(GOOD))
    nested["id"] = "d"
    nested["requests"].append({"t": 1.0, "type": "subagent", "agent_id": "x",
                               "subagent_type": "S", "status": "completed", "models": [],
                               "requests": [{"type": "subagent"}]})
    lines = [json.dumps(GOOD).encode(), b'{"id": "b",', json.dumps(missing).encode(),
             json.dumps(extra).encode(), "caf\u00e9".encode("latin-1"), json.dumps(GOOD).encode(),
             json.dumps(nested).encode(),
             json.dumps({**GOOD, "id": "e", "hash_id_scope": "global"}).encode()]
    path = tmp_path / "traces.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    with pytest.raises(TraceError) as info:
        load_traces(path)
    assert [m.replace(f"{path}:", "L") for m in info.value.messages] == [
        "L2: not valid JSON: Expecting property name enclosed in double quotes (column 12)",
        "L3: requests[0].in: missing required key",
        "L4: <trace>.colour: unknown key (expected one of: id, models, block_size, "
        "hash_id_scope, tool_tokens, system_tokens, requests, totals)",
        "L5: not UTF-8 text (byte 0xe9 at column 4)",
        "L6: id: duplicate trace id 'a' (first at line 1)",
        "L7: requests[1].requests[0].type: a subagent inside a subagent (expected 'n' or 's')",
        "L8: hash_id_scope: got 'global' (expected 'local')",
    ]


def test_a_directory_without_traces_and_an_empty_file_say_so(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match=r"traces\.jsonl: cannot read"):
        load_traces(tmp_path)
    (tmp_path / "traces.jsonl").write_text("\n", encoding="utf-8")
    with pytest.raises(TraceError, match="no traces"):
        load_traces(tmp_path)


def test_a_nested_time_before_its_subagent_is_relative_to_it(tmp_path: Path) -> None:
    trace = json.loads(json.dumps(GOOD))
    inner = {"t": 0.5, "type": "n", "model": "m", "in": 64, "out": 1, "api_time": 1.0}
    trace["requests"].append({"t": 2.0, "type": "subagent", "agent_id": "x",
                              "subagent_type": "S", "status": "completed", "models": ["m"],
                              "requests": [inner, {**inner, "t": 4.0}]})
    path = tmp_path / "traces.jsonl"
    path.write_text(json.dumps(trace) + "\n", encoding="utf-8")
    (sub,) = load_traces(path)[0].subagents
    assert [r.t for r in sub.requests] == [2.0 + 0.5, 4.0]
