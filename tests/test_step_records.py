"""A simulated point's records as columns (`StepRecords`): the same records, the same metrics."""

from __future__ import annotations

import numpy as np
import pytest

from pytest_inferbench.results.metrics import RequestRecord, StepRecords, first_send, summarize
from pytest_inferbench.results.request_records import ONE_PER_CHUNK

# Six steps ending at these times; three requests on them, the second with drafted chunks.
STEP_ENDS = np.array([0.1, 0.25, 0.3, 0.5, 0.8, 0.85])
SEND = np.array([0.0, 0.05, 0.2])
FIRST = np.array([0, 1, 3])
CHUNKS = np.array([3, 4, 2])
TOKENS = np.array([1, 1, 1, 1, 3, 2, 4, 1, 1])  # request after request


def columns(tokens: np.ndarray | None) -> StepRecords:
    output = (CHUNKS if tokens is None
              else np.add.reduceat(tokens, np.cumsum(CHUNKS) - CHUNKS))
    return StepRecords(send_time=SEND, input_tokens=np.array([100, 200, 300]),
                       output_tokens=output, first_step=FIRST, chunks=CHUNKS,
                       step_ends=STEP_ENDS, tokens=tokens, scheduled_time=None)


def plain(records: StepRecords) -> list[RequestRecord]:
    """The same requests as a client records them: their own chunk times, no step timeline."""
    return [RequestRecord(send_time=r.send_time, end_time=r.end_time,
                          input_tokens=r.input_tokens, output_tokens=r.output_tokens,
                          success=True, chunk_times=r.chunk_times.copy(),
                          chunk_tokens=r.tokens_per_chunk().copy())
            for r in records]


def test_a_record_is_read_off_the_columns() -> None:
    records = columns(TOKENS)
    second = records[1]
    assert second.chunk_times.tolist() == [0.25, 0.3, 0.5, 0.8]
    assert second.chunk_tokens.tolist() == [1, 3, 2, 4]
    assert (second.send_time, second.end_time, second.output_tokens) == (0.05, 0.8, 10)
    assert second.first_step == 1 and second.step_ends is STEP_ENDS
    assert records[-1].chunk_times.tolist() == [0.5, 0.8]
    assert [r.input_tokens for r in records[0:3:2]] == [100, 300]
    with pytest.raises(IndexError):
        records[3]
    assert columns(None)[0].chunk_tokens is ONE_PER_CHUNK
    assert first_send(records) == 0.0


@pytest.mark.parametrize("tokens", [None, TOKENS], ids=["one-per-chunk", "drafted"])
def test_the_metrics_of_columns_are_those_of_the_records(tokens: np.ndarray | None) -> None:
    records = columns(tokens)
    kwargs = {"duration_s": 1.0, "num_prompts": 3, "max_concurrency": 2, "num_gpus": 4}
    fast, slow = summarize(records, **kwargs), summarize(plain(records), **kwargs)
    assert fast.keys() == slow.keys()
    for key, value in slow.items():
        if isinstance(value, float):
            assert fast[key] == pytest.approx(value, rel=1e-12), key
        else:
            assert fast[key] == value, key


def test_columns_off_the_step_timeline_are_refused() -> None:
    with pytest.raises(ValueError, match="step timeline"):
        StepRecords(send_time=SEND, input_tokens=CHUNKS, output_tokens=CHUNKS,
                    first_step=np.array([0, 1, 5]), chunks=CHUNKS, step_ends=STEP_ENDS,
                    tokens=None, scheduled_time=None)
    with pytest.raises(ValueError, match="length"):
        StepRecords(send_time=SEND[:2], input_tokens=CHUNKS, output_tokens=CHUNKS,
                    first_step=FIRST, chunks=CHUNKS, step_ends=STEP_ENDS, tokens=None,
                    scheduled_time=None)
