"""The CPU-DRAM KV tier (`kv-offloading: dram`): sized from each offload backend's own launch
flags, filled with the blocks HBM evicts, read back at the host link's bandwidth, evicted least
recently used; every agentic launch of InferenceX's current tree parses and simulates."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_inferbench.recipe.agentic import MAX_AVAILABLE_CPU_DRAM_MIB
from pytest_inferbench.recipe.launch import LaunchSpecError, packaged_launch_dir, resolve
from pytest_inferbench.recipe.model import ServerConfig, hardware_for_runner
from pytest_inferbench.recipe.schema import load_recipe
from pytest_inferbench.sim import catalog
from pytest_inferbench.sim.args import ArgvError, engine_config_from_argv
from pytest_inferbench.sim.config import KVOffload
from pytest_inferbench.sim.engine import Engine, EngineCounters
from pytest_inferbench.sim.host_cache import HostCache

CURRENT = Path(__file__).resolve().parents[3] / "shared" / "inferencex-0801" / "configs"
QWEN = "Qwen/Qwen3.5-397B-A17B-FP8"
PAGE = 64
# SGLang with its KV pool capped at 400 pages: a handful of long agentic prompts overflow it.
SGLANG = ["python3", "-m", "sglang.launch_server", "--model-path", QWEN, "--tp", "8",
          "--page-size", str(PAGE), "--max-total-tokens", str(400 * PAGE)]
HICACHE = ["--enable-hierarchical-cache", "--hicache-size", "100"]
GB, GIB = 10**9, 2**30


def _engine(*extra: str, hardware: str = "B200") -> Engine:
    config, _ = engine_config_from_argv([*SGLANG, *extra], hardware=hardware)
    return Engine(config)


def _replay(engine: Engine, rounds: int = 3, sessions: int = 4) -> tuple[float, EngineCounters]:
    """Agentic-like turns one at a time: each session's prompt grows by a few pages a round, so
    every turn past the first repeats its session's earlier prompt. Four sessions of ~150
    pages do not fit the 400-page pool: by its next turn a session's blocks were evicted."""
    elapsed, rid = 0.0, 0
    for turn in range(rounds):
        for session in range(sessions):
            pages = tuple(range(session * 10_000, session * 10_000 + 150 + 10 * turn))
            engine.add_request(rid, len(pages) * PAGE + 10, 20, block_hashes=pages)
            rid += 1
            while engine.has_work():
                elapsed += engine.step().duration_s
    return elapsed, engine.counters()


def test_without_a_tier_a_full_hbm_recomputes_and_with_one_dram_serves_the_hits() -> None:
    plain_s, plain = _replay(_engine())
    tier_s, tier = _replay(_engine(*HICACHE))
    assert plain.prefix_cache_hits == 0 and not plain.host_tier  # HBM too small to keep any
    assert tier.host_tier and tier.host_cache_hits > 0
    assert tier.prefix_cache_hits + tier.host_cache_hits <= tier.prefix_cache_queries
    assert tier.offload_bytes_written > 0 and tier.offload_bytes_read > 0
    # What was read back is what was hit, in whole pages of the engine's KV bytes.
    engine = _engine(*HICACHE)
    assert tier.offload_bytes_read == pytest.approx(
        tier.host_cache_hits / PAGE * engine.block_bytes, rel=1e-9)
    assert tier_s < plain_s  # loading the hits back beats computing them again


def test_a_load_back_costs_the_bytes_over_the_host_link() -> None:
    """Same bytes on a B200 (PCIe Gen5 x16) and a GB200 (NVLink-C2C to Grace): the copies take
    as much longer as the link is slower."""
    _, pcie = _replay(_engine(*HICACHE, hardware="B200"))
    _, c2c = _replay(_engine(*HICACHE, hardware="GB200"))
    assert pcie.offload_bytes_read == c2c.offload_bytes_read > 0
    ratio = (catalog.hardware("GB200").host_link_bytes_per_s
             / catalog.hardware("B200").host_link_bytes_per_s)
    assert ratio > 1
    assert pcie.offload_seconds_read == pytest.approx(c2c.offload_seconds_read * ratio)


def test_write_back_copies_only_what_hbm_evicts() -> None:
    _, through = _replay(_engine(*HICACHE))
    _, back = _replay(_engine(*HICACHE, "--hicache-write-policy", "write_back"))
    assert 0 < back.offload_bytes_written < through.offload_bytes_written
    assert back.host_cache_hits == through.host_cache_hits  # the same blocks reach DRAM


def test_a_dram_tier_too_small_for_the_working_set_evicts_its_least_recent_blocks() -> None:
    cache = HostCache(capacity_blocks=3)
    for h in (1, 2, 3):
        cache.store(h)
    cache.load([1])  # 1 is used again: 2 is now the least recent
    cache.store(4)
    assert cache.match([1]) == 1 and cache.match([2]) == 0 and cache.match([3, 4]) == 2
    assert (cache.written_blocks, cache.loaded_blocks, cache.evictions) == (4, 1, 1)
    # A tier of one session's size serves fewer hits than one that holds them all.
    small_gb = 150 * _engine(*HICACHE).block_bytes / GB
    _, small = _replay(_engine("--enable-hierarchical-cache", "--hicache-size", f"{small_gb}"))
    _, large = _replay(_engine(*HICACHE))
    assert small.host_cache_hits < large.host_cache_hits


def _offload(*argv: str, env: dict[str, str] | None = None,
             framework: str = "vllm") -> KVOffload | None:
    head = (["vllm", "serve", QWEN] if framework == "vllm"
            else ["python3", "-m", "sglang.launch_server", "--model-path", QWEN])
    config, _ = engine_config_from_argv([*head, "--tensor-parallel-size", "4", *argv],
                                        hardware="B300", env=env)
    return config.kv_offload


def _transfer(connector: str, **extra: object) -> list[str]:
    return ["--kv-transfer-config", json.dumps({"kv_connector": connector, "kv_role": "kv_both",
                                                "kv_connector_extra_config": extra})]


@pytest.mark.parametrize(("argv", "env", "framework", "expected"), [
    # SGLang: GB per rank; without a size, the host pool is a multiple of the HBM pool.
    (["--enable-hierarchical-cache", "--hicache-size", "299"], None, "sglang",
     KVOffload("hicache", bytes_per_rank=299 * GB)),
    (["--enable-hierarchical-cache", "--hicache-ratio", "8"], None, "sglang",
     KVOffload("hicache", hbm_ratio=8.0)),
    (["--enable-hierarchical-cache"], None, "sglang", KVOffload("hicache", hbm_ratio=2.0)),
    # vLLM's simple connector: per rank, or a total over the 4 TP ranks; lazy = on eviction.
    (_transfer("SimpleCPUOffloadConnector", cpu_bytes_to_use_per_rank=10**11), None, "vllm",
     KVOffload("vllm-simple", bytes_per_rank=10**11)),
    (_transfer("SimpleCPUOffloadConnector", cpu_bytes_to_use=4 * 10**11, lazy_offload=True),
     None, "vllm", KVOffload("vllm-simple", bytes_per_rank=10**11, write_through=False)),
    (_transfer("MooncakeStoreConnector"), {"MOONCAKE_GLOBAL_SEGMENT_SIZE": "299GB"}, "vllm",
     KVOffload("mooncake", bytes_per_rank=299 * GIB)),
    (_transfer("LMCacheConnectorV1"), {"LMCACHE_MAX_LOCAL_CPU_SIZE": "40"}, "vllm",
     KVOffload("lmcache", bytes_per_rank=40 * GIB)),
    (["--kv-offloading-backend", "native", "--kv-offloading-size", "1199"], None, "vllm",
     KVOffload("vllm-native", bytes_per_rank=1199 * GIB // 4)),
    (_transfer("NixlConnector"), None, "vllm", None),  # moves KV between instances: no tier
])
def test_each_backend_flag_sizes_the_tier_as_its_framework_reads_it(
        argv: list[str], env: dict[str, str] | None, framework: str,
        expected: KVOffload | None) -> None:
    assert _offload(*argv, env=env, framework=framework) == expected


def test_tensorrt_llm_host_cache_size_is_bytes_per_rank_written_on_eviction() -> None:
    options = "kv_cache_config:\n  host_cache_size: 214748364800\n  enable_block_reuse: true\n"
    config, _ = engine_config_from_argv(
        ["trtllm-serve", "nvidia/MiniMax-M3-NVFP4", "--tp_size", "8",
         "--extra_llm_api_options", "options.yaml"],
        hardware="B200", files={"options.yaml": options})
    assert config.kv_offload == KVOffload("native", bytes_per_rank=200 * GIB,
                                          write_through=False)


@pytest.mark.parametrize(("argv", "env", "message"), [
    (_transfer("MooncakeStoreConnector"), None, "MooncakeStoreConnector: no DRAM size"),
    (["--kv-transfer-config", "{not json"], None, "--kv-transfer-config: not JSON"),
    (["--kv-offloading-size", "x", "--kv-offloading-backend", "native"], None,
     "--kv-offloading-size: 'x' is not a number"),
    (_transfer("SomeOtherConnector"), None, "kv_connector 'SomeOtherConnector' is not modelled"),
])
def test_an_unreadable_offload_launch_says_which_flag(argv: list[str], env: dict[str, str] | None,
                                                      message: str) -> None:
    with pytest.raises(ArgvError, match=message):
        _offload(*argv, env=env)


def _agentic_servers() -> list[ServerConfig]:
    if not (CURRENT / "nvidia-master.yaml").is_file():
        pytest.skip(f"no InferenceX checkout of the current layout at {CURRENT}")
    servers: dict[object, ServerConfig] = {}
    for vendor in ("nvidia", "amd"):
        for server in load_recipe(CURRENT / f"{vendor}-master.yaml").servers:
            if server.scenario == "agentic-coding" and not server.multinode:
                servers.setdefault(server.identity, server)
    return list(servers.values())


def test_every_agentic_launch_of_the_current_tree_parses_and_simulates(tmp_path: Path) -> None:
    """Each single-node agentic server of InferenceX's current master files (dram and not):
    its packaged launch spec with the offload flags of its backend parses, and its engine,
    a dram one with a tier of its `total-cpu-dram-gb` split over its TP ranks, serves a few
    repeated prompts."""
    simulated = dram = 0
    missing_specs = []
    for server in _agentic_servers():
        try:
            spec = resolve(server, tmp_path)  # no local launch directory: the packaged specs
        except LaunchSpecError:
            missing_specs.append(server.launch_spec_name)
            continue
        hardware = hardware_for_runner(server.runner)
        assert hardware is not None, server.runner
        config, _ = engine_config_from_argv(spec.argv, hardware=hardware, env=dict(spec.env),
                                            files=dict(spec.files))
        engine = Engine(config)
        assert (config.kv_offload is not None) == (server.offloading == "dram"), server.node_name
        if server.offloading == "dram":
            dram += 1
            assert server.total_cpu_dram_gb  # InferenceX's budget, from runners.yaml
            per_rank = server.total_cpu_dram_gb * GB / server.parallel.tp
            # Each backend's unit (GB, GiB) and rounding keep it within 8 % of the budget.
            assert config.kv_offload.bytes_per_rank == pytest.approx(per_rank, rel=0.08)
            assert engine.host_cache is not None and engine.host_cache.capacity_blocks > 0
        # Two sessions, each sending its prompt twice, within the spec's context length.
        tokens = min(8 * engine.block_size, config.max_model_len // 2)
        for rid in range(4):
            pages = range((rid // 2) * 1000, (rid // 2) * 1000 + tokens // engine.block_size)
            engine.add_request(rid, tokens, 4, block_hashes=tuple(pages))
        while engine.has_work():
            engine.step()
        assert engine.counters().requests_finished == 4, server.node_name
        simulated += 1
    assert dram and simulated > dram
    # A server without a packaged launch spec has none to parse (every one of them named).
    assert all(not (packaged_launch_dir() / f"{name}.yaml").exists() for name in missing_specs)


RECIPE = """\
qwen3.5-fp8-b200-sglang-agentic:
  image: lmsysorg/sglang:v0.5.16-cu130
  model: Qwen/Qwen3.5-397B-A17B-FP8
  model-prefix: qwen3.5
  runner: cluster:b200-dgxc
  precision: fp8
  framework: sglang
  multinode: false
  scenarios:
    agentic-coding:
    - dram-utilization: 0.80
      search-space:
      - { tp: 4, kv-offloading: dram, kv-offload-backend: { name: hicache }, conc-list: [16] }
"""


def test_the_dram_budget_reaches_the_engine_as_inferencex_sizes_it(tmp_path: Path) -> None:
    """qwen3.5 fp8 on B200 at TP4 with hicache: total-cpu-dram-gb is the capped node DRAM x
    dram-utilization x 4 of 8 GPUs (runners.yaml's 3,095,781 MiB capped at 2,861,022), and
    SGLang's --hicache-size is that in GB over the 4 ranks."""
    (tmp_path / "nvidia-master.yaml").write_text(RECIPE, encoding="utf-8")
    (tmp_path / "runners.yaml").write_text(
        "hardware:\n  cluster:b200-dgxc: { available-cpu-dram-mib: 3095781, gpus-per-node: 8 }\n",
        encoding="utf-8")
    (server,) = load_recipe(tmp_path / "nvidia-master.yaml").servers
    total = int(MAX_AVAILABLE_CPU_DRAM_MIB * 2**20 * 0.8 * 4 / 8 / GB)
    assert server.total_cpu_dram_gb == total
    spec = resolve(server, tmp_path)
    config, _ = engine_config_from_argv(spec.argv, hardware="B200", env=dict(spec.env))
    assert config.prefix_caching  # the tier extends the radix cache the spec turned off
    assert config.kv_offload == KVOffload("hicache", bytes_per_rank=(total // 4) * GB)


def test_a_dram_point_without_a_budget_is_refused_naming_runners_yaml(tmp_path: Path) -> None:
    (tmp_path / "nvidia-master.yaml").write_text(RECIPE, encoding="utf-8")
    (server,) = load_recipe(tmp_path / "nvidia-master.yaml").servers
    with pytest.raises(LaunchSpecError, match=r"needs total-cpu-dram-gb: no runners\.yaml"):
        resolve(server, tmp_path)
