"""`python -m pytest_inferbench.sim serve ...` (also the `inferbench-sim` script and a container
entrypoint): the simulated engine served over OpenAI-compatible HTTP. See `sim/server/cli.py`.
`... calibrate ...` fits the simulator to measurements (`sim/calibrate/cli.py`)."""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Sequence

USAGE = ("usage: python -m pytest_inferbench.sim serve [SIMULATOR OPTIONS] [--] <server argv>\n"
         "       python -m pytest_inferbench.sim serve --help\n"
         "       python -m pytest_inferbench.sim route --port P --workers HOST:PORT,...\n"
         "       python -m pytest_inferbench.sim calibrate INPUT... [-o FILE]")


def main(argv: Sequence[str] | None = None) -> int:
    try:
        status = _dispatch(list(sys.argv[1:] if argv is None else argv))
        sys.stdout.flush()  # a closed pipe shows here, inside the try, not at exit
        return status
    except BrokenPipeError:
        # The reader of our output went away (`... | head`): no traceback; the rest of the
        # output goes nowhere instead of failing again at exit.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 1


def _dispatch(words: list[str]) -> int:
    if words and words[0] == "route":
        from .server.router import route

        return route(words[1:])
    if words and words[0] == "calibrate":
        from .calibrate.cli import run

        return run(words[1:])
    if words and words[0] in ("-h", "--help"):
        print(USAGE)
        return 0
    if not words or words[0] != "serve":
        print(USAGE, file=sys.stderr)
        return 2
    from .server.cli import serve

    return serve(words[1:])


if __name__ == "__main__":
    sys.exit(main())
