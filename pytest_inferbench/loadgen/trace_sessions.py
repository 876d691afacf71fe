"""A trace as a replay plays it: its streams, their turns, and where the subagents hang.

The root session `<id>` and one child `<id>::sa:<agent_id>` per subagent, each turn with its
end-to-start delay and its theoretical prefix-cache hit (the leading run of its blocks that an
earlier, finished request of the same trace sent), and each subagent's spawn and join turns of
the root (`join_turn` None: a background child nothing waits for).
"""

from __future__ import annotations

from dataclasses import dataclass

from .traces import Trace, TraceRequest, all_requests, child_session

# A parent turn joins a subagent that ends at most this much after it starts (float noise).
JOIN_EPSILON_S = 1e-6


@dataclass(frozen=True)
class Turn:
    """One turn of a replayed stream."""

    session_id: str
    index: int
    request: TraceRequest
    delay: float | None  # end-to-start gap after the stream's previous turn (None: first)
    hit_blocks: int  # theoretical prefix-cache hit, in blocks
    total_blocks: int  # blocks the prompt fully covers: min(len(hash_ids), in // block_size)


@dataclass(frozen=True)
class SubagentLink:
    """Where a subagent hangs in the root stream."""

    session_id: str
    spawn_turn: int  # the root turn whose completion starts it
    join_turn: int | None  # the root turn that waits for it; None: a background child


@dataclass(frozen=True)
class SessionTree:
    """A trace as a replay plays it: its streams' turns and how the children hang."""

    trace: Trace
    streams: dict[str, tuple[Turn, ...]]  # root first, then children in recorded order
    links: tuple[SubagentLink, ...]


def sessions(trace: Trace) -> SessionTree:
    """The trace's streams, each turn's delay and theoretical prefix hit, and its subagents'
    spawn and join turns."""
    requests = all_requests(trace)
    # A block is available to a request once a request that sent it has finished (causal).
    available: dict[int, float] = {}
    hits: dict[tuple[str, int], tuple[int, int]] = {}
    for key, r in sorted(requests, key=lambda kr: kr[1].t):
        run = 0
        for block in r.hash_ids:
            ready = available.get(block)
            if ready is None or ready > r.t:
                break
            run += 1
        total = min(len(r.hash_ids), r.input_length // trace.block_size)
        hits[key] = (min(run, total), total)
        for block in r.hash_ids:
            available[block] = min(available.get(block, r.end), r.end)
    streams: dict[str, list[Turn]] = {}
    for (session, k), r in requests:
        turns = streams.setdefault(session, [])
        delay = None if not turns else max(0.0, r.t - turns[-1].request.end)
        hit, total = hits[(session, k)]
        turns.append(Turn(session_id=session, index=k, request=r, delay=delay, hit_blocks=hit,
                          total_blocks=total))
    positions = [i for i, e in enumerate(trace.entries) if isinstance(e, TraceRequest)]
    links = []
    for sub in trace.subagents:
        before = [k for k, pos in enumerate(positions) if pos < sub.position]
        if not before:
            continue  # nothing spawns it: the replayer drops it
        join = next((k for k, pos in enumerate(positions) if pos > sub.position
                     and trace.turns[k].t + JOIN_EPSILON_S >= sub.end), None)
        links.append(SubagentLink(session_id=child_session(trace, sub), spawn_turn=before[-1],
                                  join_turn=join))
    return SessionTree(trace=trace, streams={k: tuple(v) for k, v in streams.items()},
                       links=tuple(links))
