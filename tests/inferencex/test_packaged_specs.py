"""The packaged launch specs cover InferenceX's single-node matrix and match its scripts.

Every single-node fixed-seq-len config of both real master files resolves to a launch spec
(from the package, not from a local launch directory) and starts on the simulator. A sample of
the scripts is run on stub programs (`pytest_inferbench.testing.scriptrun`) and the argv, env
and config files they give the server are compared with the resolved spec; so are scripts of
InferenceX's current layout for the specs written from them.
"""

from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from pytest_inferbench.backends.base import ServerStartError, StartContext
from pytest_inferbench.backends.sim import SimBackend
from pytest_inferbench.recipe.launch import OVERLAY_ARGS_MARK, packaged_launch_dir, resolve
from pytest_inferbench.recipe.model import ServerConfig, max_model_len
from pytest_inferbench.testing.inferencex import single_node_servers
from pytest_inferbench.testing.recipes import master_entry
from pytest_inferbench.testing.scriptrun import run_script, workspace_available

from .conftest import inferencex_current_source, inferencex_source

SCRIPTS = inferencex_source() / "benchmarks" / "single_node" / "fixed_seq_len"


@pytest.fixture(scope="module")
def servers(inferencex_dir: Path) -> list[ServerConfig]:
    configs = inferencex_dir / ".github" / "configs"
    return [s for v in ("amd", "nvidia") for s in single_node_servers(configs / f"{v}-master.yaml")]


def test_every_single_node_config_resolves_to_a_packaged_spec_and_starts(
        servers: list[ServerConfig], tmp_path: Path) -> None:
    assert len({s.config_key for s in servers}) == 137
    assert sum(len(s.points()) for s in servers) == 2973
    backend = SimBackend()
    ctx = StartContext(results_dir=tmp_path, run_id="t", worker_id="master", options=None)
    failures = []
    for server in servers:
        spec = resolve(server, tmp_path / "no-local-launch-dir")
        assert spec.launch_file.parent == packaged_launch_dir(), server.node_name
        try:
            handle = backend.start(server, spec, ctx)
        except ServerStartError as exc:
            failures.append(str(exc))
            continue
        assert handle.config.tp >= server.parallel.tp, server.node_name
        if (handle.config.spec is not None) != server.speculative:
            failures.append(f"{server.node_name}: speculative decoding "
                            f"{'missing' if server.speculative else 'unexpected'}")
    assert not failures, "\n".join(failures)


def test_a_local_launch_dir_overrides_the_packaged_spec_file_by_file(
        servers: list[ServerConfig], tmp_path: Path) -> None:
    server = next(s for s in servers if s.config_key == "dsr1-fp8-h200-sglang")
    local = tmp_path / "launch"
    local.mkdir()
    text = (packaged_launch_dir() / f"{server.launch_spec_name}.yaml").read_text()
    (local / f"{server.launch_spec_name}.yaml").write_text(text.replace(
        "startup-timeout: 1800", "startup-timeout: 77"))
    assert resolve(server, local).startup_timeout_s == 77
    other = next(s for s in servers if s.config_key == "gptoss-fp4-h100-vllm")
    assert resolve(other, local).launch_file.parent == packaged_launch_dir()


def flags(argv: tuple[str, ...] | list[str]) -> dict[str, str | None]:
    """argv -> {flag: value} as argparse reads it (last one wins, `--a=b` == `--a b`)."""
    out: dict[str, str | None] = {}
    words = list(argv)
    i = 0
    while i < len(words):
        word = words[i]
        i += 1
        if not word.startswith("-"):
            continue
        name, eq, value = word.partition("=")
        key = name.lstrip("-").replace("_", "-")
        if eq:
            out[key] = value
        elif i < len(words) and not words[i].startswith("-"):
            out[key] = words[i]
            i += 1
        else:
            out[key] = None
    return out


# (config key, script, the node's row: tp, ep, dp-attn) for spot checks: each framework,
# spec decoding, EP and DP attention, and TensorRT-LLM's options file. A spec holds one value
# per flag; where a script picks a value by TP / CONC / ISL or a branch the overlays cannot
# express, the spec file lists the difference in its header comment, and other rows differ
# there (e.g. dsr1-fp8-h200-trt-mtp with EP, qwen3.5-fp4-b200-trt with DP attention).
SPOT_CHECKS = [
    ("dsr1-fp8-h200-sglang", "dsr1_fp8_h200.sh", 8, 1, False),
    ("dsr1-fp4-b200-sglang", "dsr1_fp4_b200.sh", 4, 4, True),
    ("dsr1-fp8-b200-trt", "dsr1_fp8_b200_trt.sh", 8, 1, False),
    ("gptoss-fp4-h100-vllm", "gptoss_fp4_h100.sh", 2, 1, False),
    ("gptoss-fp4-h100-vllm", "gptoss_fp4_h100.sh", 4, 1, False),
    ("minimaxm3-fp4-mi355x-atom-mtp", "minimaxm3_fp4_mi355x_atom_mtp.sh", 4, 1, False),
    ("minimaxm3-fp8-h200-vllm-mtp", "minimaxm3_fp8_h200_mtp.sh", 8, 1, False),
    ("glm5-fp8-mi355x-atom", "glm5_fp8_mi355x_atom.sh", 8, 1, False),
    ("kimik2.5-int4-b300-vllm", "kimik2.5_int4_b300.sh", 8, 1, False),
    # ATOM's DP-attention branches (no master row uses them yet): expert parallelism only
    # with DP attention and EP > 1.
    ("minimaxm3-fp8-mi355x-atom", "minimaxm3_fp8_mi355x_atom.sh", 4, 4, False),
    ("minimaxm3-fp8-mi355x-atom", "minimaxm3_fp8_mi355x_atom.sh", 4, 1, True),
    ("minimaxm3-fp8-mi355x-atom", "minimaxm3_fp8_mi355x_atom.sh", 4, 4, True),
    ("minimaxm3-fp4-mi355x-atom-mtp", "minimaxm3_fp4_mi355x_atom_mtp.sh", 4, 4, True),
]


@pytest.mark.skipif(not workspace_available(), reason="the scripts need a writable /workspace")
@pytest.mark.parametrize(("key", "script", "tp", "ep", "dpa"), SPOT_CHECKS,
                         ids=[f"{c[0]}-tp{c[2]}-ep{c[3]}{'-dpa' if c[4] else ''}"
                              for c in SPOT_CHECKS])
def test_resolved_spec_matches_what_the_script_starts(
        servers: list[ServerConfig], tmp_path: Path, key: str, script: str, tp: int, ep: int,
        dpa: bool) -> None:
    compare_with_script(servers, SCRIPTS / script, tmp_path, key, tp, ep, dpa)


# The same comparison on InferenceX's current layout (`configs/`), for the specs written from
# its scripts: each new spec's plain and MTP script, EP and DP attention.
CURRENT_SPOT_CHECKS = [
    ("dsv4-fp8-mi300x-vllm", "dsv4_fp8_mi300x.sh", 8, 1, False),
    ("dsv4-fp8-mi325x-vllm-mtp", "dsv4_fp8_mi325x_mtp.sh", 8, 1, False),
    ("minimaxm3-fp4-b200-vllm", "minimaxm3_fp4_b200.sh", 4, 4, True),
    ("minimaxm3-fp4-b200-vllm", "minimaxm3_fp4_b200.sh", 2, 1, False),
    ("minimaxm3-fp4-b300-vllm", "minimaxm3_fp4_b300.sh", 2, 2, True),
    ("qwen3.5-fp4-rtx6000pro-sglang", "qwen3.5_fp4_rtx6000pro_sglang.sh", 4, 4, False),
    ("qwen3.5-fp4-rtx6000pro-sglang-mtp", "qwen3.5_fp4_rtx6000pro_sglang_mtp.sh", 4, 1, False),
]


@pytest.fixture(scope="module")
def current_servers(inferencex_current_dir: Path) -> list[ServerConfig]:
    configs = inferencex_current_dir / "configs"
    return [s for v in ("amd", "nvidia") for s in single_node_servers(configs / f"{v}-master.yaml")]


@pytest.mark.skipif(not workspace_available(), reason="the scripts need a writable /workspace")
@pytest.mark.parametrize(("key", "script", "tp", "ep", "dpa"), CURRENT_SPOT_CHECKS,
                         ids=[f"{c[0]}-tp{c[2]}-ep{c[3]}{'-dpa' if c[4] else ''}"
                              for c in CURRENT_SPOT_CHECKS])
def test_resolved_spec_matches_what_the_current_script_starts(
        current_servers: list[ServerConfig], inferencex_current_dir: Path, tmp_path: Path,
        key: str, script: str, tp: int, ep: int, dpa: bool) -> None:
    scripts = inferencex_current_dir / "benchmarks" / "single_node" / "fixed_seq_len"
    compare_with_script(current_servers, scripts / script, tmp_path, key, tp, ep, dpa)


def compare_with_script(servers: list[ServerConfig], script: Path, tmp_path: Path, key: str,
                        tp: int, ep: int, dpa: bool) -> None:
    """Run the script on stubs for the node's row and compare what it starts with the spec."""
    rows = [s for s in servers if (s.config_key, s.parallel.tp) == (key, tp)]
    server = next((s for s in rows if (s.parallel.ep, s.parallel.dp_attn) == (ep, dpa)), None)
    if server is None:  # a branch of the script that no master row takes
        server = replace(rows[0], parallel=replace(rows[0].parallel, ep=ep, dp_attn=dpa))
    spec = resolve(server, tmp_path)
    # The spec holds the values of the node's largest point where a script derives one from it.
    sweep = max(server.sweeps, key=lambda s: (s.isl, max(s.concurrencies)))
    conc = max(sweep.concurrencies)
    run = run_script(script, {
        "MODEL": server.model, "TP": str(tp), "EP_SIZE": str(ep), "CONC": str(conc),
        "ISL": str(sweep.isl), "OSL": str(sweep.osl),
        "MAX_MODEL_LEN": str(max(max_model_len(s.isl, s.osl) for s in server.sweeps)),
        "DP_ATTENTION": "true" if dpa else "false", "RANDOM_RANGE_RATIO": "0.8",
        "RESULT_FILENAME": "result"})
    argv = spec.argv_for_port(8888)
    if "trtllm-serve" in argv:  # the stub records what mpirun starts
        assert argv[0] == "mpirun"
        argv = argv[argv.index("trtllm-serve"):]
    assert argv[0] == run.server.argv[0]
    assert flags(argv) == flags(run.server.argv)
    if OVERLAY_ARGS_MARK in spec.launch_file.read_text():  # a spec that keeps the script's order
        assert argv == run.server.argv
    noise = {"GPU_METRICS_CSV", "PYTHONPYCACHEPREFIX", "PYTHONDONTWRITEBYTECODE"}
    assert spec.env_dict == {k: v for k, v in run.server.env.items() if k not in noise}
    for name, text in spec.files:
        assert yaml.safe_load(text) == yaml.safe_load(run.server.files[name])
    assert run.client is not None
    chat = "--use-chat-template" in run.client.argv or "--dsv4" in run.client.argv
    assert spec.client.use_chat_template == chat


def test_a_backend_that_cannot_write_the_specs_config_files_refuses_at_setup(
        pytester: pytest.Pytester) -> None:
    # TensorRT-LLM reads its options from a file the spec carries; the process backend does
    # not write it, so it must not start a server that would look for it.
    (pytester.path / "nvidia-master.yaml").write_text(master_entry(
        "gptoss-fp4-h200-trt", ["{ tp: 1, conc-list: [4] }"], model="openai/gpt-oss-120b",
        model_prefix="gptoss", runner="h200", framework="trt"))
    recorder = pytester.inline_run("-p", "no:cacheprovider", "--inferbench-backend=process")
    errors = [r for r in recorder.getreports("pytest_runtest_logreport")
              if r.when == "setup" and r.failed]
    assert len(errors) == 1
    assert errors[0].longreprtext == (
        f"{packaged_launch_dir() / 'gptoss_fp4_h200_trt.yaml'}: the server reads config files "
        "(gptoss-config.yml) that the process backend does not write yet; the sim backend "
        "reads them")


def test_stub_helper_reports_a_script_that_never_starts_a_server(tmp_path: Path) -> None:
    script = tmp_path / "broken.sh"
    script.write_text("#!/usr/bin/env bash\necho no server here\nexit 3\n")
    if not shutil.which("bash"):
        pytest.skip("no bash")
    with pytest.raises(RuntimeError, match=r"(?s)broken.sh: .*no server here"):
        run_script(script, {})


def test_no_packaged_spec_names_a_path_of_the_checkouts_it_was_written_from() -> None:
    """The specs were read off InferenceX's scripts run on stub programs here; a script path
    that came along (`$(dirname "$0")/...`) would start the real server on a file of this
    machine. Such files are named as InferenceX's containers see its checkout (/workspace)."""
    here = {str(p.resolve()) for p in (inferencex_source(), inferencex_current_source())}
    here |= {str(p.resolve().parent) for p in (inferencex_source(),)}
    found = [f"{spec.name}: {root}" for spec in sorted(packaged_launch_dir().rglob("*.yaml"))
             for root in here if root in spec.read_text(encoding="utf-8")]
    assert found == []
