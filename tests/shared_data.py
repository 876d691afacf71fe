"""Where the tests find the shared agentic trace corpus: `INFERBENCH_AGENTIC_DATA`, else
`../shared/data/agentic` beside the checkout (wherever the checkout is)."""

from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
AGENTIC_DATA = Path(os.environ.get("INFERBENCH_AGENTIC_DATA")
                    or REPO.parent / "shared" / "data" / "agentic")
CORPUS = AGENTIC_DATA / "traces.jsonl"
