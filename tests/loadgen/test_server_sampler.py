"""The KV-usage sampler against real local HTTP servers on the test's own event loop (so the
order of its scrapes, timeouts and closes follows the loop's timers, not the machine's load)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import httpx
import pytest

from pytest_inferbench.frameworks import registry
from pytest_inferbench.loadgen.server_sampler import GaugeSampler, GaugeSamples

INTERVAL_S = 0.2
RUN_S = 1.0  # five intervals: several scrapes if nothing stopped the sampler


@dataclass
class Server:
    """A /metrics endpoint that answers `page`, or never answers when `page` is None."""

    page: str | None
    requests: int = 0
    open_now: int = 0
    most_open: int = 0
    writers: list[asyncio.StreamWriter] = field(default_factory=list)

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.writers.append(writer)
        self.open_now += 1
        self.most_open = max(self.most_open, self.open_now)
        try:
            while await reader.readuntil(b"\r\n\r\n"):
                self.requests += 1
                if self.page is None:
                    await reader.read()  # hold the request until the client closes
                    return
                body = self.page.encode()
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\n"
                             b"content-length: %d\r\n\r\n%s" % (len(body), body))
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            self.open_now -= 1
            writer.close()


async def sample(server: Server) -> GaugeSamples:
    listener = await asyncio.start_server(server.handle, "127.0.0.1", 0)
    port = listener.sockets[0].getsockname()[1]
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
            sampler = GaugeSampler(client, interval_s=INTERVAL_S)
            sampler.start()
            await asyncio.sleep(RUN_S)
            return await sampler.stop()
    finally:
        for writer in server.writers:
            writer.close()
        listener.close()
        await listener.wait_closed()


def test_a_server_that_never_answers_gets_one_scrape_at_a_time_each_bounded() -> None:
    server = Server(page=None)
    samples = asyncio.run(sample(server))
    assert samples.count == 0 and samples.peak is None
    # Each scrape gave up after the interval, and the next began only after it: several
    # scrapes, never two open at once.
    assert samples.failed >= 2
    assert server.requests - samples.failed in (0, 1)  # the last one in flight at the stop
    assert server.most_open == 1
    assert samples.describe("kv")["kv_mean"] is None


def test_a_server_without_the_gauge_is_asked_once() -> None:
    server = Server(page="# TYPE other_gauge gauge\nother_gauge 1.0\n")
    samples = asyncio.run(sample(server))
    assert samples.not_exported and samples.failed == 0 and samples.count == 0
    assert server.requests == 1
    assert samples.describe("kv")["kv_sampled"] == "not exported by the server"


def test_the_gauge_of_several_engines_is_their_mean() -> None:
    name = registry.get("vllm").metrics["kv_usage"]
    server = Server(page=f'# TYPE {name} gauge\n{name}{{engine="0"}} 0.2\n'
                         f'{name}{{engine="1"}} 0.6\n')
    samples = asyncio.run(sample(server))
    assert samples.count >= 2 and samples.gauge == name
    assert samples.peak == pytest.approx(0.4)
    assert samples.total / samples.count == pytest.approx(samples.peak)
