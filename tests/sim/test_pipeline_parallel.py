"""Pipeline parallelism in the simulator: a worker of tp x pp GPUs whose stages hold 1/pp of
the layers (docs/simulator.md, "Pipeline parallelism")."""

from __future__ import annotations

import json
import textwrap
from typing import TYPE_CHECKING

import pytest

from pytest_inferbench.sim.args import engine_config_from_argv
from pytest_inferbench.sim.config import EngineConfig
from pytest_inferbench.sim.disagg import Deployment, Pool, kv_transfer
from pytest_inferbench.sim.engine import Engine
from pytest_inferbench.sim.physics import EngineConfigError

if TYPE_CHECKING:
    from pytest_inferbench.sim.physics import StepCost

R1 = "nvidia/DeepSeek-R1-0528-FP4-V2"  # fits 4 B200s, so tp4 alone is a valid worker too
CONTEXT = 8192.0


def _engine(tp: int, pp: int, model: str = R1) -> Engine:
    return Engine(EngineConfig(hardware="B200", model=model, framework="vllm", tp=tp, pp=pp,
                               max_model_len=65536))


def _decode_step(cost: StepCost, seqs: float) -> float:
    return float(cost.step(decode_seqs=seqs, decode_ctx=seqs * CONTEXT,
                           decode_ctx_win=seqs * CONTEXT))


@pytest.mark.parametrize(("argv", "files"), [
    (["vllm", "serve", "moonshotai/Kimi-K3", "-tp", "8", "-pp", "2"], {}),
    (["vllm", "serve", "moonshotai/Kimi-K3", "--tensor-parallel-size", "8",
      "--pipeline-parallel-size=2"], {}),
    (["python3", "-m", "sglang.launch_server", "--model-path", "moonshotai/Kimi-K3",
      "--tp-size", "8", "--pp-size", "2"], {}),
    (["trtllm-serve", "moonshotai/Kimi-K3", "--tp_size", "8", "--extra_llm_api_options",
      "o.yaml"], {"o.yaml": "pipeline_parallel_size: 2\n"}),
])
def test_each_framework_spelling_gives_a_worker_of_tp_times_pp_gpus(
        argv: list[str], files: dict[str, str]) -> None:
    config, ignored = engine_config_from_argv(argv, hardware="B200", files=files)
    assert (config.tp, config.pp, config.gpus) == (8, 2, 16)
    assert not [word for word in ignored if "pp" in word or "pipeline" in word]


def test_a_model_too_big_for_one_node_fits_as_two_pipeline_stages() -> None:
    # Kimi-K3's weights exceed 8 B200s' memory (the InferenceX entry's reason for tp8 pp2).
    with pytest.raises(EngineConfigError, match="weights do not fit"):
        _engine(8, 1, "moonshotai/Kimi-K3")
    assert _engine(8, 2, "moonshotai/Kimi-K3").kv_capacity_tokens > 0


def test_two_stages_at_least_double_the_kv_capacity_per_worker() -> None:
    # Each stage's GPUs hold half the layers' KV per token (so twice the tokens in the same
    # memory) and half the weights (so more memory left for KV): at least double.
    one, two = _engine(4, 1), _engine(4, 2)
    assert two.kv_capacity_tokens >= 2 * one.kv_capacity_tokens
    # R1 attends with MLA, whose latent KV every TP rank holds whole: the same 8 GPUs as tp8
    # hold twice the tokens as two stages, since only pipelining splits the KV by layer.
    assert two.kv_capacity_tokens > 1.9 * _engine(8, 1).kv_capacity_tokens


def test_one_request_waits_for_every_stage_in_turn() -> None:
    """A single sequence is one micro-batch: its step is the sum over the stages (the whole
    model on tp GPUs) plus the hidden states' sends between stages. With the same 8 GPUs as
    tp8, each stage streams its weights over only 4 GPUs' HBM while the other stage idles, so
    a lone request decodes slower than under tp8 (whose all-reduces cost less than that)."""
    tp4, tp4pp2, tp8 = (_decode_step(_engine(*shape).cost, 1.0)
                        for shape in ((4, 1), (4, 2), (8, 1)))
    assert tp4pp2 > tp4  # the point-to-point send between the stages
    assert tp4pp2 < 1.05 * tp4  # ... a small part of a step
    assert tp4pp2 > tp8


def test_a_full_batch_runs_as_micro_batches_through_both_stages_at_once() -> None:
    # 64 sequences as 2 micro-batches of 32 in flight: every sequence advances once in a
    # micro-batch's latency, less than one pass of all 64 through the whole model on tp GPUs
    # (each stage works on one micro-batch while the other stage works on the other).
    one, two = _engine(4, 1).cost, _engine(4, 2).cost
    assert _decode_step(one, 32.0) < _decode_step(two, 64.0) < _decode_step(one, 64.0)


def test_a_pipelined_pool_counts_its_stages_gpus_and_sends_each_stages_share_of_the_kv(
        ) -> None:
    # Disaggregated pools of tp8 workers on a GB200 rack (one NVLink domain either way).
    tp8 = EngineConfig(hardware="GB200", model=R1, framework="vllm", tp=8, max_model_len=65536)
    pp2 = EngineConfig(hardware="GB200", model=R1, framework="vllm", tp=8, pp=2,
                       max_model_len=65536)
    one = Deployment(Pool("prefill", tp8, 1), Pool("decode", tp8, 1))
    two = Deployment(Pool("prefill", pp2, 1), Pool("decode", pp2, 1))
    assert two.gpus == 2 * one.gpus
    assert two.topology == "p1x8pp2-d1x8pp2"
    flat, staged = kv_transfer(one), kv_transfer(two)
    assert flat is not None and staged is not None
    # Each stage's GPUs send (and receive) the KV of their half of the layers, concurrently.
    assert staged.bytes_per_token == pytest.approx(flat.bytes_per_token / 2)


RECIPE = textwrap.dedent("""\
    kimik3-fp4-b200-dynamo-vllm-agentic:
      image: vllm/vllm-openai:kimi-k3
      model: moonshotai/Kimi-K3
      model-prefix: kimik3
      runner: cluster:b200-dgxc
      precision: fp4
      framework: dynamo-vllm
      multinode: true
      disagg: false
      scenarios:
        agentic-coding:
        - search-space:
          - spec-decoding: none
            conc-list: [1, 8]
            prefill: {num-worker: 1, tp: 8, pp: 2, ep: 1, dp-attn: false}
            decode: {num-worker: 0, tp: 8, pp: 2, ep: 1, dp-attn: false}
    """)


def test_the_kimi_k3_tp8_pp2_agentic_points_run(pytester: pytest.Pytester) -> None:
    # InferenceX's kimik3-fp4-b200-dynamo-vllm-agentic entry (aggregated, one tp8 pp2 worker).
    (pytester.path / "configs").mkdir()
    (pytester.path / "configs" / "nvidia-master.yaml").write_text(RECIPE, encoding="utf-8")
    result = pytester.runpytest("-p", "no:cacheprovider", "--inferbench-no-plots",
                                "--inferbench-replay-duration=30")
    result.assert_outcomes(passed=2)
    points = [json.loads(p.read_text(encoding="utf-8")) for p in
              (pytester.path / "inferbench-results" / "points").glob("kimik3*.json")]
    assert len(points) == 2
    for point in points:
        # The worker's argv carried the pool's pp: one worker of 8 GPUs x 2 stages.
        assert point["inferbench"]["server_metrics"]["deployment"] == "agg1x8pp2"
        assert point["completed"] > 0
