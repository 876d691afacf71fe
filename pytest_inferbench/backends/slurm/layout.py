"""Where each process of a server runs inside its allocation, and its argv filled in.

A single-process server is one instance on the first host. A server of several roles places
its instances on the allocated hosts in turn (role order of the launch spec, then instance
index), so with one node per instance each gets its own node and with fewer nodes they share.
Ports: on a remote node the launch spec's port (an allocation is the server's own), plus the
instance's index on that node when several share it; on this host a free port, as the
process backend picks, because other servers may run here too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..readiness import free_port
from .jobs import is_this_host

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from ...recipe.launch import ServerSpec


@dataclass(frozen=True)
class Instance:
    role: str  # "" for a single-process server
    index: int
    host: str
    port: int
    argv: tuple[str, ...]
    env: tuple[tuple[str, str], ...]
    srun_args: tuple[str, ...] = ()

    @property
    def label(self) -> str:
        return f"{self.role}.{self.index}" if self.role else ""

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"


def nodes_needed(spec: ServerSpec) -> int:
    if not spec.roles:
        return 1
    return spec.nodes or sum(role.count for role in spec.roles)


def place(spec: ServerSpec, hosts: Sequence[str],
          local: Callable[[str], bool] = is_this_host) -> list[Instance]:
    """Every instance of the server with its host, port and filled argv."""
    roles = [(r.name, r.count, r.argv, r.env, r.srun_args) for r in spec.roles] or [
        ("", 1, spec.argv, spec.env, ())]
    used: dict[str, int] = {}
    slots = []
    turn = 0
    for name, count, argv, env, srun_args in roles:
        for index in range(count):
            host = hosts[turn % len(hosts)]
            turn += 1
            port = free_port() if local(host) else spec.port + used.get(host, 0)
            used[host] = used.get(host, 0) + 1
            slots.append((name, index, host, port, argv, env, srun_args))
    addresses: dict[str, list[tuple[str, int]]] = {}
    for name, _, host, port, *_ in slots:
        addresses.setdefault(name, []).append((host, port))
    return [Instance(role=name, index=index, host=host, port=port,
                     argv=fill(argv, host, port, addresses), env=env, srun_args=srun_args)
            for name, index, host, port, argv, env, srun_args in slots]


def fill(argv: Sequence[str], host: str, port: int,
         addresses: dict[str, list[tuple[str, int]]]) -> tuple[str, ...]:
    """Replace `{host}`, `{port}`, `{hosts:ROLE}`, `{addrs:ROLE}` in each word (a plain
    replacement: JSON arguments keep their other braces)."""
    values = {"{host}": host, "{port}": str(port)}
    for role, where in addresses.items():
        values[f"{{hosts:{role}}}"] = ",".join(h for h, _ in where)
        values[f"{{addrs:{role}}}"] = ",".join(f"{h}:{p}" for h, p in where)
    words = []
    for word in argv:
        for placeholder, value in values.items():
            word = word.replace(placeholder, value)
        words.append(word)
    return tuple(words)


def serving(instances: Sequence[Instance], spec: ServerSpec) -> Instance:
    """The instance clients talk to: the serve role's first, or the only one."""
    return next((i for i in instances if i.role == spec.serve_role), instances[0])
