"""Collection speed: a generated master config with hundreds of entries and thousands of points.

Run: python benchmarks/bench_collect.py [ENTRIES]. Prints wall time of `pytest --collect-only`.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from pathlib import Path

ENTRY = """\
model{i}-fp8-{gpu}-vllm:
  image: img:{i}
  model: org/model-{i}
  model-prefix: model{i}
  runner: {gpu}
  precision: fp8
  framework: vllm
  multinode: false
  scenarios:
    fixed-seq-len:
      - isl: 1024
        osl: 1024
        search-space:
          - {{ tp: 4, conc-start: 4, conc-end: 512 }}
          - {{ tp: 8, ep: 8, dp-attn: true, conc-start: 4, conc-end: 512 }}
      - isl: 8192
        osl: 1024
        search-space:
          - {{ tp: 4, conc-start: 4, conc-end: 512 }}
          - {{ tp: 8, spec-decoding: mtp, conc-list: [4, 8, 16, 32, 64] }}
"""


def main() -> None:
    entries = int(sys.argv[1]) if len(sys.argv) > 1 else 300
    gpus = ("mi355x", "h200", "b200", "mi300x")
    with tempfile.TemporaryDirectory() as tmp:
        text = "\n".join(ENTRY.format(i=i, gpu=gpus[i % 4]) for i in range(entries))
        Path(tmp, "nvidia-master.yaml").write_text(text)
        argv = [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                "--rootdir", tmp, tmp]
        start = time.perf_counter()
        out = subprocess.run(argv, capture_output=True, text=True, check=False)
        wall = time.perf_counter() - start
    lines = out.stdout.splitlines()
    items = sum("::" in line for line in lines)
    pytest_line = lines[-1] if lines else out.stderr
    print(f"entries={entries} items={items} wall={wall:.2f}s incl. interpreter and plugin "
          f"start-up; pytest says: {pytest_line}")


if __name__ == "__main__":
    main()
