"""Small agentic trace files the replay tests of several directories share."""

from __future__ import annotations

import json
from pathlib import Path


def overflow_trace(tmp_path: Path) -> Path:
    """One stream of four turns whose third (2048 in) overflows a 1000-token context and whose
    fourth would fit again."""
    requests = [{"t": float(k), "type": "n", "model": "x", "in": n, "out": 4,
                 "hash_ids": list(range(n // 64)), "api_time": 0.1}
                for k, n in enumerate((64, 128, 2048, 128))]
    trace = {"id": "overflow", "models": ["x"], "block_size": 64, "hash_id_scope": "local",
             "requests": requests}
    path = tmp_path / "overflow.jsonl"
    path.write_text(json.dumps(trace) + "\n", encoding="utf-8")
    return path
