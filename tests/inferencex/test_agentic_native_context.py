"""An agentic-coding point whose launch names no context length serves the model's native one.

InferenceX's agentic scripts start their servers with no `--max-model-len` /
`--context-length` (benchmark_lib.sh unsets MAX_MODEL_LEN), so the engine serves the model's
own context and the trace corpus's long prompts (up to ~256k tokens, ~990k for the 1M
families) are accepted. The simulated engine built from such a point's packaged spec does the
same: a prompt far beyond the old fixed 32768 runs to completion.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_inferbench.recipe.launch import resolve
from pytest_inferbench.recipe.model import ServerConfig
from pytest_inferbench.recipe.schema import load_recipe
from pytest_inferbench.sim import catalog
from pytest_inferbench.sim.args import engine_config_from_argv
from pytest_inferbench.sim.engine import Engine

CONTEXT_FLAGS = ("--max-model-len", "--context-length", "--max-seq-len")
OUTPUT = 16


def agentic_server(top: Path, master: str, config_key: str) -> ServerConfig:
    recipe = load_recipe(top / "configs" / master, strict=False)
    return next(s for s in recipe.servers
                if s.config_key == config_key and s.scenario == "agentic-coding"
                and not s.multinode and s.offloading == "none")


# Prompts within the corpus each model replays: DeepSeek-V4 the full one (1M family, prompts up
# to ~990k), Qwen3.5 the 256k-capped one.
@pytest.mark.parametrize(("master", "config_key", "prompt"), [
    ("amd-master.yaml", "dsv4-fp4-mi355x-vllm-agentic", 500_000),
    ("nvidia-master.yaml", "qwen3.5-fp8-b200-sglang-agentic", 200_000),
])
def test_an_agentic_point_without_a_context_flag_takes_a_prompt_over_32k(
        master: str, config_key: str, prompt: int, inferencex_current_dir: Path,
        tmp_path: Path) -> None:
    server = agentic_server(inferencex_current_dir, master, config_key)
    spec = resolve(server, tmp_path / "no-local-launch-dir")
    argv = spec.argv_for_port(8000)
    assert not [w for w in argv if w.split("=")[0] in CONTEXT_FLAGS], argv
    config, _ = engine_config_from_argv(
        argv, hardware=server.hardware, env=spec.env_dict,
        framework=spec.framework or server.framework, files=dict(spec.files))
    assert config.max_model_len == catalog.checkpoint(config.model).context
    engine = Engine(config)
    engine.add_request(0, prompt, OUTPUT)  # the old fixed 32768 refused it here
    emitted = 0
    finished: list[int] = []
    while engine.has_work():
        result = engine.step()
        emitted += sum(n for _, n in result.emitted)
        finished += result.finished
    assert (finished, emitted) == ([0], OUTPUT)


def test_a_multinode_agentic_deployments_workers_serve_the_native_context(
        inferencex_current_dir: Path, tmp_path: Path) -> None:
    # A deployment of roles sizes its workers' `{max_model_len}` from ISL/OSL for fixed-length
    # points; an agentic point's workers take the model's native context, as single-node
    # agentic servers do.
    servers = [s for master in ("amd-master.yaml", "nvidia-master.yaml")
               for s in load_recipe(inferencex_current_dir / "configs" / master,
                                    strict=False).servers if s.multinode]
    sized: dict[str, list[str]] = {}  # launch file -> a fixed-length worker's context words
    for server in (s for s in servers if s.scenario == "fixed-seq-len"):
        spec = resolve(server, tmp_path / "no-local-launch-dir")
        words = [w for role in spec.roles for w in role.argv if w in CONTEXT_FLAGS]
        if words:
            sized.setdefault(spec.launch_file.name, words)
    checked = []
    for server in (s for s in servers if s.scenario == "agentic-coding"):
        spec = resolve(server, tmp_path / "no-local-launch-dir")
        if spec.launch_file.name not in sized:
            continue
        flags = [f"{role.name}: {w}" for role in spec.roles for w in role.argv
                 if w.split("=")[0] in CONTEXT_FLAGS]
        assert not flags, f"{server.node_name}: {flags}"
        checked.append(server.node_name)
    assert checked, sized  # agentic deployments whose fixed-length workers carry a context
