"""The `external` backend: benchmark a server someone else runs (`--inferbench-base-url`).

Nothing is started or stopped. The health path is checked once at the node's setup so a wrong
URL fails every point of the node at once with a clear message.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import httpx

from .base import Backend, ServerStartError
from .http import HttpServerHandle
from .readiness import announced_time_scale, says_simulated

if TYPE_CHECKING:
    from ..recipe.launch import ServerSpec
    from ..recipe.model import ServerConfig
    from .base import StartContext

HEALTH_TIMEOUT_S = 10.0


class ExternalHandle(HttpServerHandle):
    def stop(self) -> None:
        """Not ours to stop."""


class ExternalBackend(Backend):
    name = "external"
    # It starts nothing: a server of several roles is reached at its serving role's URL.
    supports_roles = True

    def start(self, server: ServerConfig, spec: ServerSpec,
              ctx: StartContext) -> ExternalHandle:
        base_url = ctx.options.base_url
        if not base_url:
            raise ServerStartError(
                f"{server.node_name}: the external backend needs --inferbench-base-url URL")
        base_url = base_url.rstrip("/")
        url = base_url + spec.health_path
        try:
            with httpx.Client(trust_env=False, timeout=HEALTH_TIMEOUT_S) as client:
                response = client.get(url)
        except httpx.HTTPError as exc:
            raise ServerStartError(
                f"external server for {server.node_name} does not answer at {url}: "
                f"{type(exc).__name__}: {exc}") from None
        if response.status_code != 200:
            raise ServerStartError(f"external server for {server.node_name} is not healthy: "
                                   f"{url} -> HTTP {response.status_code}")
        return ExternalHandle(base_url=base_url, spec=spec,
                              simulated=says_simulated(response.headers),
                              time_scale=announced_time_scale(response.headers))
