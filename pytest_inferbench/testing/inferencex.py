"""InferenceX's fixed-seq-len configs as the project's `ServerConfig`s, single-node or
multinode.

The project's own schema reads the master file (`strict=False`: an entry it rejects is left
out, the others stay); agentic nodes are dropped.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..recipe.schema import load_recipe

if TYPE_CHECKING:
    from pathlib import Path

    from ..recipe.model import ServerConfig


def single_node_servers(master: Path) -> list[ServerConfig]:
    """Every single-node fixed-seq-len server node of an InferenceX master file."""
    return [s for s in load_recipe(master, strict=False).servers
            if not s.multinode and not s.disagg and s.scenario == "fixed-seq-len"]


def multinode_servers(master: Path) -> list[ServerConfig]:
    """Every multinode fixed-seq-len server node (disaggregated or aggregated) of a master."""
    return [s for s in load_recipe(master, strict=False).servers
            if s.multinode and s.scenario == "fixed-seq-len"]
