"""Collection speed: a generated master config with hundreds of entries and thousands of points.

Run: python benchmarks/bench_collect.py [ENTRIES]. Prints wall time of `pytest --collect-only`.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from pathlib import Path

from pytest_inferbench.testing.recipes import large_master


def main() -> None:
    entries = int(sys.argv[1]) if len(sys.argv) > 1 else 300
    with tempfile.TemporaryDirectory() as tmp:
        Path(tmp, "nvidia-master.yaml").write_text(large_master(entries))
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
