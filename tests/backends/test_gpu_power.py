"""GPU power of a measured point: a real backend's HTTP client samples the GPU tool on PATH
during the measured phase, and InferenceX's own scripts agree with what the plugin wrote.

The server is the real simulated server in real time (time scale 1) reached as a real server
is (`HttpServerHandle`, not simulated). The one stand-in is `nvidia-smi` (there is no GPU
here): a script that accepts only InferenceX's exact query and, as `-l 1` does, prints the CSV
header once and one row per GPU every second until it is stopped, in nvidia-smi's format.
The point's files then go through the current InferenceX tree's `process_result.py`, which
calls its `aggregate_power.py` on the plugin's GPU-metrics CSV and raw file.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from pytest_inferbench.backends.base import LoadSettings
from pytest_inferbench.backends.gpu_power import GpuPowerMonitor, amd_rows
from pytest_inferbench.backends.http import HttpServerHandle
from pytest_inferbench.loadgen.affinity import is_local
from pytest_inferbench.recipe.launch import ClientOptions, ServerSpec
from pytest_inferbench.recipe.model import Parallelism, SeqLenSweep, ServerConfig
from pytest_inferbench.results.build import build_result
from pytest_inferbench.results.point_files import (
    GPU_METRICS_DIR,
    point_paths,
    write_point_files,
)
from pytest_inferbench.results.power import window_power
from pytest_inferbench.sim.server.launcher import running_sim_server

if TYPE_CHECKING:
    from collections.abc import Iterator

    from pytest_inferbench.results.measurement import PointMeasurement
    from pytest_inferbench.results.record import PointRecord
    from pytest_inferbench.sim.server.launcher import SimServer

REPO = Path(__file__).resolve().parents[2]
UTILS = REPO.parent / "shared" / "inferencex-0801" / "utils"
needs_tree = pytest.mark.skipif(not (UTILS / "aggregate_power.py").is_file(),
                                reason=f"no current InferenceX tree at {UTILS.parent}")

MODEL = "amd/MiniMax-M3-MXFP4"
ARGV = ("python3", "-m", "atom.entrypoints.openai_server", "--model", MODEL,
        "--server-port", "8888", "-tp", "2", "--block-size", "128",
        "--max-model-len", "32768", "--max-num-seqs", "256", "--kv_cache_dtype", "fp8")
# InferenceX's benchmark_lib.sh start_gpu_monitor, word for word.
INFERENCEX_QUERY = ["--query-gpu=timestamp,index,power.draw,temperature.gpu,clocks.current.sm,"
                    "clocks.current.memory,utilization.gpu,utilization.memory",
                    "--format=csv", "-l", "1"]
GPU_WATTS = (400.0, 300.0)  # what the stand-in's two GPUs draw, sample after sample

STAND_IN = textwrap.dedent('''\
    #!{python}
    """nvidia-smi as InferenceX runs it; no GPU here. Anything else is refused."""
    import sys
    import time

    if sys.argv[1:] != {expected!r}:
        sys.stderr.write("stand-in nvidia-smi: unexpected arguments %r\\n" % sys.argv[1:])
        sys.exit(2)
    print("timestamp, index, power.draw [W], temperature.gpu, clocks.current.sm [MHz], "
          "clocks.current.memory [MHz], utilization.gpu [%], utilization.memory [%]",
          flush=True)
    while True:
        now = time.time()
        stamp = time.strftime("%Y/%m/%d %H:%M:%S", time.localtime(now))
        stamp += ".%03d" % int(now % 1 * 1000)
        for index, watts in enumerate({watts!r}):
            print("%s, %d, %.2f W, 45, 1980 MHz, 2619 MHz, 87 %%, 40 %%" % (stamp, index, watts),
                  flush=True)
        time.sleep(1)
''')


@pytest.fixture(scope="module")
def server() -> Iterator[SimServer]:
    with running_sim_server(ARGV, ["--time-scale", "1"]) as running:
        yield running


def tool_dir(tmp_path: Path) -> Path:
    """A PATH entry holding only the stand-in nvidia-smi."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    tool = bin_dir / "nvidia-smi"
    tool.write_text(STAND_IN.format(python=sys.executable, expected=INFERENCEX_QUERY,
                                    watts=GPU_WATTS))
    tool.chmod(0o755)
    return bin_dir


def measure(server: SimServer, osl: int) -> tuple[PointRecord, PointMeasurement]:
    spec = ServerSpec(
        image="local", argv=ARGV, env=(), port=0, health_path="/health", startup_timeout_s=30,
        gpu_count=2, served_model=MODEL, hardware="MI355X", framework="atom",
        client=ClientOptions(use_chat_template=False), launch_file=Path("local.yaml"))
    point = ServerConfig(
        config_key="minimaxm3-fp4-mi355x-atom", image="local", model=MODEL,
        model_prefix="minimaxm3", runner="mi355x", hardware="MI355X", precision="fp4",
        framework="atom", multinode=False, disagg=False, parallel=Parallelism(tp=2),
        spec_decoding="none", sweeps=(SeqLenSweep(64, osl, (2,), 1),),
        source=Path("power-test.yaml"), line=1).points()[0]
    handle = HttpServerHandle(base_url=server.base_url, spec=spec, simulated=False)
    m = handle.run_point(point, LoadSettings(prompts_per_conc=1, warmup_per_conc=1,
                                             range_ratio=1.0))
    assert all(r.success for r in m.records)
    return build_result(point, m, spec=spec, backend="process"), m


@needs_tree
def test_samples_of_the_gpu_tool_in_the_window_give_the_power_inferencex_computes(
        server: SimServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", f"{tool_dir(tmp_path)}{os.pathsep}{os.environ['PATH']}")
    # Time scale 1: each of the two requests streams its 400 tokens for seconds, so samples
    # taken a second apart fall inside the measured phase.
    record, m = measure(server, osl=400)
    assert m.power is not None and m.power.samples_csv, m.power
    assert record["simulated"] is False and record["power_source"] == "nvidia-smi"
    assert record["power_valid"] == 1, record.get("power_invalid_reason")
    assert record["power_num_gpus"] == len(GPU_WATTS)  # the GPUs the tool lists, as InferenceX
    assert record["avg_power_w"] == pytest.approx(sum(GPU_WATTS) / len(GPU_WATTS))
    # Energy = mean power x GPUs x duration; per token from the point's own token counts.
    energy = float(record["avg_power_w"]) * len(GPU_WATTS) * float(record["duration"])
    assert record["total_gpu_energy_j"] == pytest.approx(energy, abs=1e-3)
    out, inp = int(record["total_output_tokens"]), int(record["total_input_tokens"])
    assert out == sum(r.output_tokens for r in m.records) > 0
    assert record["joules_per_output_token"] == pytest.approx(energy / out, abs=1e-6)
    assert record["joules_per_total_token"] == pytest.approx(energy / (out + inp), abs=1e-6)

    # The point's files, then InferenceX's process_result.py (and its aggregate_power.py) on
    # them, with the plugin's GPU-metrics CSV as the workflow's GPU_METRICS_CSV.
    results = tmp_path / "results"
    written = write_point_files(results, record, gpu_metrics=m.power.samples_csv)
    name = written.record.result_filename
    raw_path, agg_path = point_paths(results / "points", name)
    csv_path = results / GPU_METRICS_DIR / f"{name}.csv"
    assert csv_path.read_text() == m.power.samples_csv
    ours = json.loads(agg_path.read_text())
    agg_path.unlink()  # process_result.py writes its own in its place
    env = {str(k): str(v) for k, v in dict(record["inferencex_env"]).items() if k != "CONC"}
    done = subprocess.run(
        [sys.executable, str(UTILS / "process_result.py")], cwd=raw_path.parent,
        env={"PATH": os.environ["PATH"], **env, "GPU_METRICS_CSV": str(csv_path)},
        capture_output=True, text=True, check=False)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    assert "[aggregate_power] avg_power_w=" in done.stdout, done.stderr
    theirs = json.loads(agg_path.read_text())
    for key in ("avg_power_w", "joules_per_output_token", "joules_per_total_token"):
        assert ours[key] == pytest.approx(theirs[key], abs=1e-9), key
    # What the script does not write: the validity flag and the energy (InferenceX's later
    # schema), nothing else.
    assert set(ours) - set(theirs) == {"power_valid", "total_gpu_energy_j"}
    assert ours["power_valid"] == 1


def test_without_a_gpu_tool_the_power_fields_say_so_and_hold_no_number(
        server: SimServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    record, m = measure(server, osl=4)
    assert m.power is not None and m.power.samples_csv is None
    assert record["power_valid"] == 0
    assert "no nvidia-smi or amd-smi on PATH" in str(record["power_invalid_reason"])
    assert not {"avg_power_w", "total_gpu_energy_j", "joules_per_output_token"} & set(record)
    written = write_point_files(tmp_path / "results", record)
    agg = json.loads(point_paths(tmp_path / "results" / "points",
                                 written.record.result_filename)[1].read_text())
    assert agg["power_valid"] == 0 and "avg_power_w" not in agg
    assert not (tmp_path / "results" / GPU_METRICS_DIR).exists()


def test_a_server_on_another_host_is_not_sampled() -> None:
    assert is_local("http://127.0.0.1:8000") and is_local("http://localhost:1")
    assert is_local("http://[::1]:8000")
    assert not is_local("http://gpu-node-17:8000") and not is_local("http://10.1.2.3:8000")


def test_amd_smi_watch_output_keeps_one_header_and_its_rows_are_windowed() -> None:
    # amd-smi's watch mode: preamble lines, then the header again before every interval.
    text = ("AMD SMI watch\n"
            "timestamp,gpu,power_usage,gfx_clk\n"
            "1000.0,0,500,2100\n1000.0,1,700,2100\n"
            "timestamp,gpu,power_usage,gfx_clk\n"
            "1001.0,0,520,2100\n1001.0,1,720,2100\n"
            "timestamp,gpu,power_usage,gfx_clk\n"
            "1005.0,0,100,2100\n1005.0,1,100,2100\n")
    rows = amd_rows(text)
    assert rows.splitlines()[0] == "timestamp,gpu,power_usage,gfx_clk"
    assert rows.count("timestamp,") == 1 and len(rows.splitlines()) == 7
    # The sample at 1005 is past the window's end: each sample's mean over its GPUs, averaged.
    assert window_power(rows, 999.5, 1002.0) == (pytest.approx((600 + 620) / 2), 2)
    assert window_power(rows, 2000.0, 2001.0) == "no GPU power sample fell in the measured phase"


CUT_OFF_TOOL = textwrap.dedent('''\
    #!{python}
    """nvidia-smi stopped while writing a row: a whole sample, then half of the next."""
    import pathlib
    import sys
    import time

    sys.stdout.write("timestamp, index, power.draw [W]\\n1700000000.0, 0, 500.00 W\\n"
                     "1700000001.0, 0, 5")
    sys.stdout.flush()
    pathlib.Path({marker!r}).write_text("written")
    time.sleep(60)
''')


def test_a_row_cut_off_by_the_stop_is_no_sample(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    marker = tmp_path / "marker"
    tool = bin_dir / "nvidia-smi"
    tool.write_text(CUT_OFF_TOOL.format(python=sys.executable, marker=str(marker)))
    tool.chmod(0o755)
    monkeypatch.setenv("PATH", str(bin_dir))
    monitor = GpuPowerMonitor.start()
    assert monitor is not None and monitor.tool == "nvidia-smi"
    deadline = time.monotonic() + 60
    while not marker.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    reading = monitor.reading(1699999999.0, 1700000002.0)
    assert reading.samples_csv == "timestamp, index, power.draw [W]\n1700000000.0, 0, 500.00 W\n"
    assert reading.valid and reading.avg_power_w == 500.0 and reading.num_gpus == 1


# Telemetry of both vendors' shapes: nvidia-smi's local-time stamps with units and "[N/A]",
# amd-smi's ISO stamps and bare numbers, a schema without a GPU column, rows outside the window.
CSV_CASES = {
    "nvidia": ("timestamp, index, power.draw [W], power.limit [W]\n"
               "2026/01/02 03:04:05.100, 0, 410.50 W, 700.00 W\n"
               "2026/01/02 03:04:05.100, 1, [N/A], 700.00 W\n"
               "2026/01/02 03:04:06.100, 0, 430.25 W, 700.00 W\n"
               "2026/01/02 03:04:06.100, 1, 390.00 W, 700.00 W\n"
               "2026/01/02 03:04:09.100, 0, 100.00 W, 700.00 W\n",
               "2026/01/02 03:04:05", "2026/01/02 03:04:07"),
    "amd": ("timestamp,gpu,power_usage,max_power\n"
            "2026-01-02T03:04:05.5,0,610,1400\n2026-01-02T03:04:05.5,1,590,1400\n"
            "2026-01-02T03:04:06.5,0,650,1400\n2026-01-02T03:04:06.5,1,630,1400\n",
            "2026/01/02 03:04:05", "2026/01/02 03:04:07"),
    "no_gpu_column": ("time,socket_power\n1767323045,300\n1767323045,500\n1767323046,420\n",
                      "1767323044", "1767323047"),
}
COMPARE = textwrap.dedent('''\
    import json
    import sys
    from datetime import datetime
    from pathlib import Path

    sys.path.insert(0, sys.argv[1])
    from aggregate_power import aggregate_power

    def unix(text):
        try:
            return float(text)
        except ValueError:
            return datetime.strptime(text, "%Y/%m/%d %H:%M:%S").timestamp()

    out = {}
    for name, (text, start, end) in json.loads(sys.stdin.read()).items():
        path = Path(sys.argv[2]) / (name + ".csv")
        path.write_text(text)
        out[name] = aggregate_power(path, unix(start), unix(end))
    print(json.dumps(out))
''')


@needs_tree
def test_the_window_takes_the_samples_inferencex_takes(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-c", COMPARE, str(UTILS), str(tmp_path)],
                          input=json.dumps(CSV_CASES), capture_output=True, text=True,
                          check=False)
    assert done.returncode == 0, done.stderr
    theirs = json.loads(done.stdout)
    for name, (text, start, end) in CSV_CASES.items():
        def unix(stamp: str) -> float:
            try:
                return float(stamp)
            except ValueError:
                return datetime.strptime(stamp, "%Y/%m/%d %H:%M:%S").timestamp()

        ours = window_power(text, unix(start), unix(end))
        assert not isinstance(ours, str), (name, ours)
        assert theirs[name] is not None, name
        assert ours[0] == pytest.approx(theirs[name][0], rel=1e-12) and ours[1] == theirs[name][1]


def test_an_agentic_replay_is_sampled_over_its_measured_phase(
        server: SimServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", f"{tool_dir(tmp_path)}{os.pathsep}{os.environ['PATH']}")
    spec = ServerSpec(
        image="local", argv=ARGV, env=(), port=0, health_path="/health", startup_timeout_s=30,
        gpu_count=2, served_model=MODEL, hardware="MI355X", framework="atom",
        client=ClientOptions(use_chat_template=True), launch_file=Path("local.yaml"))
    point = ServerConfig(
        config_key="minimaxm3-fp4-mi355x-atom-agentic", image="local", model=MODEL,
        model_prefix="minimaxm3", runner="mi355x", hardware="MI355X", precision="fp4",
        framework="atom", multinode=False, disagg=False, parallel=Parallelism(tp=2),
        spec_decoding="none", sweeps=(SeqLenSweep(0, 0, (2,), 1),), scenario="agentic-coding",
        source=Path("power-test.yaml"), line=1).points()[0]
    handle = HttpServerHandle(base_url=server.base_url, spec=spec, simulated=False)
    # Samples a second apart: a replay of a few seconds has some inside its window.
    m = handle.run_point(point, LoadSettings(replay_duration_s=3.0))
    assert m.workload["kind"] == "agentic-replay"
    assert m.power is not None and m.power.source == "nvidia-smi"
    assert m.power.avg_power_w == pytest.approx(sum(GPU_WATTS) / len(GPU_WATTS))
    assert m.power.num_gpus == len(GPU_WATTS)


def test_a_gpu_tool_that_fails_leaves_the_power_invalid_with_the_reason(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    tool = bin_dir / "nvidia-smi"
    # What nvidia-smi prints on a host whose driver is not loaded, and its exit status.
    tool.write_text(f"#!{sys.executable}\nimport sys\nprint('NVIDIA-SMI has failed because it "
                    "couldn\\'t communicate with the NVIDIA driver.')\nsys.exit(9)\n")
    tool.chmod(0o755)
    monkeypatch.setenv("PATH", str(bin_dir))
    monitor = GpuPowerMonitor.start()
    assert monitor is not None
    reading = monitor.reading(time.time() - 5, time.time() + 5)
    assert not reading.valid and reading.avg_power_w is None
    assert reading.invalid_reason == "nvidia-smi: the GPU metrics have no time or power column"
