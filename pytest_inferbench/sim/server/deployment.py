"""A multinode deployment behind the server's one OpenAI-compatible endpoint.

`serve --prefill-workers N [--decode-workers M] [--router POLICY] -- <prefill argv> [-- <decode
argv>]`: each worker is the engine its argv describes, and the server loop drives the whole
`Cluster` as it drives one engine (`Cluster.step` runs to the next event: a step's end on any
instance, a KV transfer's arrival). Clients see one endpoint (the router's); `/metrics` adds
per-role families (`inferbench:deployment_*{role="prefill"|"decode"|"aggregated"}`, KV
transfers, each instance's prefix cache hits) to the persona's totals, and
`/debug/inferbench/info` describes the deployment. A request carrying an agentic replay's marker
(`replay_prompts.play_of`) is its play's session: the router places its first request and the
rest follow it, each instance caching the prompts it computes, as the in-process replay does.
"""

from __future__ import annotations

import dataclasses
import os
from typing import TYPE_CHECKING

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from ..args import engine_config_from_argv
from ..cluster import Cluster
from ..disagg import Deployment, Pool, default_router

if TYPE_CHECKING:
    import argparse
    from collections.abc import Callable, Iterator, Sequence

    from prometheus_client.core import Metric

    from ..config import EngineConfig
    from .engine_loop import EngineLike


def serve_deployment(prefill: EngineConfig, decode_argv: Sequence[str],
                     options: argparse.Namespace) -> tuple[Cluster, dict[str, object]]:
    """The cluster to serve and the facts `/debug/inferbench/info` shows about it."""
    pools = []
    if options.decode_workers:
        decode, _ = engine_config_from_argv(list(decode_argv), hardware=options.hardware,
                                            env=dict(os.environ))
        decode = dataclasses.replace(decode, seed=prefill.seed)
        pools = [Pool("prefill", prefill, options.prefill_workers),
                 Pool("decode", decode, options.decode_workers)]
    else:
        pools = [Pool("aggregated", prefill, options.prefill_workers)]
    deployment = Deployment(pools[0], pools[1] if len(pools) > 1 else None,
                            router=options.router or default_router(prefill.framework))
    cluster = Cluster(deployment, seed=prefill.seed, stretch=False)
    info: dict[str, object] = {
        "topology": deployment.topology, "router": deployment.router, "gpus": deployment.gpus,
        "pools": {p.role: {"workers": p.workers, "tp": p.config.tp, "ep": p.config.ep,
                           "pp": p.config.pp, "dp_attn": p.config.dp_attn}
                  for p in deployment.pools}}
    if cluster.transfer is not None:
        info["kv_transfer"] = {"fabric": cluster.transfer.fabric,
                               "bytes_per_token": cluster.transfer.bytes_per_token,
                               "link_bytes_per_s": cluster.transfer.link_bytes_per_s,
                               "latency_s": cluster.transfer.latency_s,
                               "overlap": cluster.transfer.overlap}
    return cluster, info


class RoleCollector:
    """prometheus_client collector: every role's counters, read at each scrape."""

    def __init__(self, engine: EngineLike, model: str) -> None:
        assert isinstance(engine, Cluster)
        self._cluster = engine
        self._model = model

    def collect(self) -> Iterator[Metric]:
        cluster = self._cluster
        labels = ["model_name", "role"]
        gauges: dict[str, tuple[str, Callable[[str], float]]] = {
            "workers": ("Engine instances of the role.", lambda r: sum(
                1 for inst in cluster.instances if inst.role == r)),
            "requests_running": ("Requests running on the role's instances.",
                                 lambda r: cluster.counters(r).num_requests_running),
            "requests_waiting": ("Requests waiting on the role's instances.",
                                 lambda r: cluster.counters(r).num_requests_waiting),
            "kv_cache_usage": ("KV-cache usage of the role's instances, 1 = full.",
                               lambda r: _usage(cluster, r)),
        }
        counters: dict[str, tuple[str, Callable[[str], float]]] = {
            "prompt_tokens": ("Prompt tokens the role took in (computed, or arrived with "
                              "their KV cache).",
                              lambda r: cluster.counters(r).prompt_tokens),
            "generation_tokens": ("Tokens the role generated.",
                                  lambda r: cluster.counters(r).generation_tokens),
            "preemptions": ("Preemptions on the role's instances.",
                            lambda r: cluster.counters(r).preemptions),
            "requests_finished": ("Requests the role finished.",
                                  lambda r: cluster.counters(r).requests_finished),
        }
        for name, (doc, read) in gauges.items():
            gauge = GaugeMetricFamily(f"inferbench:deployment_{name}", doc, labels=labels)
            for role in cluster.roles:
                gauge.add_metric([self._model, role], float(read(role)))
            yield gauge
        for name, (doc, read) in counters.items():
            counter = CounterMetricFamily(f"inferbench:deployment_{name}", doc, labels=labels)
            for role in cluster.roles:
                counter.add_metric([self._model, role], float(read(role)))
            yield counter
        # Each instance keeps its own prefix cache: a session's hits land where it is kept.
        hits = CounterMetricFamily("inferbench:deployment_instance_prefix_cache_hits",
                                   "Prompt tokens found in the instance's own prefix cache.",
                                   labels=[*labels, "instance"])
        for role in cluster.roles:
            mine = [inst for inst in cluster.instances if inst.role == role]
            for number, inst in enumerate(mine):
                hits.add_metric([self._model, role, str(number)],
                                float(inst.engine.counters().prefix_cache_hits))
        yield hits
        if cluster.transfer is not None:
            transfers = CounterMetricFamily("inferbench:kv_transfers", "KV-cache transfers "
                                            "from prefill to decode.", labels=["model_name"])
            transfers.add_metric([self._model], float(len(cluster.transfer_seconds)))
            yield transfers
            seconds = CounterMetricFamily("inferbench:kv_transfer_seconds", "Time of the KV "
                                          "transfers, added up.", labels=["model_name"])
            seconds.add_metric([self._model], float(sum(cluster.transfer_seconds)))
            yield seconds


def _usage(cluster: Cluster, role: str) -> float:
    c = cluster.counters(role)
    return c.kv_blocks_used / c.kv_blocks_total if c.kv_blocks_total else 0.0
