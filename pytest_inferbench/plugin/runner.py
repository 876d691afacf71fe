"""The body of every benchmark item: run the point, record the result, apply the gates."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Protocol

import pytest

from ..backends.base import PointNotMeasuredError, ServerDiedError
from ..results.record import PointRecord
from ..state import RESULTS_KEY, get_session_state

if TYPE_CHECKING:
    from ..backends.base import LoadSettings, ServerHandle
    from ..recipe.launch import ServerSpec
    from ..recipe.model import BenchPoint
    from ..results.point_files import PointNames


class RunningNode(Protocol):
    """A server node as its points see it (`collect.ServerNode`)."""

    name: str
    instance: str  # which start of the server this is (results say which one they ran on)
    spec: ServerSpec | None
    handle: ServerHandle | None
    dead_reason: str | None


NAMES_KEY = pytest.StashKey["PointNames"]()


def point_names(config: pytest.Config) -> PointNames:
    """The point names this process's points hold in the run's results directory."""
    from ..results.point_files import PointNames

    names = config.stash.get(NAMES_KEY, None)
    if names is None:
        names = config.stash[NAMES_KEY] = PointNames()
    return names


def run_bench_item(item: pytest.Item, point: BenchPoint, node: RunningNode,
                   load: LoadSettings | None = None, *, fail: bool = True) -> PointRecord:
    """Run `point` (with the session's load settings unless `load` is given), record its result
    on the item and write its files; fail the item on gate failures unless `fail` is False.
    The result record is returned, `gate_failures` included."""
    from .. import gates, report
    from ..report.live import progress_output
    from ..results import build
    from ..results.point_files import runner_name, write_point_files

    state = get_session_state(item.config)
    handle = node.handle
    if handle is None:  # setup failed; pytest already reported it, never reached in practice
        pytest.fail(f"{node.name}: server was not started", pytrace=False)
    load = load or state.load
    if point.request_rate is not None:  # a request-rate sweep's point
        load = dataclasses.replace(load, request_rate=point.request_rate)
    # The point's line in a log comes with its report (`report.live.PointLines`).
    progress = progress_output(item.config, state.settings.progress)
    failure = ""  # failed outside the except clauses: the report shows no exception chain
    try:
        measurement = handle.run_point(point, load, progress)
    except ServerDiedError as exc:
        failure = node.dead_reason = state.redactor.text(str(exc))
    except PointNotMeasuredError as exc:
        failure = state.redactor.text(str(exc))
    if failure:
        pytest.fail(failure, pytrace=False)
    settings = state.settings
    measured = build.build_result(
        point, measurement, spec=node.spec, backend=settings.backend,
        goodput_slos=dict(settings.goodput) or None,
        runner_name=runner_name(point.server.runner, settings.runner_name),
    ).with_values(nodeid=item.nodeid, server_instance=node.instance, run_id=state.run_id)
    # A server's error body may echo a token it was given: masked before anything keeps it.
    measured = PointRecord(state.redactor.scrub_record(measured))
    try:  # the golden AL goes into the first files; the gates below report any error of it
        fields = gates.point_fields(point, node.spec, settings)
    except Exception:
        fields = {}
    measured = measured.with_values(
        gate_failures=[], **{k: v for k, v in fields.items() if k not in measured})
    # What was measured is on disk before any gate reads it: a gate that fails to evaluate
    # (or an interrupt during the gates) never loses the point.
    notes = measured.notes
    names = point_names(item.config)
    try:
        written = write_point_files(
            settings.results_dir, measured,
            requests=measurement.records if settings.save_requests else None,
            mask=state.redactor.text, names=names,
            gpu_metrics=measurement.power.samples_csv if measurement.power else None,
            agentic_records=measurement.records)
    except build.WriteError as exc:  # a full disk fails this point, not the run
        not_written, result = [str(exc)], measured
    else:
        not_written, result = [], written.record.with_values(notes=[*notes, *written.notes])
    try:
        findings = gates.check_point(result, point, node.spec, settings)
        gate_failures, fields = list(findings.failures), findings.fields
    except Exception as exc:  # any gate error fails this point, never the run
        gate_failures, fields = [f"gates could not be evaluated: {type(exc).__name__}: {exc}"], {}
    failures = [state.redactor.text(failure) for failure in
                [*not_written, *build.measurement_failures(result), *gate_failures]]
    added = {k: v for k, v in fields.items() if k not in result}
    if failures or added or result.notes != notes:  # the files on disk do not say all of it yet
        result = result.with_values(**added, gate_failures=failures)
        if not not_written:
            try:
                rewritten = write_point_files(settings.results_dir, result, names=names)
            except build.WriteError as exc:
                failures = [*failures, state.redactor.text(str(exc))]
                result = result.with_values(gate_failures=failures)
            else:
                result = rewritten.record.with_values(notes=[*notes, *rewritten.notes])
    item.stash.setdefault(RESULTS_KEY, []).append(result)
    item.user_properties.extend(report.result_properties(result))
    if failures and fail:
        pytest.fail("\n".join(failures), pytrace=False)
    return result
