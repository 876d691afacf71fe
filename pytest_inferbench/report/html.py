"""pytest-html integration: the sweep plots in the HTML report's summary section.

Registered only when pytest-html is loaded (its hook would be unknown otherwise).
"""

from __future__ import annotations

import base64
import html
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from pathlib import Path

    import pytest


class WrittenFiles(Protocol):
    """The report collector, as far as the HTML report needs it."""

    written: list[Path]

    def finish(self) -> None:
        """Write every summary file now (once)."""

    def finish_plots(self) -> None:
        """Wait for the plots `finish` started."""


class HtmlPlots:
    def __init__(self, collector: WrittenFiles) -> None:
        self.collector = collector

    def pytest_html_results_summary(
        self, prefix: list[str], summary: list[str], postfix: list[str], session: pytest.Session
    ) -> None:
        # pytest-html writes its report in its own sessionfinish; ours may not have run yet.
        self.collector.finish()
        self.collector.finish_plots()
        for path in self.collector.written:
            if path.suffix != ".png":
                continue
            data = base64.b64encode(path.read_bytes()).decode("ascii")
            postfix.append(
                f'<p><img src="data:image/png;base64,{data}" '
                f'alt="{html.escape(path.name)}" style="max-width:100%"></p>'
            )
