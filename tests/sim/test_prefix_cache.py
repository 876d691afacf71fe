"""The engine's prefix cache: shared prompt blocks are found, reused without computing them,
evicted least recently used when the cache is too small, and turned off as each framework's
argv says."""

from __future__ import annotations

import random
import sys
import tracemalloc
from dataclasses import replace

import pytest

from pytest_inferbench.loadgen.datasets import parse_dataset
from pytest_inferbench.loadgen.workload import LoadSettings, Workload, build_workload
from pytest_inferbench.results.metrics import summarize
from pytest_inferbench.sim import recency_set
from pytest_inferbench.sim.args import engine_config_from_argv
from pytest_inferbench.sim.config import EngineConfig
from pytest_inferbench.sim.driver import simulate_point
from pytest_inferbench.sim.engine import Engine
from pytest_inferbench.sim.host_cache import HostCache
from pytest_inferbench.sim.prefix_cache import PrefixCache, block_hashes

MODEL = "amd/MiniMax-M3-MXFP4"
PAGE = 64  # the agentic traces' block size, as the engine's page size here
VLLM = ["vllm", "serve", MODEL, "--tensor-parallel-size", "4", "--block-size", str(PAGE)]


def _config(*extra: str) -> EngineConfig:
    config, _ = engine_config_from_argv([*VLLM, *extra], hardware="MI355X")
    return config


def _workload(conc: int) -> Workload:
    load = LoadSettings(dataset=parse_dataset("prefix:4:1024"), prompts_per_conc=12)
    return build_workload(2048, 32, conc, load)


def _reusable_tokens(workload: Workload) -> int:
    """Tokens the measured requests find cached with one request at a time and room for all:
    the leading run of a prompt's blocks that an earlier prompt (the warmup's included) had,
    a block being the group's prefix text or the request's own, and never the last token."""
    seen: set[tuple[object, ...]] = set()
    hits = 0
    for measured, requests in ((False, workload.warmup), (True, workload.requests)):
        for r in requests:
            shared = r.prefix_tokens // PAGE if r.prefix_key is not None else 0
            blocks = [("group", r.prefix_key, j) if j < shared else ("own", r.text_key, j)
                      for j in range(r.input_tokens // PAGE)]
            run = 0
            while run < len(blocks) and blocks[run] in seen:
                run += 1
            if measured:
                hits += min(run, (r.input_tokens - 1) // PAGE) * PAGE
            seen.update(blocks)
    return hits


def test_shared_prefixes_are_found_as_the_workload_shares_them() -> None:
    workload = _workload(conc=1)
    expected = _reusable_tokens(workload)
    engine = Engine(_config(), keep_traces=True)
    metrics = simulate_point(engine.config, workload, engine=engine).server_metrics
    assert expected > 0
    assert metrics["prefix_cache_hits"] == expected
    assert metrics["prefix_cache_queries"] == sum(r.input_tokens for r in workload.requests)
    # Everything released: cached blocks nobody holds count as free.
    assert engine.free_blocks == engine.num_blocks
    assert engine.prefix_cache is not None and engine.prefix_cache.idle_blocks > 0


def test_a_cache_too_small_for_the_groups_misses() -> None:
    """Four groups in turn, room for about one request: by the time a group comes back its
    blocks are the least recently used and were evicted."""
    workload = _workload(conc=1)
    big = _config()
    per_utilization = Engine(big).kv_capacity_tokens / big.gpu_memory_utilization
    longest = max(r.input_tokens + r.output_tokens for r in workload.requests)
    # Capacity is not linear in the utilization (weights come off first): step down to it.
    small = big
    while Engine(small).kv_capacity_tokens > 2 * longest:
        small = replace(small, gpu_memory_utilization=small.gpu_memory_utilization
                        - 0.5 * longest / per_utilization)
    engine = Engine(small, keep_traces=True)
    assert engine.kv_capacity_tokens >= longest
    metrics = simulate_point(small, workload, engine=engine).server_metrics
    assert metrics["prefix_cache_hits"] < _reusable_tokens(workload) / 4
    assert engine.prefix_cache is not None and engine.prefix_cache.evictions > 0
    assert engine.free_blocks == engine.num_blocks


def test_hits_shorten_the_time_to_first_token() -> None:
    workload = _workload(conc=4)

    def mean_ttft(config: EngineConfig) -> tuple[float, dict[str, object]]:
        point = simulate_point(config, workload)
        s = summarize(point.records, duration_s=point.duration_s,
                      num_prompts=len(workload.requests), max_concurrency=4, num_gpus=4)
        return float(s["mean_ttft_ms"]), dict(point.server_metrics)

    cached, with_cache = mean_ttft(_config())
    computed, without = mean_ttft(_config("--no-enable-prefix-caching"))
    assert isinstance(with_cache["prefix_cache_hits"], int) and with_cache["prefix_cache_hits"]
    assert "prefix_cache_hits" not in without
    assert cached < computed


@pytest.mark.parametrize(("argv", "env_files", "enabled"), [
    (VLLM, {}, True),
    ([*VLLM, "--no-enable-prefix-caching"], {}, False),
    (["python3", "-m", "atom.entrypoints.openai_server", "--model", MODEL,
      "--no-enable_prefix_caching"], {}, False),
    (["python3", "-m", "sglang.launch_server", "--model-path", MODEL], {}, True),
    (["python3", "-m", "sglang.launch_server", "--model-path", MODEL, "--disable-radix-cache"],
     {}, False),
    (["trtllm-serve", MODEL, "--config", "x.yml"],
     {"x.yml": "kv_cache_config:\n  enable_block_reuse: false\n"}, False),
    (["trtllm-serve", MODEL, "--config", "x.yml"],
     {"x.yml": "kv_cache_config:\n  tokens_per_block: 64\n"}, True),
])
def test_each_framework_turns_it_off_its_own_way(argv: list[str], env_files: dict[str, str],
                                                 enabled: bool) -> None:
    config, _ = engine_config_from_argv(argv, hardware="MI355X", files=env_files)
    assert config.prefix_caching is enabled


def test_lru_keeps_the_most_recently_released_blocks() -> None:
    cache = PrefixCache()
    assert cache.insert([1, 2, 3]) == (0, 0)
    assert cache.insert([4, 5]) == (0, 0)
    assert cache.release([1, 2, 3]) == 3  # first released: first evicted
    assert cache.release([4, 5]) == 2
    assert cache.match([1, 2, 3, 9]) == 3
    cache.trim(3)  # an allocation took the room of two idle blocks
    assert cache.evictions == 2
    assert cache.match([1, 2, 3]) == 0 and cache.match([4, 5]) == 2
    assert cache.acquire([4, 5]) == 2 and cache.idle_blocks == 1  # 3 stays, idle
    cache.trim(0)  # pinned blocks are never evicted
    assert cache.match([4, 5]) == 2 and cache.idle_blocks == 0 and cache.evictions == 3


def test_a_block_woken_and_released_again_is_the_most_recent_and_evictions_go_to_dram_oldest_first(
) -> None:
    host = HostCache(capacity_blocks=10)
    cache = PrefixCache(host)
    cache.insert([1, 2, 3, 4])
    assert cache.release([1, 2, 3, 4]) == 4  # idle, oldest first: 1 2 3 4
    assert cache.acquire([1, 2]) == 2  # woken: out of the idle order
    assert cache.insert([1, 2, 5]) == (2, 0)  # 1 and 2 pinned twice now, 5 new
    assert cache.release([1, 2, 5]) == 1  # only 5 has no holder left: idle 3 4 5
    assert cache.release([1, 2]) == 2  # idle 3 4 5 1 2
    cache.trim(2)
    assert cache.evictions == 3 and host.written_blocks == 3
    assert host.match([3, 4, 5]) == 3 and host.match([1]) == 0
    assert cache.match([1, 2]) == 2 and cache.match([3]) == 0


def test_a_prompt_whose_first_block_was_evicted_hits_nothing_though_later_blocks_stay() -> None:
    cache = PrefixCache()
    assert cache.match([1, 2, 3]) == 0
    cache.insert([1, 2, 3])
    assert cache.match([1, 2, 3, 4]) == 3  # a leading run: all of it
    cache.release([1, 2, 3])
    cache.trim(2)  # the oldest idle block, the first one, makes room
    assert cache.evictions == 1
    assert cache.match([1, 2, 3]) == 0  # blocks 2 and 3 are resident but follow a miss


class _BlockByBlock:
    """The cache's rules spelled out one block at a time (the reference the bulk steps of
    `PrefixCache` must agree with)."""

    def __init__(self) -> None:
        self.refs: dict[int, int] = {}
        self.idle: list[int] = []  # least recent first
        self.evictions = 0

    def match(self, hashes: list[int]) -> int:
        n = 0
        while n < len(hashes) and (hashes[n] in self.refs or hashes[n] in self.idle):
            n += 1
        return n

    def pin(self, hashes: list[int]) -> tuple[int, int]:
        present = woken = 0
        for h in hashes:
            if h in self.idle:
                self.idle.remove(h)
                woken += 1
            present += h in self.refs or h in self.idle
            self.refs[h] = self.refs.get(h, 0) + 1
        return present + woken, woken

    def release(self, hashes: list[int]) -> int:
        freed = 0
        for h in hashes:
            self.refs[h] -= 1
            if not self.refs[h]:
                del self.refs[h]
                self.idle.append(h)
                freed += 1
        return freed

    def trim(self, free: int) -> None:
        while len(self.idle) > max(free, 0):
            self.idle.pop(0)
            self.evictions += 1


def test_requests_sharing_prefixes_pin_release_and_evict_as_block_by_block() -> None:
    # Prompts as the engine sees them: each block's hash stands for all blocks before it (a
    # path in a small tree of shared prefixes), a request pins the leading run it finds and
    # caches the rest, releases all of it, and allocations evict idle blocks in between.
    rng = random.Random(7)
    paths = [[hash((t, b)) for b in range(rng.randrange(1, 12))] for t in range(3)]
    for _ in range(12):  # branches: a shared head, then blocks of its own
        head = rng.choice(paths)[:rng.randrange(1, 6)]
        paths.append(head + [hash((len(paths), b)) for b in range(rng.randrange(1, 8))])
    cache, ref = PrefixCache(), _BlockByBlock()
    running: list[tuple[list[int], int]] = []
    for _ in range(400):
        if running and rng.random() < 0.45:
            hashes, held = running.pop(rng.randrange(len(running)))
            assert cache.release(hashes[:held]) == ref.release(hashes[:held])
        else:
            hashes = rng.choice(paths)[:]
            hit = cache.match(hashes)
            assert hit == ref.match(hashes)
            assert cache.acquire(hashes[:hit]) == ref.pin(hashes[:hit])[1]
            assert cache.insert(hashes, hit) == ref.pin(hashes[hit:])
            running.append((hashes, len(hashes)))
        if rng.random() < 0.3:
            free = rng.randrange(0, 30)
            cache.trim(free)
            ref.trim(free)
        assert (cache.idle_blocks, cache.evictions) == (len(ref.idle), ref.evictions)
    assert ref.evictions > 0 and running


class _HostByBlock:
    """The DRAM tier's rules one block at a time: least recently used first."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.lru: list[int] = []
        self.written = self.evictions = 0

    def store(self, hashes: list[int]) -> None:
        if not self.capacity:  # no tier
            return
        for h in hashes:
            if h in self.lru:
                self.lru.remove(h)
                self.lru.append(h)
                continue
            self.lru.append(h)
            self.written += 1
            if len(self.lru) > self.capacity:
                self.lru.pop(0)
                self.evictions += 1


@pytest.mark.parametrize("seed", range(4))
def test_evicted_heads_cached_again_reach_their_resident_tails_as_block_by_block(
        seed: int) -> None:
    # A small tree of long prompts and a small cache: evictions take heads of runs and leave
    # their tails resident; a request that computes the head again pins the tail as present,
    # and what HBM lets go of reaches DRAM in the same order.
    rng = random.Random(seed)
    paths = [[hash((seed, t, b)) for b in range(rng.randrange(4, 40))] for t in range(3)]
    for _ in range(10):
        head = rng.choice(paths)[:rng.randrange(1, 30)]
        paths.append(head + [hash((seed, len(paths), b)) for b in range(rng.randrange(1, 20))])
    host = HostCache(capacity_blocks=60)
    cache, ref, ref_host = PrefixCache(host), _BlockByBlock(), _HostByBlock(60)
    running: list[tuple[list[int], int]] = []
    for _ in range(300):
        if running and rng.random() < 0.5:
            hashes, held = running.pop(rng.randrange(len(running)))
            assert cache.release(hashes[:held]) == ref.release(hashes[:held])
        else:
            hashes = rng.choice(paths)[:]
            hit = cache.match(hashes)
            assert hit == ref.match(hashes)
            assert cache.acquire(hashes[:hit]) == ref.pin(hashes[:hit])[1]
            assert cache.insert(hashes, hit) == ref.pin(hashes[hit:])
            running.append((hashes, len(hashes)))
        if rng.random() < 0.5:
            free = rng.randrange(0, 40)
            idle_before = list(ref.idle)
            cache.trim(free)
            ref.trim(free)
            ref_host.store(idle_before[:len(idle_before) - len(ref.idle)])
        assert (cache.idle_blocks, cache.evictions) == (len(ref.idle), ref.evictions)
    assert (host.written_blocks, host.evictions) == (ref_host.written, ref_host.evictions)
    assert [host.match([h]) for p in paths for h in p] == \
        [int(h in ref_host.lru) for p in paths for h in p]
    assert ref.evictions > 0 and ref_host.evictions > 0


def test_a_prompt_of_one_token_pages_is_kept_as_one_run_not_block_by_block() -> None:
    # SGLang's page size 1: a prompt of thousands of blocks. Caching, releasing and pinning it
    # again keeps about a copy of its hashes (one reference a block), not a table entry each.
    hashes = block_hashes([f"w{i}" for i in range(20_000)], 1)
    cache = PrefixCache()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        assert cache.insert(hashes) == (0, 0)
        assert cache.release(hashes) == len(hashes)
        assert cache.acquire(hashes[:len(hashes) // 2]) == len(hashes) // 2
        kept = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert cache.match(hashes) == len(hashes)
    assert kept < 1.5 * sys.getsizeof(hashes)


@pytest.mark.parametrize("settle_from", [None, 8])
@pytest.mark.parametrize("capacity", [0, 1, 50, 119, 200])
def test_the_dram_tier_stores_loads_and_evicts_as_block_by_block(
        capacity: int, settle_from: int | None, monkeypatch: pytest.MonkeyPatch) -> None:
    # Batches of blocks as HBM writes them through, evicts them and loads them back: new ones,
    # ones here already, both, and a block twice, long enough for the tier to tidy its order
    # (119 of the 120 blocks: it fills late; 200: only once new blocks follow, after thousands
    # of uses while it could not evict yet). `settle_from` 8: while it has room, its blocks
    # are kept in the numpy table, as a tier of millions is.
    if settle_from is not None:
        monkeypatch.setattr(recency_set, "SETTLE_FROM", settle_from)
    rng = random.Random(capacity)
    host, ref = HostCache(capacity_blocks=capacity), _HostByBlock(capacity)
    for _ in range(3000):
        batch = [rng.randrange(120) for _ in range(rng.randrange(1, 12))]
        if rng.random() < 0.3 and ref.lru:
            here = ref.lru[-rng.randrange(1, len(ref.lru) + 1):]
            batch = rng.sample(here, min(len(here), 6))
            if rng.random() < 0.5:
                assert host.match(batch) == len(batch)
                host.load(batch)
                ref.store(batch)  # a load uses them as a store of blocks here does
                continue
        host.store_many(batch)
        ref.store(batch)
        assert (host.used_blocks, host.written_blocks, host.evictions) == \
            (len(ref.lru), ref.written, ref.evictions)
    assert [host.match([h]) for h in range(120)] == [int(h in ref.lru) for h in range(120)]
    # The whole order of use: new blocks, one at a time, evict the rest least recent first.
    for h in range(1000, 1000 + capacity):
        host.store(h)
        ref.store([h])
        assert [host.match([b]) for b in range(120)] == [int(b in ref.lru) for b in range(120)]
    assert (host.used_blocks, host.written_blocks, host.evictions) == \
        (len(ref.lru), ref.written, ref.evictions)
    assert capacity == 0 or ref.evictions > 0


class _Block(int):
    """A block hash that counts its look-ups in a table (each hashes it once)."""

    lookups = 0

    def __hash__(self) -> int:
        _Block.lookups += 1
        return int.__hash__(self)


def test_a_dram_tier_with_room_looks_each_block_up_once_a_store_and_never_on_a_load() -> None:
    # Most dram points never fill their tier: while it has room, a block written through, let
    # go of by HBM (here already: used) and loaded back costs one table look-up a store (one
    # in millions of blocks is a cache miss, the tier's whole cost), a load none.
    host = HostCache(capacity_blocks=10_000)
    prompt = [_Block(h) for h in range(3_000, 3_500)]
    _Block.lookups = 0
    host.store_many(prompt)
    written = _Block.lookups
    host.store_many(prompt)
    used = _Block.lookups - written
    assert host.match(prompt) == len(prompt)
    _Block.lookups = 0
    host.load(prompt)
    assert (written, used, _Block.lookups) == (len(prompt), len(prompt), 0)
    assert (host.written_blocks, host.loaded_blocks, host.used_blocks) == (500, 500, 500)
