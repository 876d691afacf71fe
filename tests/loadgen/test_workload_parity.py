"""One workload for every backend: `sim` (in process) and `sim-server` (over HTTP) send the same
requests, warmups included, at the same offsets for the same seed.

The in-process side is read from what the driver hands its engine (`sim.driver._run_load`'s
request ids with their prompt and output lengths, whether the load is then planned as a closed
loop or run step by step) and, for the warmup, from the workload the backend hands the driver
(a warmup that provably leaves no trace is not run on the engine, only its decode plans are
drawn: `tests/sim/test_closed_loop.py` holds that to running it); the HTTP side from the
simulated server's own timeline (what arrived, with `prompt_tokens` and `max_tokens`), joined
to the client's records by response id.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import httpx
import pytest

from pytest_inferbench.backends import sim as sim_backend
from pytest_inferbench.backends.base import LoadSettings, StartContext
from pytest_inferbench.backends.http import HttpServerHandle
from pytest_inferbench.sim import driver as sim_driver

if TYPE_CHECKING:
    import types

    from pytest_inferbench.sim.server.launcher import SimServer

WARMUP_IDS = 1 << 40  # the driver numbers warmup requests from here
CTX = StartContext(results_dir=Path("."), run_id="t", worker_id="master", options=None)


class RecordingLoad:
    """Wraps the driver's load runner, noting every request it hands the engine."""

    sent: ClassVar[list[tuple[int, int, int]]] = []
    run = staticmethod(sim_driver._run_load)

    @staticmethod
    def __call__(engine: object, clock: object, isl: Any, osl: Any, *args: Any,
                 first_id: int, **kwargs: Any) -> Any:
        RecordingLoad.sent.extend((first_id + i, int(n_in), int(n_out))
                                  for i, (n_in, n_out) in enumerate(zip(isl, osl, strict=True)))
        return RecordingLoad.run(engine, clock, isl, osl, *args, first_id=first_id, **kwargs)


class RecordingSimulation:
    """Wraps the backend's point simulation, noting the warmup of the workload it is given."""

    warmup: ClassVar[list[tuple[int, int]]] = []
    simulate = staticmethod(sim_backend.simulate_point)

    @staticmethod
    def __call__(config: object, workload: Any, *args: Any, **kwargs: Any) -> Any:
        RecordingSimulation.warmup = [(r.input_tokens, r.output_tokens) for r in workload.warmup]
        return RecordingSimulation.simulate(config, workload, *args, **kwargs)


@pytest.mark.parametrize(("rate", "warmup"), [(math.inf, "same"), (400.0, "distinct")])
def test_sim_and_sim_server_send_the_same_requests(
        fast_server: SimServer, helpers: types.ModuleType, monkeypatch: pytest.MonkeyPatch,
        rate: float, warmup: str) -> None:
    spec = helpers.spec_for((*helpers.ATOM_ARGV, *helpers.EAGLE3), chat_template=True)
    node = helpers.server_config("mtp", isl=120, osl=24, conc=4)
    point = node.points()[0]
    load = LoadSettings(prompts_per_conc=3, warmup_per_conc=2, seed=5, request_rate=rate,
                        warmup=warmup)

    RecordingLoad.sent = []
    monkeypatch.setattr(sim_driver, "_run_load", RecordingLoad())
    monkeypatch.setattr(sim_backend, "simulate_point", RecordingSimulation())
    in_process = sim_backend.SimBackend().start(node, spec, CTX).run_point(point, load)
    sim_warmup = sorted(RecordingSimulation.warmup)
    run_warmup = sorted((i, o) for rid, i, o in RecordingLoad.sent if rid >= WARMUP_IDS)
    assert run_warmup in ([], sim_warmup)  # run on the engine, or left out as traceless
    sim_measured = sorted((rid, i, o) for rid, i, o in RecordingLoad.sent if rid < WARMUP_IDS)

    httpx.delete(fast_server.base_url + "/debug/inferbench/timeline")
    handle = HttpServerHandle(base_url=fast_server.base_url, spec=spec, simulated=True)
    over_http = handle.run_point(point, load)
    arrived = httpx.get(fast_server.base_url + "/debug/inferbench/timeline").json()["requests"]
    by_id = {t["id"]: (t["prompt_tokens"], t["max_tokens"]) for t in arrived}
    measured_ids = {r.request_id for r in over_http.records}

    assert len(sim_measured) == len(over_http.records) == 12
    # Measured requests, in send order: the same prompt length (template included) and
    # max_tokens, as the server counted them.
    assert [(i, o) for _, i, o in sim_measured] == [by_id[r.request_id]
                                                    for r in over_http.records]
    assert [r.input_tokens for r in in_process.records] == [
        r.input_tokens for r in over_http.records]
    # Warmups: the same shapes (`same`: eight copies of the first request).
    http_warmup = sorted(v for k, v in by_id.items() if k not in measured_ids)
    assert len(sim_warmup) == len(http_warmup) == 8
    assert sim_warmup == http_warmup
    if warmup == "same":
        assert set(sim_warmup) == {(sim_measured[0][1], sim_measured[0][2])}
    # Send schedule: the same offsets from the start of the measured phase.
    sim_sched = [r.scheduled_time for r in in_process.records]
    http_sched = [r.scheduled_time for r in over_http.records]
    if math.isinf(rate):
        assert sim_sched == http_sched == [None] * 12  # closed loop: nothing scheduled
    else:
        assert all(t is not None for t in (*sim_sched, *http_sched))
        first = http_sched[0]
        assert first is not None
        assert [t - first for t in http_sched if t is not None] == pytest.approx(
            sim_sched, abs=1e-9)
        assert sim_sched[0] == 0.0 and sim_sched[-1] > 0.0
