"""Launch specs as data: `benchmarks/launch/<prefix>_<precision>_<gpu>_<framework>.yaml`.

Resolving a server node gives one immutable `ServerSpec`: image, argv list, env, port, GPU
count, health path, startup timeout and the client options. No shell strings anywhere.
(The loader lands with the collection work.)
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

PORT_PLACEHOLDER = "{port}"


class LaunchSpecError(Exception):
    """A launch spec is missing or malformed; the message names the file."""


@dataclass(frozen=True)
class ClientOptions:
    use_chat_template: bool = False
    endpoint: str = "/v1/completions"  # or /v1/chat/completions


@dataclass(frozen=True)
class ServerSpec:
    image: str
    argv: tuple[str, ...]  # may hold "{port}", filled by the backend when it picks the port
    env: tuple[tuple[str, str], ...]
    port: int
    health_path: str
    startup_timeout_s: float
    gpu_count: int
    served_model: str
    hardware: str
    framework: str
    client: ClientOptions
    launch_file: Path

    def argv_for_port(self, port: int) -> tuple[str, ...]:
        return tuple(a.replace(PORT_PLACEHOLDER, str(port)) for a in self.argv)

    @property
    def env_dict(self) -> dict[str, str]:
        return dict(self.env)
