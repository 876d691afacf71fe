"""An agentic-coding point's server argv is the one InferenceX's agentic script gives it.

Every single-node agentic node of InferenceX's current master configs that has a packaged launch
spec is resolved as a real server backend resolves it, and its argv is compared with the text
of the agentic script InferenceX runs for it (`benchmarks/single_node/agentic/`, chosen as
InferenceX's runners choose it): the context length the script passes (none: the engine's
default, the model's native context, since benchmark_lib.sh unsets MAX_MODEL_LEN for agentic
scripts), never below the longest prompt of the trace corpus the script replays, and the prefix
cache never turned off. A few configs are compared flag by flag (one with DRAM-offload rows
only by such a row, against the script's branch for its backend), with a checked list of the
flags a spec cannot pass.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import yaml

from pytest_inferbench.changelog.launchers import benchmark_scripts
from pytest_inferbench.frameworks.specdecode import read_speculative_decoding
from pytest_inferbench.recipe.launch import LaunchSpecError, resolve
from pytest_inferbench.recipe.model import ServerConfig
from pytest_inferbench.recipe.schema import load_recipe

MASTERS = ("amd-master.yaml", "nvidia-master.yaml")
CONTEXT_FLAGS = ("--max-model-len", "--context-length")
# What turns the prefix cache off in vLLM / ATOM and in SGLang.
PREFIX_CACHE_OFF = ("--no-enable-prefix-caching", "--disable-radix-cache")
# utils/agentic/datasets/build_weka_hf_dataset.py: the `_256k` corpora drop every request over
# 256,000 tokens, the full corpora every prompt over 990,016; benchmark_lib.sh's
# resolve_trace_source replays the full corpus for these model prefixes, unless the script
# names a loader of its own (WEKA_LOADER_OVERRIDE).
LONGEST_PROMPT_256K = 256_000
LONGEST_PROMPT_FULL = 990_016
FULL_CORPUS_PREFIXES = ("dsv4", "glm5.2", "minimaxm3", "kimik3")
# Flags of a compared script the spec cannot pass, and why: (config key, flag) -> reason. The
# comparison checks each still differs, so the list stays accurate.
CHAT_TEMPLATE_FILE = ("the script's --chat-template names a file of InferenceX's tree "
                      "(benchmarks/single_node/chat_templates/), which the plugin does not ship")
HICACHE_BY_RATIO = ("the registry's HiCache tier (--hicache-size per rank, --enable-cache-report); "
                    "the script sizes the tier by --hicache-ratio")
NATIVE_OFFLOAD = ("the registry's vllm-simple tier (SimpleCPUOffloadConnector, per-rank bytes); "
                  "the script passes vLLM's --kv_offloading_backend native shortcut")
KNOWN_DIFFERENCES = {
    ("dsv4-fp4-b200-sglang-agentic-hicache", "--chat-template"): CHAT_TEMPLATE_FILE,
    ("dsv4-fp4-b300-sglang-agentic-hicache", "--chat-template"): CHAT_TEMPLATE_FILE,
    # Configs with DRAM-offload rows only: the tier's flags are the framework registry's
    # `kv_offload` (frameworks/entries/), sized from total-cpu-dram-gb, for every script of
    # the framework alike.
    **{("glm5.2-fp4-b300-sglang-agentic", flag): HICACHE_BY_RATIO
       for flag in ("--hicache-ratio", "--hicache-size", "--enable-cache-report")},
    **{("minimaxm3-fp4-mi355x-vllm-agentic", flag): NATIVE_OFFLOAD
       for flag in ("--kv_offloading_backend", "--kv_offloading_size", "--kv-transfer-config")},
}
SERVER_START = re.compile(r"^(?!\s*(#|echo\b)).*(\bvllm serve\s|\bsglang serve\s|"
                          r"sglang\.launch_server)")


@pytest.fixture(scope="module")
def agentic_servers(inferencex_current_dir: Path) -> list[ServerConfig]:
    servers: list[ServerConfig] = []
    for name in MASTERS:
        recipe = load_recipe(inferencex_current_dir / "configs" / name, strict=False)
        servers += [s for s in recipe.servers
                    if s.scenario == "agentic-coding" and not s.multinode]
    return servers


def script_of(server: ServerConfig, top: Path) -> Path:
    (script,) = [p for p in benchmark_scripts(server, top) if p.is_file()][:1]
    return script


def server_block(text: str) -> list[str]:
    """The words of the script's server command: `vllm serve ...` continued over `\\` lines,
    or a `CMD=( ... )` array that starts with it; redirections and `&` left out."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if SERVER_START.match(line))
    if lines[start].rstrip().endswith("\\"):
        block = []
        for line in lines[start:]:
            block.append(line.rstrip().removesuffix("\\"))
            if not line.rstrip().endswith("\\"):
                break
    else:
        block = list(lines[start:lines.index(")", start)])
    words: list[str] = []
    for line in block:
        for word in shlex.split(line, comments=True):
            if word.startswith((">", "2>")) or word == "&":
                break
            words.append(word)
    return words


def offload_branch(text: str, backend: str) -> list[str]:
    """The words of the array the script's branch for a DRAM-offload backend builds (the first
    multi-line `..._ARGS=(` after `require_agentic_kv_offload_backend <backend>` or the case
    label `<backend>)`); none where the script has no such branch."""
    lines = [line for line in text.splitlines() if not line.lstrip().startswith("#")]
    label = re.compile(rf"require_agentic_kv_offload_backend {re.escape(backend)}\b|"
                       rf"^\s*{re.escape(backend)}\)")
    start = next((i for i, line in enumerate(lines) if label.search(line)), None)
    if start is None:
        return []
    opening = next((i for i in range(start, len(lines))
                    if re.match(r"^\s*\w+_ARGS=\($", lines[i])), None)
    if opening is None:
        return []
    words: list[str] = []
    for line in lines[opening + 1:]:
        if line.strip() == ")":
            break
        words += shlex.split(line, comments=True)
    return words


def flags_of(words: list[str] | tuple[str, ...]) -> dict[str, list[str]]:
    """Each `--flag` -> its values in order ("" for a flag that takes none)."""
    found: dict[str, list[str]] = {}
    for i, word in enumerate(words):
        if not word.startswith("--"):
            continue
        flag, eq, value = word.partition("=")
        if not eq:
            following = words[i + 1] if i + 1 < len(words) else "--"
            value = "" if following.startswith("--") else following
        found.setdefault(flag, []).append(value)
    return found


def context_of(flags: dict[str, list[str]]) -> str | None:
    values = [v for flag in CONTEXT_FLAGS for v in flags.get(flag, [])]
    return values[-1] if values else None


def same_value(ours: str, script: str) -> bool:
    """Equal words, or equal numbers however written (`0.8` and `0.80`)."""
    try:
        return ours == script or float(ours) == float(script)
    except ValueError:
        return False


def longest_prompt(server: ServerConfig, script_text: str) -> int:
    loader = re.search(r"WEKA_LOADER_OVERRIDE=(\S+)", script_text)
    if loader:
        return LONGEST_PROMPT_256K if loader.group(1).endswith("_256k") else LONGEST_PROMPT_FULL
    full = server.model_prefix.startswith(FULL_CORPUS_PREFIXES)
    return LONGEST_PROMPT_FULL if full else LONGEST_PROMPT_256K


FLAG_COMPARED = (
    "qwen3.5-fp8-b200-sglang-agentic",
    "qwen3.5-fp8-b300-sglang-agentic-hicache",
    "qwen3.5-fp8-mi355x-sglang-agentic",
    "minimaxm3-fp8-h200-vllm-agentic",
    "minimaxm3-fp8-h100-vllm-agentic",
    "minimaxm3-fp8-mi300x-vllm-agentic",
    "minimaxm3-fp8-mi325x-vllm-agentic",
    "dsv4-fp4-b200-vllm-agentic",
    "dsv4-fp4-b300-vllm-agentic",
    "dsv4-fp4-b300-vllm-agentic-mtp",
    "kimik2.5-int4-b200-vllm-agentic",
    "kimik2.5-int4-h200-vllm-agentic",
    "kimik2.5-fp4-b200-vllm-agentic-lmcache",
    "kimik2.5-fp4-b300-vllm-agentic",
    "kimik2.5-fp4-mi355x-vllm-agentic",
    "kimik2.5-fp4-b300-vllm-agentic-mtp",
    "kimik2.5-int4-h100-vllm",
    "kimik3-fp4-b300-vllm-agentic",
    "kimik3-fp4-b300-vllm-agentic-dspark",
    "dsv4-fp4-b200-sglang-agentic-hicache",
    "dsv4-fp4-b300-sglang-agentic-hicache",
    "dsv4-fp4-mi355x-sglang-agentic-hicache",
    "dsv4-fp4-mi355x-vllm-agentic",
    "dsv4-fp8-h200-vllm-agentic",
    "glm5.2-fp4-b300-sglang-agentic",
    "minimaxm3-fp4-mi355x-vllm-agentic",
    "qwen3.5-fp8-h100-sglang-agentic",
)


def test_every_known_difference_belongs_to_a_compared_config() -> None:
    # An entry of a config the flag comparison does not take would never be checked.
    assert {key for key, _ in KNOWN_DIFFERENCES} <= set(FLAG_COMPARED)


def test_every_agentic_server_gets_its_scripts_context_and_keeps_its_prefix_cache(
        agentic_servers: list[ServerConfig], inferencex_current_dir: Path,
        tmp_path: Path) -> None:
    checked: set[str] = set()
    failures: list[str] = []
    for server in agentic_servers:
        try:
            spec = resolve(server, tmp_path / "no-local-launch-dir")
        except LaunchSpecError:
            continue  # no packaged spec for this config yet
        text = script_of(server, inferencex_current_dir).read_text(encoding="utf-8")
        argv = flags_of(spec.argv_for_port(8000))
        wanted, got = context_of(flags_of(server_block(text))), context_of(argv)
        if got != wanted:
            failures.append(f"{server.node_name}: context {got} (script: {wanted or 'native'})")
        if got is not None and int(got) < longest_prompt(server, text):
            failures.append(f"{server.node_name}: context {got} is below the traces' "
                            f"longest prompt {longest_prompt(server, text)}")
        failures += [f"{server.node_name}: {flag}" for flag in PREFIX_CACHE_OFF if flag in argv]
        checked.add(spec.launch_file.name)
    assert len(checked) >= 10, checked
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("config_key", FLAG_COMPARED)
def test_an_agentic_servers_flags_are_its_scripts(
        config_key: str, agentic_servers: list[ServerConfig], inferencex_current_dir: Path,
        tmp_path: Path) -> None:
    # The config's plainest row: TP only, no offload, no DP attention where it has one (the
    # script's arrays for the other branches are not in its server command's own words, but
    # every flag the spec adds for them must be in the script's text).
    rows = [s for s in agentic_servers if s.config_key == config_key]
    (server,) = sorted(rows, key=lambda s: (s.parallel.dp_attn, s.offloading != "none",
                                            s.parallel.ep > 1))[:1]
    text = script_of(server, inferencex_current_dir).read_text(encoding="utf-8")
    words = server_block(text)
    if server.offloading != "none":
        # A config with DRAM-offload rows only: its row against the script's branch for it.
        words += offload_branch(text, (server.kv_offload_backend or "").split("@")[0])
    script = flags_of(words)
    argv = flags_of(resolve(server, tmp_path).argv_for_port(8000))
    problems: dict[str, str] = {}
    for flag, values in script.items():
        literal = [v for v in values if "$" not in v]
        if flag not in argv:
            problems[flag] = f"{flag}: missing"
        elif literal and not same_value(argv[flag][-1], literal[-1]):
            problems[flag] = f"{flag}: {argv[flag][-1]!r} (script: {literal[-1]!r})"
    # Nothing the fixed-length script passes and the agentic one does not.
    # (A flag a comment of the script names, e.g. one it leaves out on purpose, is not passed.)
    code = "\n".join(line.split(" #")[0] for line in text.splitlines()
                     if not line.lstrip().startswith("#"))
    problems.update({flag: f"{flag}: not in the script" for flag in argv if flag not in code})
    known = {flag for key, flag in KNOWN_DIFFERENCES if key == config_key}
    stale = sorted(known - set(problems))
    unexplained = [why for flag, why in problems.items() if flag not in known]
    assert not unexplained, f"{config_key}:\n" + "\n".join(unexplained)
    assert not stale, f"{config_key}: known differences that no longer differ: {stale}"


def test_every_agentic_config_of_the_current_tree_resolves_a_launch_spec(
        inferencex_current_dir: Path, tmp_path: Path) -> None:
    # Single-node and multinode alike: a config InferenceX adds without a packaged spec (or a
    # spec that no longer reads) fails here by its key, not as errors at run time.
    keys: set[str] = set()
    declared: set[str] = set()
    problems: dict[str, str] = {}
    for name in MASTERS:
        path = inferencex_current_dir / "configs" / name
        entries = yaml.safe_load(path.read_text(encoding="utf-8"))
        declared |= {key for key, entry in entries.items()
                     if "agentic-coding" in (entry.get("scenarios") or {})}
        recipe = load_recipe(path, strict=False)
        for server in recipe.servers:
            if server.scenario != "agentic-coding":
                continue
            keys.add(server.config_key)
            try:
                spec = resolve(server, tmp_path / "no-local-launch-dir")
            except LaunchSpecError as exc:
                problems.setdefault(server.config_key, str(exc))
                continue
            # InferenceX replays every agentic trace against the chat endpoint.
            if not spec.client.chat:
                problems.setdefault(server.config_key, f"client {spec.client.endpoint}")
    assert keys == declared  # every agentic key of the tree, not a sample of them
    assert not problems, "\n".join(f"{key}: {why}" for key, why in sorted(problems.items()))


def test_an_mtp_agentic_server_with_decode_context_parallelism_takes_the_scripts_dcp_branch(
        agentic_servers: list[ServerConfig], inferencex_current_dir: Path,
        tmp_path: Path) -> None:
    # kimik2.5_fp4_b300_mtp.sh drafts fewer tokens at a lower forced AL when DCP_SIZE > 1.
    rows = [s for s in agentic_servers if s.config_key == "kimik2.5-fp4-b300-vllm-agentic-mtp"
            and s.offloading == "none"]
    text = script_of(rows[0], inferencex_current_dir).read_text(encoding="utf-8")
    dcp_branch, plain_branch = text.split('if [[ "$DCP_SIZE" -gt 1 ]]; then', 1)[1].split(
        "\nelse\n", 1)
    checked = []
    for server in rows:
        branch = dcp_branch if server.parallel.dcp > 1 else plain_branch.split("\nfi\n", 1)[0]
        tokens = re.search(r"NUM_SPEC_TOKENS=(\d+)", branch)
        accept = re.search(r"SYNTHETIC_ACCEPT_LEN=([\d.]+)", branch)
        assert tokens and accept, branch
        spec = resolve(server, tmp_path)
        sd = read_speculative_decoding(spec.argv, spec.env_dict)
        assert sd is not None, spec.argv
        assert (sd.num_tokens, sd.forced_acceptance_length) == (
            int(tokens.group(1)), float(accept.group(1))), server.node_name
        flags = flags_of(spec.argv)
        assert flags.get("--decode-context-parallel-size", ["1"])[-1] == str(server.parallel.dcp)
        checked.append(server.parallel.dcp)
    assert len(set(checked)) == 2  # both branches of the script


def test_every_speculative_agentic_server_forces_its_scripts_acceptance(
        agentic_servers: list[ServerConfig], inferencex_current_dir: Path,
        tmp_path: Path) -> None:
    # InferenceX's agentic MTP / EAGLE3 / DSpark scripts pin acceptance to the golden AL by
    # synthetic acceptance in their throughput branch; the server the plugin starts drafts as
    # many tokens and forces the same AL (not the fixed-length spec's unforced config).
    checked: set[str] = set()
    problems = []
    for server in (s for s in agentic_servers if s.spec_decoding != "none"):
        text = script_of(server, inferencex_current_dir).read_text(encoding="utf-8")
        tokens = {int(v) for v in re.findall(r"NUM_SPEC_TOKENS=(\d+)", text)}
        accept = {float(a or b) for a, b in re.findall(
            r'SYNTHETIC_ACCEPT_LEN=([\d.]+)|synthetic_acceptance_length\\": ([\d.]+)', text)}
        spec = resolve(server, tmp_path)
        sd = read_speculative_decoding(spec.argv, spec.env_dict)
        got = (sd.num_tokens, sd.forced_acceptance_length) if sd else None
        if got is None or got[0] not in tokens or got[1] not in accept:
            problems.append(f"{server.node_name}: {got} (script: tokens {sorted(tokens)}, "
                            f"AL {sorted(accept)})")
        checked.add(server.config_key)
    assert checked  # the tree's speculative agentic configs
    assert not problems, "\n".join(problems)
