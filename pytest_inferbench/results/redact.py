"""Keep secret values (HF_TOKEN and the like) out of logs, reports, exceptions and JUnit XML.

Servers receive some host variables verbatim (`Settings.pass_env`). Their *values* are secrets:
anything this plugin writes or raises that could contain them goes through `Redactor.text`
first. Names are not secret; a value is replaced by `***<NAME>***` so a reader still sees which
variable was there.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

if TYPE_CHECKING:
    from collections.abc import Iterable

    import pytest

    from .record import JSONValue, Record

# Values this short would redact ordinary words and numbers ("1", "true"); no real token is.
MIN_SECRET_LENGTH = 6
# Masked whatever `--inferbench-pass-env` says: naming other variables must not un-mask these.
ALWAYS_SECRET = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "OPENAI_API_KEY")
# Host variables whose names say they hold a credential are masked too.
_SECRET_NAME = re.compile(r"TOKEN|SECRET|PASSWORD|PASSWD|API_?KEY|ACCESS_KEY|CREDENTIAL|"
                          r"PRIVATE_KEY", re.IGNORECASE)
# user:password@ (or a bare token@) in any URL of any text.
_URL_USERINFO = re.compile(r"(\b[A-Za-z][A-Za-z0-9+.-]*://)[^/\s@]+@")


@dataclass(frozen=True)
class Redactor:
    """Replaces every known secret value in text; longest first so prefixes don't leak tails."""

    secrets: tuple[tuple[str, str], ...] = ()  # (name, value)

    @classmethod
    def from_env(cls, names: Iterable[str], environ: Mapping[str, str] | None = None,
                 urls: Iterable[str | None] = ()) -> Redactor:
        """The values of `names` (the variables passed to servers), of `ALWAYS_SECRET` and of
        every variable named like a credential, and the user and password of `urls`."""
        env = os.environ if environ is None else environ
        chosen = {*names, *ALWAYS_SECRET, *(n for n in env if _SECRET_NAME.search(n))}
        pairs = [(name, env[name]) for name in sorted(chosen)
                 if len(env.get(name, "")) >= MIN_SECRET_LENGTH]
        for url in urls:
            pairs += [("URL_CREDENTIALS", part) for part in _url_userinfo(url)]
        return cls(tuple(sorted(pairs, key=lambda pair: len(pair[1]), reverse=True)))

    def text(self, text: str) -> str:
        for name, value in self.secrets:
            if value in text:
                text = text.replace(value, f"***{name}***")
        return _URL_USERINFO.sub(r"\1***@", text) if "@" in text else text

    def scrub_record(self, record: Record) -> dict[str, JSONValue]:
        """A copy of a record with every string masked (keys included)."""
        return {self.text(k): self._scrub(v) for k, v in record.items()}

    def _scrub(self, value: JSONValue) -> JSONValue:
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, Mapping):
            return self.scrub_record(value)
        if isinstance(value, (list, tuple)):
            if set(map(type, value)) <= _NUMBERS:
                return type(value)(value)  # numbers only (per-request arrays): nothing to mask
            return type(value)(self._scrub(v) for v in value)
        return value

    def mapping(self, env: Mapping[str, str]) -> dict[str, str]:
        """An env mapping fit for printing: secret values (by name or by value) masked."""
        names = {name for name, _ in self.secrets}
        return {k: (f"***{k}***" if k in names else self.text(v)) for k, v in env.items()}

    def __bool__(self) -> bool:
        return bool(self.secrets)


_NUMBERS = frozenset({int, float, bool, type(None)})


def _url_userinfo(url: str | None) -> list[str]:
    if not url:
        return []
    try:
        parts = urlsplit(url)
        found = [parts.password or "", parts.username or ""]
    except ValueError:
        return []
    return [p for p in found if len(p) >= MIN_SECRET_LENGTH]


def mask_report(report: pytest.TestReport, redactor: Redactor) -> None:
    """A pytest report with its failure text and captured output masked (terminal, JUnit XML
    and xdist all read these)."""
    if report.longrepr is not None:
        text = str(report.longrepr)
        masked = redactor.text(text)
        if masked != text:
            report.longrepr = masked
    report.sections = [(title, redactor.text(content)) for title, content in report.sections]
