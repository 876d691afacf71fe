"""The speculative decoding a point's server runs, for the gates and the result record.

The launch spec says how (`specdecode.read_speculative_decoding`, the same reader the simulator
uses); a recipe that says `spec-decoding: mtp` while its launch spec sets no speculative flag
still counts as speculative, with the recipe's method and no known k.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..frameworks.specdecode import SpeculativeDecoding, read_speculative_decoding, read_thinking

if TYPE_CHECKING:
    from ..recipe.launch import ServerSpec
    from ..recipe.model import ServerConfig


def speculative_decoding(server: ServerConfig, spec: ServerSpec | None
                         ) -> SpeculativeDecoding | None:
    """What the server runs, or None when it does not speculate."""
    argv = spec.argv if spec else ()
    described = read_speculative_decoding(argv, spec.env_dict if spec else {})
    if described is not None or not server.speculative:
        return described
    return SpeculativeDecoding(method=server.spec_decoding.lower(), num_tokens=None,
                               draft_model=None, thinking=read_thinking(argv))
