"""Accuracy evals against the benchmarked server: GSM8K 5-shot and GPQA diamond, scored as
InferenceX's lm-eval tasks score them.

For the collection code: `collect.make_eval_items(node, server)` gives a node's eval items;
`item.run_eval_item(item, server, spec, base_url, settings, ctx, task=...)` is the body of one;
`runner.run_gsm8k_eval(...)` / `runner.run_gpqa_eval(...)` run an eval against any
OpenAI-compatible URL; `thresholds.lookup_threshold` / `check_eval` are the gate.
"""

from __future__ import annotations
