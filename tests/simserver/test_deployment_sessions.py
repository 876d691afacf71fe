"""A served deployment keeps an agentic replay's play on the instance of its first request (its
marker is the session, as the in-process replay keeps a session), so each instance's own prefix
cache holds the play's earlier turns: the hits land on that instance, seen per instance in
`/metrics`. A request of no session is priced uncached, as the in-process fixed-length path."""

from __future__ import annotations

from typing import TYPE_CHECKING

import httpx

from pytest_inferbench.loadgen.replay_prompts import marker, play_of, prompt_text
from pytest_inferbench.loadgen.tokenizer import count_tokens

from .promtext import scrape

if TYPE_CHECKING:
    from collections.abc import Callable

    from pytest_inferbench.sim.server.launcher import SimServer

MODEL = "amd/MiniMax-M3-MXFP4"
BLOCK = 16
WORKER = ("vllm", "serve", MODEL, "--tensor-parallel-size", "4", "--kv-cache-dtype", "fp8",
          "--block-size", str(BLOCK), "--max-model-len", "10000")
# Round robin would send a play's consecutive turns to the other instance each time.
DEPLOYMENT = ("--hardware", "MI355X", "--time-scale", "0", "--prefill-workers", "2",
              "--router", "round-robin")


def _turns(play: int, lengths: tuple[int, ...]) -> list[str]:
    """A play's prompts as the replay sends them: its marker, then the conversation so far
    (each turn re-sends the earlier ones first)."""
    words = [f"p{play}w{i}" for i in range(max(lengths))]
    rid = marker("run", play, play, "trace")
    return [prompt_text(words[:n], rid, chat=False) for n in lengths]


def _send(server: SimServer, prompt: str) -> None:
    answer = httpx.post(server.base_url + "/v1/completions", trust_env=False, timeout=30,
                        json={"model": MODEL, "prompt": prompt, "max_tokens": 1})
    assert answer.status_code == 200, answer.text
    assert answer.json()["usage"]["prompt_tokens"] == count_tokens(prompt)


def _cached(prompts: list[str]) -> int:
    """Tokens each turn finds cached on its play's instance: the full blocks of the turn
    before it (a prefix of it)."""
    return sum(count_tokens(before) // BLOCK * BLOCK for before in prompts[:-1])


def test_a_play_stays_on_its_instance_and_hits_its_own_cache(
        start_server: Callable[..., SimServer]) -> None:
    a, b = _turns(1, (300, 500, 600)), _turns(2, (250, 300))
    assert play_of(a[0]) != play_of(b[0]) and play_of(a[0]) == play_of(a[2])
    server = start_server(WORKER, DEPLOYMENT)
    for prompt in (*a, *b):
        _send(server, prompt)
    hits = {dict(labels)["instance"]: v for (name, labels), v in scrape(server.base_url).items()
            if name == "inferbench:deployment_instance_prefix_cache_hits_total"}
    # The first play went to the round robin's first instance, the second to the next one.
    assert hits == {"0": _cached(a), "1": _cached(b)}
    assert _cached(a) > 0 and _cached(b) > 0
    # Prompts of no replay: no session, nothing cached, whatever they share.
    plain = " ".join(f"x{i}" for i in range(300))
    for prompt in (plain, plain + " more words", plain):
        _send(server, prompt)
    again = {dict(labels)["instance"]: v for (name, labels), v in scrape(server.base_url).items()
             if name == "inferbench:deployment_instance_prefix_cache_hits_total"}
    assert again == hits
