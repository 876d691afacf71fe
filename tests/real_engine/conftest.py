"""The real-engine tier: vLLM's CPU build serving a small model made here, through the plugin.

The venv and the model are made once by `benchmarks/real_engine/cpu_project.py` (in
`~/.cache/pytest-inferbench/`, reused by later runs; `$INFERBENCH_VLLM_CACHE` moves it). A failed
install fails every test of the tier with its reason: these tests never skip.
"""

from vllm_helpers import busy_neighbour, cpu_project

__all__ = ["busy_neighbour", "cpu_project"]
