"""Keep secret values (HF_TOKEN and the like) out of logs, reports, exceptions and JUnit XML.

Servers receive some host variables verbatim (`Settings.pass_env`). Their *values* are secrets:
anything this plugin writes or raises that could contain them goes through `Redactor.text`
first. Names are not secret; a value is replaced by `***<NAME>***` so a reader still sees which
variable was there.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping

# Values this short would redact ordinary words and numbers ("1", "true"); no real token is.
MIN_SECRET_LENGTH = 6


@dataclass(frozen=True)
class Redactor:
    """Replaces every known secret value in text; longest first so prefixes don't leak tails."""

    secrets: tuple[tuple[str, str], ...] = ()  # (name, value)

    @classmethod
    def from_env(cls, names: Iterable[str], environ: Mapping[str, str] | None = None) -> Redactor:
        env = os.environ if environ is None else environ
        pairs = [(name, env[name]) for name in names if len(env.get(name, "")) >= MIN_SECRET_LENGTH]
        return cls(tuple(sorted(pairs, key=lambda pair: len(pair[1]), reverse=True)))

    def text(self, text: str) -> str:
        for name, value in self.secrets:
            if value in text:
                text = text.replace(value, f"***{name}***")
        return text

    def mapping(self, env: Mapping[str, str]) -> dict[str, str]:
        """An env mapping fit for printing: secret values (by name or by value) masked."""
        names = {name for name, _ in self.secrets}
        return {k: (f"***{k}***" if k in names else self.text(v)) for k, v in env.items()}

    def __bool__(self) -> bool:
        return bool(self.secrets)
