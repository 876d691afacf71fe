"""The simulated engine served over OpenAI-compatible HTTP (`python -m pytest_inferbench.sim`).

Everything with I/O and a clock lives here: the asyncio engine loop, the Starlette app, SSE
streaming, Prometheus exposition, fault injection, the eval oracle, the CLI and the launcher
that starts the server as a subprocess. The engine itself (`pytest_inferbench.sim`) imports
nothing from this package.
"""
