"""The fixtures for Python benchmarks, in real pytest runs: a Python test and a recipe node that
ask for the same server share one start; their results land in the same tables, JUnit and
summary.json; under `-n 2 --dist loadgroup` too."""

from __future__ import annotations

import json
import shutil
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from pytest_inferbench.testing.recipes import master_entry

REPO = Path(__file__).resolve().parents[1]
KEY = "minimaxm3-fp4-mi355x-atom-mtp"
NODE = f"{KEY}-tp4"

PYTHON_TESTS = f'''
import pytest

PROMPTS = ["def add(a, b): return a + b", "write a unit test for add in pytest please",
           "sort a list of words by length and then alphabetically"]


@pytest.mark.inferbench_server("{KEY}", tp=4)
def test_acceptance_on_my_prompts(inferbench_load, inferbench_server):
    result = inferbench_load(prompts=PROMPTS * 2, osl=32, conc=2)
    assert result.passed and result.acceptance_length is not None
    assert result["input_lens"] == [len(p.split()) + result["workload"]["template_tokens"]
                                    for p in PROMPTS * 2]
    assert inferbench_server.name == "{NODE}"


@pytest.mark.inferbench_server("{KEY}", tp=4)
def test_two_points(inferbench_load):
    low = inferbench_load(isl=256, osl=32, conc=1)
    high = inferbench_load(isl=256, osl=32, conc=4, request_rate=50.0)
    assert high["total_token_throughput"] > 0 and low["total_token_throughput"] > 0


def test_run_metadata(inferbench_run, inferbench_results_dir, pytestconfig):
    assert inferbench_results_dir == inferbench_run.results_dir
    assert inferbench_run.run_id and inferbench_run.worker_id in ("master", "gw0", "gw1")
    assert inferbench_run.backend == (pytestconfig.getoption("inferbench_backend") or "sim")
'''


def write_project(pytester: pytest.Pytester) -> None:
    (pytester.path / "bench-master.yaml").write_text(master_entry(
        KEY, rows=["{ tp: 4, spec-decoding: mtp, conc-list: [1, 2] }"], isl=256, osl=32))
    (pytester.path / "launch").mkdir()
    shutil.copy(REPO / "benchmarks/launch/minimaxm3_fp4_mi355x_atom.yaml",
                pytester.path / "launch")
    pytester.makepyfile(test_bench=PYTHON_TESTS)


def run(pytester: pytest.Pytester, *args: str) -> tuple[pytest.RunResult, dict[str, Any]]:
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "--junitxml=junit.xml", "--inferbench-prompts-per-conc", "2",
        *args)
    summary = json.loads((pytester.path / "inferbench-results/summary.json").read_text())
    return result, summary


def check_shared_results(pytester: pytest.Pytester, result: pytest.RunResult,
                         summary: dict[str, Any]) -> None:
    result.assert_outcomes(passed=5)
    points = summary["points"]
    recipe = [p for p in points if "bench-master.yaml" in p["nodeid"]]
    python = [p for p in points if "test_bench.py" in p["nodeid"]]
    assert sorted(p["conc"] for p in recipe) == [1, 2]  # under -n, in the order they finished
    assert sorted(p["conc"] for p in python) == [1, 2, 4]
    # One start of the server for all of them: every result names the same server instance.
    assert {p["server_instance"] for p in points} == {recipe[0]["server_instance"]}
    assert {p["server_node"] for p in points} == {NODE}
    assert all(p["verdict"] == "passed" and p["simulated"] is True for p in points)
    assert any(p["workload"]["dataset"] == "prompts" for p in python)
    # Python results have files of their own beside the recipe points'.
    raw = {p.name for p in (pytester.path / "inferbench-results/points").glob("minimaxm3_*.json")}
    assert {p["result_filename"] + ".json" for p in points} <= raw
    assert len(raw) == len(points)
    # The node's table holds every row; JUnit carries the Python tests' properties.
    table = result.stdout.str().split("inferbench results", 1)[1]
    assert table.count("256/32") == 4 and table.count("/32") == 5  # 4 random + 1 prompt list
    junit = ET.parse(pytester.path / "junit.xml").getroot()
    # Under --dist loadgroup, xdist appends "@<group>" to the names.
    cases = {str(case.get("name")).split("@")[0]: case for case in junit.iter("testcase")}
    props = [(p.get("name"), p.get("value"))
             for p in cases["test_two_points"].iter("property")]
    assert ("server_node", NODE) in props and props.count(("conc", "4")) == 1


def test_python_test_and_recipe_share_one_server_start(pytester: pytest.Pytester) -> None:
    write_project(pytester)
    result, summary = run(pytester)
    check_shared_results(pytester, result, summary)


def test_one_process_started_for_both_on_a_real_http_server(pytester: pytest.Pytester) -> None:
    write_project(pytester)
    result, summary = run(pytester, "--inferbench-backend", "sim-server",
                          "--inferbench-time-scale", "0")
    check_shared_results(pytester, result, summary)
    # Counted independently of the results: every start of a server writes its own log file.
    logs = sorted(p.name for p in (pytester.path / "inferbench-results/server-logs").iterdir())
    assert logs == [f"{NODE}.log"]


def test_shared_under_xdist_loadgroup(pytester: pytest.Pytester) -> None:
    write_project(pytester)
    result, summary = run(pytester, "-n", "2", "--dist", "loadgroup")
    check_shared_results(pytester, result, summary)


def test_python_tests_alone_under_xdist_still_write_the_summary(pytester: pytest.Pytester
                                                                ) -> None:
    # Only the Python file is collected: the marker's key is found in the recipe under the
    # rootdir, and the controller learns of the results from the reports.
    write_project(pytester)
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "-n", "2", "--dist", "loadgroup", "-k", "two_points",
        "--inferbench-prompts-per-conc", "2", "test_bench.py")
    result.assert_outcomes(passed=1)
    summary = json.loads((pytester.path / "inferbench-results/summary.json").read_text())
    assert sorted(p["conc"] for p in summary["points"]) == [1, 4]


def test_eval_runner_fixture_runs_gsm8k_as_the_eval_item(pytester: pytest.Pytester,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    write_project(pytester)
    rows = [{"question": f"A box holds {i} pens and {i + 7} pencils. How many in all?",
             "answer": f"{i} + {i + 7} = {2 * i + 7}\n#### {2 * i + 7}"} for i in range(30)]
    (pytester.path / "gsm8k.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    pytester.makepyfile(test_accuracy=f'''
import pytest


@pytest.mark.inferbench_server("{KEY}", tp=4)
def test_gsm8k_on_the_shared_server(inferbench_eval):
    result = inferbench_eval()
    assert result.score("strict-match").score == 1.0
''')
    monkeypatch.setenv("INFERBENCH_SIM_EVAL_ACCURACY", "1.0")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--junitxml=junit.xml",
                                           "--inferbench-eval-data=gsm8k.jsonl",
                                           "test_accuracy.py")
    result.assert_outcomes(passed=1)
    result.stdout.re_match_lines([r"\s*eval gsm8k: strict-match 1\.0000 .*: passed"])
    summary = json.loads((pytester.path / "inferbench-results/summary.json").read_text())
    assert [e["eval_node"] for e in summary["evals"]] == [NODE]
    assert list((pytester.path / "inferbench-results/evals" / NODE).glob("results_*.json"))


def test_a_marker_that_names_no_server_errors_with_the_candidates(pytester: pytest.Pytester
                                                                  ) -> None:
    write_project(pytester)
    pytester.makepyfile(test_bench=f'''
import pytest


@pytest.mark.inferbench_server("no-such-key")
def test_unknown(inferbench_load):
    inferbench_load(isl=64, osl=8, conc=1)


@pytest.mark.inferbench_server("{KEY}", tp=8)
def test_wrong_tp(inferbench_server):
    pass
''')
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "test_bench.py")
    result.assert_outcomes(errors=2)
    result.stdout.fnmatch_lines([
        "*inferbench_server('no-such-key'): no such config key in *bench-master.yaml",
        f"*inferbench_server('{KEY}', tp=8): no server of {KEY} matches; it has {NODE}",
    ])
    assert "Traceback" not in result.stdout.str()


def write_two_servers(pytester: pytest.Pytester) -> None:
    """A recipe with two servers of one short point each: KEY (EAGLE3) and the plain TP4 one."""
    (pytester.path / "bench-master.yaml").write_text(
        master_entry(KEY, rows=["{ tp: 4, spec-decoding: mtp, conc-list: [1] }"], isl=64,
                     osl=8)
        + master_entry("minimaxm3-fp4-mi355x-atom", rows=["{ tp: 4, conc-list: [1] }"],
                       isl=64, osl=8))
    (pytester.path / "launch").mkdir()
    shutil.copy(REPO / "benchmarks/launch/minimaxm3_fp4_mi355x_atom.yaml",
                pytester.path / "launch")


def test_a_server_stops_when_its_last_user_is_done(pytester: pytest.Pytester) -> None:
    # Two servers on real HTTP: when the second one's first user runs, the first is gone.
    write_two_servers(pytester)
    pytester.makepyfile(test_order=f'''
import httpx
import pytest

SEEN = {{}}


@pytest.mark.inferbench_server("{KEY}")
def test_first_user(inferbench_server):
    SEEN["first"] = inferbench_server.base_url
    assert httpx.get(SEEN["first"] + "/health").status_code == 200


@pytest.mark.inferbench_server("minimaxm3-fp4-mi355x-atom")
def test_other_server(inferbench_server):
    with pytest.raises(httpx.ConnectError):
        httpx.get(SEEN["first"] + "/health")


@pytest.mark.inferbench_server("{KEY}")
def test_second_user(inferbench_server):
    assert inferbench_server.base_url == SEEN["first"]
''')
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-v", "--inferbench-backend",
                                           "sim-server", "--inferbench-time-scale", "0",
                                           "test_order.py")
    # The two users of the first server run next to each other, before the other server.
    result.assert_outcomes(passed=3)
    result.stdout.fnmatch_lines(["*test_first_user PASSED*", "*test_second_user PASSED*",
                                 "*test_other_server PASSED*"])
    logs = sorted(p.name for p in (pytester.path / "inferbench-results/server-logs").iterdir())
    assert logs == sorted(["minimaxm3-fp4-mi355x-atom-tp4.log", f"{NODE}.log"])


def test_indirect_parametrization_sweeps_servers_each_started_once(pytester: pytest.Pytester
                                                                   ) -> None:
    write_two_servers(pytester)
    pytester.makepyfile(test_sweep=f'''
import pytest

SERVERS = ["{KEY}", {{"config_key": "minimaxm3-fp4-mi355x-atom", "tp": 4}}]


@pytest.mark.parametrize("conc", [1, 2])
@pytest.mark.parametrize("inferbench_server", SERVERS, indirect=True)
def test_sweep(inferbench_server, inferbench_load, conc):
    result = inferbench_load(isl=64, osl=8, conc=conc)
    assert result["server_node"] == inferbench_server.name
''')
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "--inferbench-prompts-per-conc", "2", "test_sweep.py")
    result.assert_outcomes(passed=4)
    points = json.loads((pytester.path / "inferbench-results/summary.json").read_text())["points"]
    instances: dict[str, set[str]] = {}
    for point in points:
        instances.setdefault(point["server_node"], set()).add(point["server_instance"])
    assert {node: len(ids) for node, ids in instances.items()} == {
        NODE: 1, "minimaxm3-fp4-mi355x-atom-tp4": 1}


def test_fixtures_on_the_external_backend(pytester: pytest.Pytester) -> None:
    # A server nobody in the run starts or stops: the Python test and the recipe both use it.
    import subprocess
    import sys
    import time

    import httpx

    from pytest_inferbench.backends.readiness import free_port

    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "pytest_inferbench.sim", "serve", "--hardware", "MI355X",
         "--time-scale", "0", "--", "python3", "-m", "atom.entrypoints.openai_server",
         "--model", "amd/MiniMax-M3-MXFP4", "--server-port", str(port), "-tp", "4",
         "--method", "eagle3", "--draft-model", "Inferact/MiniMax-M3-EAGLE3",
         "--num-speculative-tokens", "3"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(url + "/health", trust_env=False).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline and server.poll() is None, "no sim server"
            time.sleep(0.2)
        write_project(pytester)
        result, summary = run(pytester, "--inferbench-backend", "external",
                              f"--inferbench-base-url={url}")
        check_shared_results(pytester, result, summary)
        assert {p["backend"] for p in summary["points"]} == {"external"}
        assert server.poll() is None  # never stopped by the run
    finally:
        server.terminate()
        server.wait(10)
