"""The result record: identity, metric keys, acceptance length, verdicts, atomic writing."""

from __future__ import annotations

import dataclasses
import json
import os
import threading
from pathlib import Path

import numpy as np
import pytest

from pytest_inferbench.recipe.model import Parallelism, SeqLenSweep, ServerConfig
from pytest_inferbench.results.build import build_result, measurement_failures, write_json_atomic
from pytest_inferbench.results.measurement import PointMeasurement
from pytest_inferbench.results.metrics import RequestRecord
from pytest_inferbench.results.point_files import (
    POINTS_DIR,
    REQUESTS_DIR,
    agg_result,
    point_paths,
    point_record,
    write_point_files,
)


def server(spec_decoding: str = "mtp") -> ServerConfig:
    return ServerConfig(
        config_key="minimaxm3-fp4-mi355x-atom-mtp", image="rocm/atom:test", model="amd/M3",
        model_prefix="minimaxm3", runner="mi355x", hardware="MI355X", precision="fp4",
        framework="atom", multinode=False, disagg=False, parallel=Parallelism(tp=4),
        spec_decoding=spec_decoding, sweeps=(SeqLenSweep(1024, 256, (4,), 12),),
        source=Path("amd-master.yaml"), line=10)


def measurement(*, check_ok: bool = True, mismatch: bool = False) -> PointMeasurement:
    records = [RequestRecord(send_time=i, end_time=i + 1.0, input_tokens=100,
                             output_tokens=5 if mismatch and i == 0 else 4, success=True,
                             chunk_times=np.array([i + 0.2, i + 0.5, i + 0.8]),
                             chunk_tokens=np.array([1, 2, 1]), token_source="usage")
               for i in range(4)]
    return PointMeasurement(
        records=records, duration_s=4.0, num_prompts=4, max_concurrency=4, simulated=True,
        server_metrics={"acceptance_length": 2.5, "acceptance_length_source": "atom:mtp_*"},
        client_check={"ok": check_ok, "reason": "" if check_ok else "client lag too high"},
        notes=("simulated server",))


def test_identity_and_metrics() -> None:
    point = server().points()[0]
    result = build_result(point, measurement(), spec=None, backend="sim-server")
    assert result["config_key"] == "minimaxm3-fp4-mi355x-atom-mtp"
    assert result["infmax_model_prefix"] == result["model_prefix"] == "minimaxm3"
    assert result["hw"] == "mi355x"
    assert result["hardware"] == "MI355X"
    assert result["dp_attention"] is False
    assert (result["tp"], result["ep"], result["isl"], result["osl"], result["conc"]) == (
        4, 1, 1024, 256, 4)
    assert result["image"] == "rocm/atom:test"
    assert result["backend"] == "sim-server"
    assert result["simulated"] is True
    assert result["completed"] == 4
    assert result["total_output_tokens"] == 16
    # InferenceX single node: per-GPU numbers divide by TP.
    assert result["tput_per_gpu"] == pytest.approx((400 + 16) / 4.0 / 4)
    assert result["median_ttft_ms"] == pytest.approx(200.0)
    assert result["median_ttft"] == pytest.approx(0.2)
    assert result["acceptance_length"] == 2.5
    assert result["client_tokens_per_chunk"] == pytest.approx(4 / 3)
    assert result["request_rate"] == "inf"
    assert result["result_filename"].startswith("minimaxm3_1024_256_fp4_atom_tp4-pp1-dcp1-pcp1-ep1")
    assert measurement_failures(result) == []


def test_no_acceptance_length_without_speculation() -> None:
    point = server("none").points()[0]
    m = measurement()
    m = PointMeasurement(records=m.records, duration_s=4.0, num_prompts=4, max_concurrency=4,
                         simulated=False)
    result = build_result(point, m, spec=None, backend="external")
    assert "acceptance_length" not in result


def test_untrustworthy_measurements_fail() -> None:
    point = server().points()[0]
    result = build_result(point, measurement(check_ok=False, mismatch=True), spec=None,
                          backend="sim-server")
    failures = measurement_failures(result)
    assert failures[0] == "client lag too high"
    assert failures[1].startswith("token accounting: 1 request(s)")
    untimed = measurement_failures(result.with_values(client_check={
        **result["client_check"], "not_applicable": "the server keeps no real time"}))
    assert len(untimed) == 1 and untimed[0].startswith("token accounting")


def test_atomic_write_never_shows_half_a_file(tmp_path: Path) -> None:
    path = tmp_path / "points" / "node.json"
    big = {"values": list(range(200_000)), "nan": float("nan"), "np": np.float64(1.5)}
    reads = 0
    stop = threading.Event()

    def reader() -> None:
        while not stop.is_set():
            if path.exists():
                text = path.read_text()
                json.loads(text)  # a partial file would not parse
                nonlocal reads
                reads += 1

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        for _ in range(5):
            write_json_atomic(path, big)
    finally:
        stop.set()
        thread.join()
    data = json.loads(path.read_text())
    assert data["nan"] is None
    assert data["np"] == 1.5
    assert [p.name for p in path.parent.iterdir()] == ["node.json"]  # no temp files left
    assert not any(name.endswith(".tmp") for name in os.listdir(path.parent))


def test_written_json_has_no_nan_in_lists_arrays_or_nesting(tmp_path: Path) -> None:
    path = tmp_path / "point.json"
    write_json_atomic(path, {
        "floats": [1.5, float("nan"), 2, True, None], "finite": [0.25, 3, False],
        "array": np.array([1.0, np.inf]), "ints": np.arange(3), "words": ("a", 1, None),
        "nested": [[1, float("-inf")], {"x": np.float64("nan")}]}, indent=None)
    assert json.loads(path.read_text()) == {
        "floats": [1.5, None, 2, True, None], "finite": [0.25, 3, False],
        "array": [1.0, None], "ints": [0, 1, 2], "words": ["a", 1, None],
        "nested": [[1, None], {"x": None}]}


def test_masking_a_record_reaches_strings_inside_lists_and_keeps_number_lists() -> None:
    from pytest_inferbench.results.redact import Redactor

    redactor = Redactor((("TOKEN", "s3cr3t-value-123"),))
    numbers = [1, 2.5, None, True]
    scrubbed = redactor.scrub_record({"lens": numbers, "errors": ["bad s3cr3t-value-123", 4],
                                      "deep": [{"k": "s3cr3t-value-123"}]})
    assert scrubbed == {"lens": numbers, "errors": ["bad ***TOKEN***", 4],
                        "deep": [{"k": "***TOKEN***"}]}
    assert scrubbed["lens"] is not numbers  # a copy, as every other value


def test_estimated_chunk_tokens_are_not_a_cross_check() -> None:
    point = server().points()[0]
    m = measurement(mismatch=True)
    records = [dataclasses.replace(r, token_source="words (approximate)") for r in m.records]
    result = build_result(point, dataclasses.replace(m, records=records), spec=None,
                          backend="external")
    assert result["token_mismatch_requests"] == 1
    assert measurement_failures(result) == []


def test_a_simulated_server_that_fell_behind_its_clock_is_not_a_measurement() -> None:
    from pytest_inferbench.loadgen.scrape import lag_during
    from pytest_inferbench.results.build import MAX_MEAN_DELIVERY_LAG_S

    # Two reads of /debug/inferbench/info around a point: 500 steps, mean lag 0.94 s.
    before = {"steps": 100.0, "mean_s": 0.001, "max_s": 0.01, "steps_over_5ms": 2.0}
    mean = 0.94
    total = before["mean_s"] * 100 + mean * 500
    after = {"steps": 600.0, "mean_s": total / 600, "max_s": 2.9, "steps_over_5ms": 427.0}
    lag = lag_during(before, after)
    assert lag["steps"] == 500 and abs(lag["mean_s"] - mean) < 1e-9
    assert lag["steps_over_5ms"] == 425 and lag["max_s_since_start"] == 2.9
    failures = measurement_failures({"server_metrics": {"delivery_lag": lag}})
    assert failures == [
        "not a valid measurement: the simulated server fell behind its own clock by 940.0 ms "
        "per step on average over 500 steps (425 late by more than 5 ms; largest lag 2900 ms) "
        f"> {MAX_MEAN_DELIVERY_LAG_S * 1e3:.0f} ms: the machine could not keep up"]
    kept_up = {**lag, "mean_s": MAX_MEAN_DELIVERY_LAG_S / 2}
    assert measurement_failures({"server_metrics": {"delivery_lag": kept_up}}) == []


def test_request_rate_time_scale_and_achieved_load_are_recorded() -> None:
    point = server().points()[0]
    closed = build_result(point, measurement(), spec=None, backend="sim")
    assert closed["request_rate"] == "inf" and closed["rate_limited"] is False
    # Four requests sent 1 s apart, each with its last chunk 0.8 s after its send, over 4 s:
    # 0.8 requests in flight on average, one sent per second.
    assert closed["achieved_concurrency"] == pytest.approx(4 * 0.8 / 4.0)
    assert closed["achieved_request_rate"] == pytest.approx(1.0)
    assert closed["time_scale"] is None and closed["timings_meaningful"] is True
    limited = dataclasses.replace(measurement(), workload={"request_rate": 5.0})
    result = build_result(point, limited, spec=None, backend="sim")
    assert result["request_rate"] == 5.0 and result["rate_limited"] is True


def test_time_scale_zero_marks_timings_not_meaningful() -> None:
    point = server().points()[0]
    fast = dataclasses.replace(measurement(), time_scale=0.0)
    result = build_result(point, fast, spec=None, backend="sim-server")
    assert result["time_scale"] == 0.0 and result["timings_meaningful"] is False
    assert result["notes"][0].startswith("timings not meaningful")
    assert "simulated server" in result["notes"]


def test_one_writer_puts_every_file_of_a_point_in_place(tmp_path: Path) -> None:
    """Raw and agg files, and with the requests their lines (errors masked); a rewrite after
    the gates without the requests leaves their file as it was."""
    point = server().points()[0]
    m = measurement()
    records = [dataclasses.replace(m.records[0], success=False, error="401: token s3cr3t"),
               *m.records[1:]]
    result = build_result(point, dataclasses.replace(m, records=records), spec=None,
                          backend="sim")
    notes = write_point_files(tmp_path, result, requests=records,
                              mask=lambda text: text.replace("s3cr3t", "***")).notes
    assert notes == []
    raw_path, agg_path = point_paths(tmp_path / POINTS_DIR, result.result_filename)
    raw = json.loads(raw_path.read_text())
    assert point_record(raw)["result_filename"] == result.result_filename
    assert json.loads(agg_path.read_text()) == json.loads(json.dumps(agg_result(raw)))
    requests_path = tmp_path / REQUESTS_DIR / f"{result.result_filename}.jsonl"
    lines = [json.loads(line) for line in requests_path.read_text().splitlines()]
    assert [line["status"] for line in lines] == ["error"] + ["ok"] * (len(records) - 1)
    assert lines[0]["error"] == "401: token ***"
    saved = requests_path.read_bytes()

    judged = result.with_values(gate_failures=["p99_ttft 9.0 > 2.0"])
    assert write_point_files(tmp_path, judged).notes == []
    assert point_record(json.loads(raw_path.read_text()))["gate_failures"] == [
        "p99_ttft 9.0 > 2.0"]
    assert requests_path.read_bytes() == saved
    assert not [p for p in tmp_path.rglob("*") if p.name.startswith(".")]  # no temp file left


def test_a_point_without_an_agg_file_still_gets_its_raw_file_and_requests(
        tmp_path: Path) -> None:
    # One-token replies: a TPOT of 0 ms, which has no interactivity.
    records = [RequestRecord(send_time=i, end_time=i + 0.5, input_tokens=100, output_tokens=1,
                             success=True, chunk_times=np.array([i + 0.5]), token_source="usage")
               for i in range(4)]
    result = build_result(server().points()[0],
                          dataclasses.replace(measurement(), records=records), spec=None,
                          backend="sim")
    notes = write_point_files(tmp_path, result, requests=records).notes
    raw_path, agg_path = point_paths(tmp_path / POINTS_DIR, result.result_filename)
    assert notes == [f"no {agg_path.name}: a TPOT of 0 ms has no interactivity (InferenceX's "
                     "process_result.py fails on it too)"]
    assert raw_path.is_file() and not agg_path.exists()
    requests_path = tmp_path / REQUESTS_DIR / f"{result.result_filename}.jsonl"
    assert len(requests_path.read_text().splitlines()) == len(records)
