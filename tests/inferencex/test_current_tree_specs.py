"""Every live config of InferenceX's current layout starts on the simulator, without running.

The live master files (`configs/amd-master.yaml`, `configs/nvidia-master.yaml`) are read as
collection reads them; each fixed-seq-len server node, single-node and multinode, must resolve
to a packaged launch spec, name a model and hardware the simulator's catalog knows, pass the
plugin's own speculative-decoding gate on that spec (the chat template on under MTP) and start
on the sim backend. The llm-d spec is compared with the recipe files its entries name.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from pytest_inferbench.backends.base import ServerStartError, StartContext
from pytest_inferbench.backends.sim import SimBackend
from pytest_inferbench.gates.speculative import speculative_decoding
from pytest_inferbench.recipe.launch import (
    LaunchSpecError,
    ServerSpec,
    packaged_launch_dir,
    resolve,
)
from pytest_inferbench.recipe.model import ServerConfig
from pytest_inferbench.recipe.schema import load_recipe
from pytest_inferbench.sim import catalog

MASTERS = ("amd-master.yaml", "nvidia-master.yaml")


@pytest.fixture(scope="module")
def live_servers(inferencex_current_dir: Path) -> list[ServerConfig]:
    servers: list[ServerConfig] = []
    for name in MASTERS:
        recipe = load_recipe(inferencex_current_dir / "configs" / name, strict=False)
        assert not recipe.invalid_entries, f"{name}: {recipe.invalid_entries}"
        servers += [s for s in recipe.servers if s.scenario == "fixed-seq-len"]
    return servers


def problems_of(server: ServerConfig, spec: ServerSpec) -> list[str]:
    """What keeps the node from starting on the simulator, short of starting it."""
    found = []
    if not spec.launch_file.is_relative_to(packaged_launch_dir()):
        found.append(f"{server.node_name}: spec {spec.launch_file} is not the package's")
    for lookup, name in ((catalog.checkpoint, server.model), (catalog.hardware, server.hardware)):
        try:
            lookup(name)
        except catalog.CatalogError as exc:
            found.append(f"{server.node_name}: {exc}")
    if speculative_decoding(server, spec) is not None and not spec.client.use_chat_template:
        found.append(f"{server.node_name}: speculative without the chat template "
                     f"({spec.launch_file.name})")
    return found


def start_problems(server: ServerConfig, spec: ServerSpec, ctx: StartContext) -> list[str]:
    try:
        handle = SimBackend().start(server, spec, ctx)
    except ServerStartError as exc:
        return [str(exc)]
    if (handle.config.spec is not None) != server.speculative:
        return [f"{server.node_name}: speculative decoding "
                f"{'missing' if server.speculative else 'unexpected'} ({spec.launch_file.name})"]
    return []


def test_every_live_config_resolves_a_packaged_spec_and_a_catalog_model_and_starts(
        live_servers: list[ServerConfig], tmp_path: Path) -> None:
    assert any(s.multinode for s in live_servers) and any(not s.multinode for s in live_servers)
    ctx = StartContext(results_dir=tmp_path, run_id="t", worker_id="master", options=None)
    failures: list[str] = []
    started: set[tuple[str, str, str, bool]] = set()
    for server in live_servers:
        try:
            spec = resolve(server, tmp_path / "no-local-launch-dir")
        except LaunchSpecError as exc:
            failures.append(str(exc))
            continue
        failures += problems_of(server, spec)
        # One start per spec, model, hardware and spec decoding keeps the test quick; the
        # rows of one such group differ in parallelism and recipe files only.
        group = (spec.launch_file.name, server.model, server.hardware, server.speculative)
        if group not in started:
            started.add(group)
            failures += start_problems(server, spec, ctx)
    assert not failures, "\n".join(failures)


def test_the_llmd_spec_gives_each_role_what_its_recipe_file_gives_it(
        live_servers: list[ServerConfig], inferencex_current_dir: Path, tmp_path: Path) -> None:
    # benchmarks/multi_node/llm-d/server.sh: a role's recipe section sets its TP, whether it
    # runs expert parallel, and extra-args, expanded unquoted after `vllm serve`'s other words
    # (split on whitespace, quotes kept).
    recipes = inferencex_current_dir / "benchmarks" / "multi_node" / "llm-d-recipes"
    servers = [s for s in live_servers if s.framework == "llmd-vllm"]
    assert servers
    for server in servers:
        assert server.prefill is not None
        (word,) = [w for w in server.prefill.additional_settings if w.startswith("CONFIG_FILE=")]
        recipe = yaml.safe_load((recipes / word.partition("=")[2]).read_text())
        roles = {r.name: r for r in resolve(server, tmp_path).roles}
        for name in ("prefill", "decode"):
            section, argv = recipe[name], roles[name].argv
            extra = tuple(section["extra-args"].split())
            assert argv[-len(extra):] == extra, (server.node_name, name)
            assert argv[argv.index("--tensor-parallel-size") + 1] == str(section["tp"])
            assert ("--enable-expert-parallel" in argv) == section["enable-expert-parallel"]
