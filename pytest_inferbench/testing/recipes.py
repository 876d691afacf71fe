"""Small InferenceX master-config entries for tests and benchmark scripts.

The defaults describe the shipped MiniMax-M3 MXFP4 ATOM entry on MI355X, so a test only names
what it varies: `master_entry(rows=["{ tp: 4, conc-list: [1, 2] }"], isl=256, osl=16)`.
"""

from __future__ import annotations

from collections.abc import Sequence

Sweep = tuple[int, int, Sequence[str]]  # isl, osl, search-space rows (YAML flow mappings)


def master_entry(
    key: str = "minimaxm3-fp4-mi355x-atom",
    rows: Sequence[str] = ("{ tp: 4, conc-list: [1] }",),
    *,
    isl: int = 1024,
    osl: int = 1024,
    sweeps: Sequence[Sweep] | None = None,
    image: str = "rocm/atom-dev:MiniMax-M3-20260623",
    model: str = "amd/MiniMax-M3-MXFP4",
    model_prefix: str = "minimaxm3",
    runner: str = "mi355x",
    precision: str = "fp4",
    framework: str = "atom",
) -> str:
    """One entry's YAML; `sweeps` replaces the single (isl, osl, rows) when given."""
    lines = [
        f"{key}:",
        f"  image: {image}",
        f"  model: {model}",
        f"  model-prefix: {model_prefix}",
        f"  runner: {runner}",
        f"  precision: {precision}",
        f"  framework: {framework}",
        "  multinode: false",
        "  scenarios:",
        "    fixed-seq-len:",
    ]
    for sweep_isl, sweep_osl, sweep_rows in sweeps or [(isl, osl, rows)]:
        lines += [f"      - isl: {sweep_isl}", f"        osl: {sweep_osl}", "        search-space:"]
        lines += [f"          - {row}" for row in sweep_rows]
    return "\n".join(lines) + "\n"


def large_master(entries: int) -> str:
    """A master file shaped like InferenceX's: four GPUs, two seq lens, several rows per entry.

    Each entry gives three server nodes and 29 points (tp4: 8 + 8; tp8-ep8-dpa: 8; tp8-mtp: 5).
    """
    gpus = ("mi355x", "h200", "b200", "mi300x")
    short = ("{ tp: 4, conc-start: 4, conc-end: 512 }",
             "{ tp: 8, ep: 8, dp-attn: true, conc-start: 4, conc-end: 512 }")
    long = ("{ tp: 4, conc-start: 4, conc-end: 512 }",
            "{ tp: 8, spec-decoding: mtp, conc-list: [4, 8, 16, 32, 64] }")
    return "\n".join(
        master_entry(f"model{i}-fp8-{gpus[i % 4]}-vllm", sweeps=[(1024, 1024, short),
                                                                  (8192, 1024, long)],
                     image=f"img:{i}", model=f"org/model-{i}", model_prefix=f"model{i}",
                     runner=gpus[i % 4], precision="fp8", framework="vllm")
        for i in range(entries))


def changelog_entry(config_keys: Sequence[str], description: str, pr: int | str) -> str:
    """One `perf-changelog.yaml` entry; `pr` is the PR number (or any text ending the link)."""
    keys = "".join(f"    - {key}\n" for key in config_keys)
    return (f"- config-keys:\n{keys}  description:\n    - \"{description}\"\n"
            f"  pr-link: https://github.com/SemiAnalysisAI/InferenceX/pull/{pr}\n")
