"""Synthetic agentic-coding traces in the `traces.jsonl` format, for tests and for users without
the recorded corpus: `python -m pytest_inferbench.loadgen.synthetic_traces OUT.jsonl`.

Each trace is one session whose context grows turn by turn (every turn resends the whole history,
so its blocks are the previous turn's plus new ones), with seeded output lengths and think times,
and subagents spawned after a turn that share the session's first blocks and are joined by the
next turn. With `nested` > 0 each subagent's first turn spawns a nested agent (its requests
recorded among the subagent's, their context forked from the subagent's: all of its blocks but
the last, then their own), joined by the subagent's next turn, whose first turn spawns the next
level down, `nested` levels deep (agentic.md §2.3; `trace_sessions` splits them back out).
Times are whole milliseconds, so `duration_ms` and the recorded ends agree exactly.
"""

from __future__ import annotations

import argparse
import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MAIN_MODEL = "synthetic-main"
SUBAGENT_MODEL = "synthetic-subagent"


@dataclass(frozen=True)
class SyntheticTraceSettings:
    """The shape of the generated sessions (block counts are in blocks of `block_size`)."""

    traces: int = 3
    turns: int = 4  # top-level requests per trace
    subagents: int = 1  # per trace, each after a different turn (at most turns - 1)
    subagent_turns: int = 2
    nested: int = 0  # levels of nested agents under each subagent (needs subagent_turns >= 2)
    first_blocks: int = 8  # the first prompt's blocks
    growth_blocks: int = 3  # new blocks per turn, on average
    output_tokens: int = 128  # on average
    think_time_s: float = 2.0  # mean gap between a turn's end and the next turn's start
    block_size: int = 64
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("traces", "turns", "first_blocks", "block_size", "output_tokens",
                     "subagent_turns"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if not 0 <= self.subagents < self.turns:
            raise ValueError(f"subagents must be in [0, turns - 1], got {self.subagents}")
        if self.growth_blocks < 0 or self.think_time_s < 0 or self.nested < 0:
            raise ValueError("growth_blocks, think_time_s and nested must be >= 0")
        if self.nested and self.subagent_turns < 2:
            raise ValueError("nested agents need subagent_turns >= 2 (a turn to join them)")


def synthetic_traces(settings: SyntheticTraceSettings) -> list[dict[str, Any]]:
    """The traces as JSON objects, the same for the same settings."""
    rng = random.Random(settings.seed)
    return [_trace(rng, settings, i) for i in range(settings.traces)]


def write_synthetic_traces(path: Path, settings: SyntheticTraceSettings) -> Path:
    """Write them as `traces.jsonl` (into `path` when it is a directory); returns the file."""
    file = path / "traces.jsonl" if path.is_dir() else path
    lines = [json.dumps(t, separators=(",", ":")) for t in synthetic_traces(settings)]
    file.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return file


def _request(rng: random.Random, s: SyntheticTraceSettings, model: str, start_ms: int,
             blocks: list[int], last_end_ms: int | None) -> dict[str, Any]:
    out = max(1, round(rng.expovariate(1 / s.output_tokens)))
    # A partial last block is allowed, as recorded prompts have: `in` never exceeds the blocks.
    tokens = len(blocks) * s.block_size - rng.randrange(s.block_size)
    api_ms = 200 + 10 * out + rng.randrange(500)
    request: dict[str, Any] = {
        "t": start_ms / 1000, "type": "s", "model": model, "in": tokens, "out": out,
        "hash_ids": list(blocks), "input_types": ["text" if last_end_ms is None
                                                  else "tool_result"],
        "output_types": ["text", "tool_use"], "stop": "tool_use", "api_time": api_ms / 1000,
        "ttft": min(api_ms, 100 + rng.randrange(400)) / 1000,
    }
    if last_end_ms is not None:
        request["think_time"] = max(0, start_ms - last_end_ms) / 1000
    return request


def _think_ms(rng: random.Random, s: SyntheticTraceSettings) -> int:
    return round(rng.expovariate(1 / s.think_time_s) * 1000) if s.think_time_s else 0


def _trace(rng: random.Random, s: SyntheticTraceSettings, index: int) -> dict[str, Any]:
    next_block = 0

    def new_blocks(n: int) -> list[int]:
        nonlocal next_block
        next_block += n
        return list(range(next_block - n, next_block))

    spawn_after = set(rng.sample(range(s.turns - 1), s.subagents))
    context = new_blocks(s.first_blocks)
    entries: list[dict[str, Any]] = []
    now = 0  # milliseconds since the trace's start
    last_end: int | None = None
    for turn in range(s.turns):
        if turn:
            context = context + new_blocks(max(0, round(rng.gauss(s.growth_blocks, 1))))
        request = _request(rng, s, MAIN_MODEL, now, context, last_end)
        entries.append(request)
        last_end = now + round(request["api_time"] * 1000)
        now = last_end + _think_ms(rng, s)
        if turn in spawn_after:
            sub_start = last_end + 1 + rng.randrange(200)
            inner, sub_end = _subagent_requests(rng, s, sub_start, context[:2], new_blocks,
                                                s.nested)
            entries.append({
                "t": sub_start / 1000, "type": "subagent",
                "agent_id": f"subagent_{len(entries):03d}_{rng.getrandbits(32):08x}",
                "subagent_type": "Subagent", "duration_ms": sub_end - sub_start,
                "total_tokens": sum(r["in"] + r["out"] for r in inner),
                "status": "completed", "models": [SUBAGENT_MODEL], "requests": inner,
            })
            # The next turn waits for the subagent: it joins there.
            now = max(now, sub_end + _think_ms(rng, s))
    return {"id": f"synthetic-{s.seed}-{index:04d}", "models": [MAIN_MODEL, SUBAGENT_MODEL]
            if s.subagents else [MAIN_MODEL], "block_size": s.block_size,
            "hash_id_scope": "local", "requests": entries}


def _subagent_requests(rng: random.Random, s: SyntheticTraceSettings, start_ms: int,
                       shared: list[int], new_blocks: Any, nested: int
                       ) -> tuple[list[dict[str, Any]], int]:
    """A subagent's own session (the parent's shared blocks, then its own, growing), with
    `nested` levels of nested agents under its first turn; (its requests in time order, the
    end of the last)."""
    # At least two blocks of its own: a nested agent under it shares more with it than with
    # anything above it, so its chain forks from this one.
    context = shared + new_blocks(max(2, s.first_blocks // 2))
    requests = []
    now, end = start_ms, start_ms
    for turn in range(s.subagent_turns):
        if turn:
            context = context + new_blocks(max(1, round(rng.gauss(s.growth_blocks, 1))))
        request = _request(rng, s, SUBAGENT_MODEL, now, context, end if turn else None)
        request["type"] = "n"  # recorded subagent calls are not streamed
        del request["ttft"]
        requests.append(request)
        end = now + round(request["api_time"] * 1000)
        now = end + _think_ms(rng, s)
        if turn == 0 and nested:
            inner, inner_end = _subagent_requests(rng, s, end + 1 + rng.randrange(200),
                                                  context[:-1], new_blocks, nested - 1)
            requests.extend(inner)  # recorded among this one's: its next turn joins them
            now = max(now, inner_end + _think_ms(rng, s))
    return requests, end


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pytest_inferbench.loadgen.synthetic_traces",
                                     description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("out", type=Path, help="a .jsonl file, or a directory for traces.jsonl")
    defaults = SyntheticTraceSettings()
    for name in ("traces", "turns", "subagents", "subagent_turns", "nested", "first_blocks",
                 "growth_blocks", "output_tokens", "block_size", "seed"):
        parser.add_argument("--" + name.replace("_", "-"), type=int,
                            default=getattr(defaults, name))
    parser.add_argument("--think-time-s", type=float, default=defaults.think_time_s)
    args = vars(parser.parse_args(argv))
    out = args.pop("out")
    try:
        settings = SyntheticTraceSettings(**args)
    except ValueError as exc:
        parser.error(str(exc))
    print(write_synthetic_traces(out, settings))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
