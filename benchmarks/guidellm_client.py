"""GuideLLM (a third party's load generator) driving the same closed loop as the project's client.

GuideLLM is heavy (torch, transformers) and pins its own httpx, so it lives in its own virtual
environment and runs as a separate process:

    python -m venv /tmp/guidellm && /tmp/guidellm/bin/pip install 'guidellm>=0.8'
    python benchmarks/bench_sim_server.py --compare --guidellm /tmp/guidellm/bin/guidellm

It gets the very prompts the project's client sends, as a JSONL dataset with their token counts,
and runs them at `concurrency` streams against `/v1/completions`: first the warmup prompts, then
the measured ones, two runs against the same server, as the project's client does. The simulated
server counts a prompt's tokens as its whitespace-separated words; GuideLLM asks a Hugging Face
tokenizer, so a word-level one (every word one token) is written for it into a folder named
after the served model. Its per-request timings (wall clock, `time.time()`) become
`RequestRecord`s with the server's response id, so one `summarize()` computes every client's
line and the server's timeline can be joined to it.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from pytest_inferbench.results.metrics import RequestRecord

if TYPE_CHECKING:
    from collections.abc import Sequence

    from pytest_inferbench.loadgen.prompts import Prompt, RenderedWorkload

_WORD_TOKENIZER = """
import sys
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast
words = Tokenizer(models.WordLevel(vocab={"[UNK]": 0}, unk_token="[UNK]"))
words.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
PreTrainedTokenizerFast(tokenizer_object=words, unk_token="[UNK]").save_pretrained(sys.argv[1])
"""


def _write_dataset(path: Path, prompts: Sequence[Prompt]) -> None:
    with path.open("w") as out:
        for p in prompts:
            out.write(json.dumps({"prompt": p.text, "prompt_tokens_count": p.input_tokens,
                                  "output_tokens_count": p.output_tokens}) + "\n")


def _run(executable: str, workdir: Path, url: str, model: str, conc: int,
         prompts: Sequence[Prompt], name: str) -> list[dict[str, object]]:
    dataset, report = workdir / f"{name}.jsonl", workdir / f"{name}-report.json"
    _write_dataset(dataset, prompts)
    argv = [executable, "run",
            "--backend", f"kind=openai_http,target={url},model={model},"
                         "request_format=/v1/completions",
            "--profile", f"kind=concurrent,streams={conc}",
            "--data", f"kind=json_file,path={dataset}",
            "--tokenizer", "kind=hf_auto",
            "--constraint", f"kind=max_requests,count={len(prompts)}",
            "--disable-console", "--output", f"kind=json,path={report}"]
    # One worker process holds all streams: its default of up to 10 processes, each busy at
    # conc 256, would take the CPUs of a small machine from the server it measures.
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "GUIDELLM__MAX_WORKER_PROCESSES": "1"}
    env.pop("PYTHONPATH", None)  # its own environment, not this checkout's
    done = subprocess.run(argv, cwd=workdir, env=env, capture_output=True, text=True,
                          check=False)
    if done.returncode != 0 or not report.exists():
        raise RuntimeError(f"guidellm exited {done.returncode}:\n{done.stderr[-3000:]}")
    benchmark = json.loads(report.read_text())["benchmarks"][0]
    requests: dict[str, list[dict[str, object]]] = benchmark["requests"]
    lost = {kind: len(requests.get(kind, [])) for kind in ("errored", "incomplete")}
    if any(lost.values()):
        print(f"    guidellm ({name}): {len(requests['successful'])} successful, "
              f"{lost['errored']} errored, {lost['incomplete']} incomplete")
    return requests["successful"]


def _record(request: dict[str, object]) -> RequestRecord:
    info = request["info"]
    assert isinstance(info, dict)
    timings = info["timings"]
    return RequestRecord(
        send_time=float(timings["request_start"]), end_time=float(timings["request_end"]),
        input_tokens=int(str(request["prompt_tokens"])),
        output_tokens=int(str(request["output_tokens"])), success=True,
        # First and last token: what TTFT, TPOT and E2EL read (its per-chunk times are not
        # in its report, so no ITL line is made from it).
        chunk_times=np.asarray([float(timings["first_token_iteration"]),
                                float(timings["last_token_iteration"])]),
        request_id=str(request["response_id"]))


def guidellm_closed_loop(executable: str, url: str, model: str, conc: int,
                         rendered: RenderedWorkload) -> tuple[list[RequestRecord], float]:
    """(records, duration) of the measured prompts GuideLLM completed, as it timed them (any it
    did not complete are counted in a printed line)."""
    with tempfile.TemporaryDirectory(prefix="bench-guidellm-") as tmp:
        workdir = Path(tmp)
        python = str(Path(executable).with_name("python"))
        subprocess.run([python, "-c", _WORD_TOKENIZER, str(workdir / model)], check=True)
        if rendered.warmup:
            _run(executable, workdir, url, model, conc, rendered.warmup, "warmup")
        measured = _run(executable, workdir, url, model, conc, rendered.prompts, "measured")
    records = [_record(r) for r in measured]
    if not records:
        raise RuntimeError("guidellm finished no request")
    duration = max(r.end_time for r in records) - min(r.send_time for r in records)
    return records, duration
