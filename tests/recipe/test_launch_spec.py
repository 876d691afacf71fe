"""Launch specs resolve to one immutable ServerSpec per node: overlays, placeholders, errors."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from test_agentic_entries import write

from pytest_inferbench.backends.base import StartContext
from pytest_inferbench.backends.docker import run_kwargs
from pytest_inferbench.options import Settings
from pytest_inferbench.recipe.launch import LaunchSpecError, resolve
from pytest_inferbench.recipe.model import ServerConfig
from pytest_inferbench.recipe.schema import load_recipe
from pytest_inferbench.testing.recipes import master_entry

REPO_LAUNCH = Path(__file__).resolve().parents[2] / "benchmarks" / "launch"
ROWS = [
    "{ tp: 4, conc-list: [1] }",
    "{ tp: 4, spec-decoding: mtp, conc-list: [1] }",
    "{ tp: 8, ep: 8, dp-attn: true, conc-list: [1] }",
]


def servers(tmp_path: Path, framework: str = "atom") -> dict[str, ServerConfig]:
    """The nodes of ROWS: plain TP4, TP4 with EAGLE3, TP8 with EP and DP attention."""
    path = tmp_path / "amd-master.yaml"
    path.write_text(master_entry(f"minimaxm3-fp4-mi355x-{framework}", ROWS, framework=framework))
    return dict(zip(("tp4", "mtp", "dpa"), load_recipe(path).servers, strict=True))


def test_shipped_atom_spec_and_its_overlays(tmp_path: Path) -> None:
    nodes = servers(tmp_path)
    plain = resolve(nodes["tp4"], REPO_LAUNCH)
    assert plain.argv[:3] == ("python3", "-m", "atom.entrypoints.openai_server")
    assert plain.argv[plain.argv.index("--model") + 1] == "amd/MiniMax-M3-MXFP4"
    assert plain.argv[plain.argv.index("-tp") + 1] == "4"
    assert "--method" not in plain.argv and not plain.client.use_chat_template
    assert plain.env_dict["AITER_QUICK_REDUCE_QUANTIZATION"] == "INT4"
    assert (plain.gpu_count, plain.served_model, plain.hardware) == (4, "amd/MiniMax-M3-MXFP4",
                                                                     "MI355X")
    assert plain.argv_for_port(9123)[plain.argv.index("--server-port") + 1] == "9123"

    # The overlays' words go where the spec's {overlays} mark stands: after -tp, as the scripts.
    after_tp = plain.argv.index("-tp") + 2
    mtp = resolve(nodes["mtp"], REPO_LAUNCH)
    spec_words = ("--method", "eagle3", "--draft-model", "Inferact/MiniMax-M3-EAGLE3",
                  "--num-speculative-tokens", "3")
    assert mtp.argv == plain.argv[:after_tp] + spec_words + plain.argv[after_tp:]
    assert mtp.client.use_chat_template  # EAGLE acceptance is measured on chat-framed prompts

    dpa = resolve(nodes["dpa"], REPO_LAUNCH)
    assert dpa.argv[dpa.argv.index("-tp") + 1] == "8"
    assert dpa.argv[after_tp:after_tp + 2] == ("--enable-expert-parallel", "--enable-dp-attention")
    assert "{overlays}" not in dpa.argv and "{overlays}" not in plain.argv


def test_json_arguments_keep_their_braces(tmp_path: Path) -> None:
    spec = resolve(servers(tmp_path, "vllm")["mtp"], REPO_LAUNCH)
    config = json.loads(spec.argv[spec.argv.index("--speculative-config") + 1])
    assert config == {"method": "eagle3", "model": "Inferact/MiniMax-M3-EAGLE3",
                      "num_speculative_tokens": 3}


def write_spec(tmp_path: Path, text: str) -> Path:
    launch = tmp_path / "launch"
    launch.mkdir(exist_ok=True)
    (launch / "minimaxm3_fp4_mi355x_atom.yaml").write_text(text)
    return launch


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("command: [srv]\nflags: [x]\n", "flags: unknown key (expected one of: image, command,"),
        ("args: [--x]\n", "command: empty (expected the server program as a list)"),
        ("command: srv --port 1\n", "command: expected a list of strings (argv words)"),
        ("command: [srv]\nenv: [A=1]\n", "env: expected a mapping of names to values"),
        ("command: [srv]\noverlays: {eagle: {args: [x]}}\n",
         "overlays.eagle: unknown key (expected one of: ep, dp-attn-ep, dp-attn, mtp)"),
        ("command: [srv]\nargs: ['{overlays}', -x, '{overlays}']\n",
         "args: {overlays} given 2 times (expected once: where the overlays' words go)"),
        ("command: [srv]\nmounts: [/models]\n",
         "mounts: '/models' (expected host:container[:ro|rw])"),
        ("command: [srv]\nmounts: ['/a:/b:rx']\n",
         "mounts: '/a:/b:rx' (expected host:container[:ro|rw])"),
        ("command: [srv\n", "YAML syntax error"),
        ("command: [srv]\nagentic: {flags: [x]}\n",
         "agentic.flags: unknown key (expected one of: args, env, drop, overlays)"),
        ("command: [srv]\nagentic: {overlays: {eagle: {args: [x]}}}\n",
         "agentic.overlays.eagle: unknown key (expected one of: ep, dp-attn-ep, dp-attn, mtp, "
         "dcp)"),
        ("command: [srv]\nagentic: {overlays: {mtp: {client: {}}}}\n",
         "agentic.overlays.mtp.client: unknown key (expected one of: args, env, drop)"),
        ("command: [srv]\nagentic: {overlays: {mtp: {drop: --x}}}\n",
         "agentic.overlays.mtp.drop: expected a list of strings (argv words)"),
        ("command: [srv]\ntokenizer: [a]\n", "tokenizer: ['a'] (expected a path or model name"),
    ],
)
def test_bad_launch_specs_name_the_file_and_key(tmp_path: Path, text: str, message: str) -> None:
    launch = write_spec(tmp_path, text)
    with pytest.raises(LaunchSpecError) as info:
        resolve(servers(tmp_path)["tp4"], launch)
    assert str(info.value).startswith(f"{launch / 'minimaxm3_fp4_mi355x_atom.yaml'}: ")
    assert message in str(info.value)


AGENTIC_SPEC = """\
command: [srv]
args: [--context-length, '{max_model_len}', --disable-radix-cache, --chunked-prefill-size, '8192',
       --tp, '{tp}']
env: {A: '1'}
agentic:
  drop: [--chunked-prefill-size]
  args: [--chunked-prefill-size, '32768', --enable-metrics]
  env: {B: '2'}
"""


def test_an_agentic_point_gets_native_context_its_prefix_cache_and_its_section(
        tmp_path: Path) -> None:
    # The same spec serves a fixed-seq-len entry and an agentic one of the same config name.
    launch = tmp_path / "launch"
    launch.mkdir()
    (launch / "qwen3.5_fp8_b200_sglang.yaml").write_text(AGENTIC_SPEC)
    (tmp_path / "recipes").mkdir()
    agentic = load_recipe(write(tmp_path / "recipes")).servers[0]
    fixed = master_entry("qwen3.5-fp8-b200-sglang", ["{ tp: 8, conc-list: [1] }"],
                         model="Qwen/Qwen3.5-397B-A17B-FP8", model_prefix="qwen3.5",
                         runner="b200", precision="fp8", framework="sglang")
    (tmp_path / "nvidia-master.yaml").write_text(fixed)
    plain = load_recipe(tmp_path / "nvidia-master.yaml").servers[0]
    assert plain.launch_spec_name == agentic.launch_spec_name

    spec = resolve(agentic, launch)
    # No context flag (the engine's native one), SGLang's radix cache on, the section's budget.
    assert spec.argv == ("srv", "--tp", "8", "--chunked-prefill-size", "32768",
                         "--enable-metrics")
    assert spec.env_dict == {"A": "1", "B": "2"}
    fixed_spec = resolve(plain, launch)
    assert fixed_spec.argv[:5] == ("srv", "--context-length", fixed_spec.argv[2],
                                   "--disable-radix-cache", "--chunked-prefill-size")
    assert "--enable-metrics" not in fixed_spec.argv and "B" not in fixed_spec.env_dict


def test_tokenizer_key_names_where_the_client_loads_the_tokenizer(tmp_path: Path) -> None:
    """A server started with --served-model-name answers under a name no tokenizer has: the
    spec's `tokenizer` (placeholders filled) is what the client loads instead."""
    launch = write_spec(tmp_path, "command: [srv, '{model}', --served-model-name, short]\n"
                                  "served-model: short\ntokenizer: '{model}'\n")
    spec = resolve(servers(tmp_path)["tp4"], launch)
    assert (spec.served_model, spec.tokenizer_source) == ("short", "amd/MiniMax-M3-MXFP4")
    # Without the key, the served name is the tokenizer's, as before.
    plain = resolve(servers(tmp_path)["tp4"], write_spec(tmp_path, "command: [srv]\n"))
    assert plain.tokenizer_source == plain.served_model == "amd/MiniMax-M3-MXFP4"


def test_mounts_reach_the_container_read_only_by_default(
        tmp_path: Path, pytestconfig: pytest.Config) -> None:
    launch = write_spec(tmp_path, "command: [srv, --port, '{port}']\n"
                                  "mounts: ['/srv/models:/models', '/scratch:/scratch:rw']\n")
    server = servers(tmp_path)["tp4"]
    spec = resolve(server, launch)
    assert spec.mounts == ("/srv/models:/models", "/scratch:/scratch:rw")
    settings = dataclasses.replace(Settings.from_config(pytestconfig), gpus=None)
    ctx = StartContext(results_dir=tmp_path, run_id="r1", worker_id="master", options=settings)
    volumes = run_kwargs(server, spec, ctx, 8000)["volumes"]
    assert volumes["/srv/models"] == {"bind": "/models", "mode": "ro"}
    assert volumes["/scratch"] == {"bind": "/scratch", "mode": "rw"}
