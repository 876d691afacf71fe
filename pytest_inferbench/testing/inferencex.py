"""InferenceX's single-node fixed-seq-len configs as the project's `ServerConfig`s.

Each entry of a master file is checked by the project's own schema (`schema.load_recipe`) one
entry at a time, with only its fixed-seq-len scenario, so an entry elsewhere in the file that
the schema rejects (multinode, agentic) does not hide the others.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

from ..schema import load_recipe

if TYPE_CHECKING:
    from ..recipe import ServerConfig


def single_node_servers(master: Path) -> list[ServerConfig]:
    """Every single-node fixed-seq-len server node of an InferenceX master file."""
    data = yaml.safe_load(master.read_text(encoding="utf-8")) or {}
    servers: list[ServerConfig] = []
    with tempfile.TemporaryDirectory(prefix="inferbench-ix-") as tmp:
        for key, entry in data.items():
            scenarios = entry.get("scenarios") or {}
            if entry.get("multinode") or not scenarios.get("fixed-seq-len"):
                continue
            one = {key: {**entry, "scenarios": {"fixed-seq-len": scenarios["fixed-seq-len"]}}}
            path = Path(tmp) / master.name
            path.write_text(yaml.safe_dump(one, sort_keys=False), encoding="utf-8")
            servers.extend(load_recipe(path).servers)
    return servers
