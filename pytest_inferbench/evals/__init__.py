"""Accuracy evals against the benchmarked server: GSM8K 5-shot scored as lm-eval does.

For the collection code: `item.run_eval_item(item, server, spec, base_url, settings, ctx)` is
the body of a node's `eval-gsm8k` item; `runner.run_gsm8k_eval(...)` runs the eval against any
OpenAI-compatible URL; `thresholds.lookup_threshold` / `check_eval` are the gate.
"""

from __future__ import annotations
