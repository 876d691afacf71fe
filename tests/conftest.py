"""Suite-wide: modules that in-process pytester runs would otherwise import anew each time.

`pytester.runpytest` runs pytest in this process and, after each run, forgets every module the
run imported first. A plugin of the environment that imports its package lazily (hypothesis's
imports hypothesis in its terminal summary) then has that package compiled and
assertion-rewritten again by every in-process run: seconds each on a 2-core machine. Imported
once here, it stays loaded across runs.
"""

from __future__ import annotations

import importlib
import importlib.util

for _name in ("hypothesis",):
    if importlib.util.find_spec(_name) is not None:
        importlib.import_module(_name)
