"""A trace as a replay plays it: its streams, their turns, and where the children hang.

The root session `<id>`, one child `<id>::sa:<agent_id>` per subagent, and within a subagent its
nested agents (agentic.md §2.3): its inner requests are split into chains by their block hashes
-- a request continues the chain whose last request's blocks are a prefix of its own and that
ended before it started (the longest such wins), else it starts a new chain, forked from the
chain whose last request shares the longest leading run of blocks with it. The chain holding the
subagent's first request is the subagent's own stream; each other chain is a nested child
`<id>::sa:<agent_id>:fa:NNN` (numbered by first request) of the chain it forked from, so a
nested agent may spawn nested agents of its own. (A compaction that shrinks the context also
forks here; AIPerf splices such a seam back onto its chain, this does not.)

Every child hangs in its parent stream as recorded (`SubagentLink`): spawned by the parent's last
turn that started before it, joined by the parent's first later turn that starts once the child
and everything under it have ended (`join_turn` None: a background child nothing waits for).
Each turn carries its end-to-start delay and its theoretical prefix-cache hit (the leading run of
its blocks that an earlier, finished request of the same trace sent).
"""

from __future__ import annotations

from dataclasses import dataclass

from .traces import Trace, TraceRequest, child_session, shared_prefix_blocks

# A parent turn joins a child that ends at most this much after it starts (float noise).
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
    """Where a child stream hangs in its parent stream."""

    session_id: str
    spawn_turn: int  # the parent turn whose completion starts it
    join_turn: int | None  # the parent turn that waits for it; None: a background child
    parent: str = ""  # the parent stream's session id ("" for the root: the trace's id)


@dataclass(frozen=True)
class SessionTree:
    """A trace as a replay plays it: its streams' turns and how the children hang."""

    trace: Trace
    streams: dict[str, tuple[Turn, ...]]  # root first, then children in recorded order
    links: tuple[SubagentLink, ...]  # parents before their children

    def parent_of(self, link: SubagentLink) -> str:
        return link.parent or self.trace.id


@dataclass
class _Chain:
    requests: list[TraceRequest]
    parent: int | None  # index of the chain it forked from (None: the subagent's own)


def _chains(requests: tuple[TraceRequest, ...]) -> list[_Chain]:
    """A subagent's requests split into chains (module doc); the first is its own."""
    chains: list[_Chain] = []
    for r in sorted(requests, key=lambda q: q.t):  # stable: recorded order among equal times
        if not chains:
            chains.append(_Chain([r], None))
            continue
        best, best_len = None, -1
        for i, c in enumerate(chains):
            tail = next((q for q in reversed(c.requests) if q.hash_ids), None)
            if tail is None or len(tail.hash_ids) <= best_len:
                continue
            if tail.end <= r.t + JOIN_EPSILON_S and r.hash_ids[:len(tail.hash_ids)] == \
                    tail.hash_ids:
                best, best_len = i, len(tail.hash_ids)
        if not r.hash_ids:
            best = 0  # no block evidence: it stays with the subagent's own chain
        if best is not None:
            chains[best].requests.append(r)
            continue
        shared = [(shared_prefix_blocks(c.requests[-1].hash_ids, r.hash_ids),
                   len(c.requests[-1].hash_ids), -i) for i, c in enumerate(chains)]
        depth, _, neg = max(shared)
        chains.append(_Chain([r], -neg if depth else 0))
    return chains


def _link(session: str, parent: str, parent_turns: list[TraceRequest], start: float,
          end: float, after: int | None = None) -> SubagentLink | None:
    """The child's spawn and join turns in its parent (None: nothing spawns it). `after`:
    the spawn is the parent's last turn before this index (a subagent's place in the list)."""
    if after is None:
        before = [k for k, r in enumerate(parent_turns) if r.t < start - JOIN_EPSILON_S]
        before = before or [k for k, r in enumerate(parent_turns) if r.t <= start]
    else:
        before = list(range(min(after, len(parent_turns))))
    if not before:
        return None
    spawn = before[-1]
    join = next((k for k in range(spawn + 1, len(parent_turns))
                 if parent_turns[k].t + JOIN_EPSILON_S >= end), None)
    return SubagentLink(session_id=session, spawn_turn=spawn, join_turn=join, parent=parent)


def sessions(trace: Trace) -> SessionTree:
    """The trace's streams, each turn's delay and theoretical prefix hit, and its children's
    spawn and join turns."""
    root = trace.turns
    streams: dict[str, list[TraceRequest]] = {trace.id: list(root)}
    links: list[SubagentLink] = []
    positions = [i for i, e in enumerate(trace.entries) if isinstance(e, TraceRequest)]
    for sub in trace.subagents:
        after = sum(1 for pos in positions if pos < sub.position)
        session = child_session(trace, sub)
        link = _link(session, "", list(root), sub.t, sub.end, after)
        if link is None or not sub.requests:
            continue  # nothing spawns it: the replayer drops it
        links.append(link)
        chains = _chains(sub.requests)
        names = [session] + [f"{session}:fa:{n:03d}" for n in range(len(chains) - 1)]
        # A chain's end covers the chains under it (forked later, so listed after it).
        ends = [max(r.end for r in c.requests) for c in chains]
        for i in range(len(chains) - 1, 0, -1):
            parent = chains[i].parent
            assert parent is not None
            ends[parent] = max(ends[parent], ends[i])
        for name, chain in zip(names, chains, strict=True):
            streams[name] = chain.requests
        for i in range(1, len(chains)):
            parent = chains[i].parent
            assert parent is not None
            nested = _link(names[i], names[parent], chains[parent].requests,
                           chains[i].requests[0].t, ends[i])
            if nested is not None:
                links.append(nested)
    return SessionTree(trace=trace, streams=_turns(trace, streams), links=tuple(links))


def _turns(trace: Trace, streams: dict[str, list[TraceRequest]]
           ) -> dict[str, tuple[Turn, ...]]:
    """Each stream's turns: delays, and theoretical hits over the whole trace in time order."""
    every = [(r.t, session, k, r) for session, rs in streams.items() for k, r in enumerate(rs)]
    # A block is available to a request once a request that sent it has finished (causal).
    available: dict[int, float] = {}
    hits: dict[tuple[str, int], tuple[int, int]] = {}
    for _, session, k, r in sorted(every, key=lambda e: e[0]):
        run = 0
        for block in r.hash_ids:
            ready = available.get(block)
            if ready is None or ready > r.t:
                break
            run += 1
        total = min(len(r.hash_ids), r.input_length // trace.block_size)
        hits[(session, k)] = (min(run, total), total)
        for block in r.hash_ids:
            available[block] = min(available.get(block, r.end), r.end)
    out: dict[str, tuple[Turn, ...]] = {}
    for session, rs in streams.items():
        turns: list[Turn] = []
        for k, r in enumerate(rs):
            delay = None if not turns else max(0.0, r.t - turns[-1].request.end)
            hit, total = hits[(session, k)]
            turns.append(Turn(session_id=session, index=k, request=r, delay=delay,
                              hit_blocks=hit, total_blocks=total))
        out[session] = tuple(turns)
    return out
