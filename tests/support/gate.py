"""A TCP relay in front of a real redis-server that holds what clients send until released.

It counts a caller's sequential round trips without timing anything: each `release` lets
through everything sent since the last one, so an operation whose requests go out together
finishes in one release per round trip it waits for (`waves`). Replies pass at once.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable
from typing import Any, TypeVar

T = TypeVar("T")

#: How long a wave waits for the replies and the requests they lead to (s): generous, as
#: a request that misses its wave only counts one more.
SETTLE_S = 0.2
#: How many waves in a row may find nothing sent before `waves` gives up on the work.
IDLE_WAVES = 50


class Gate:
    """`async with Gate(port) as gate:` clients connect to `gate.port` instead."""

    def __init__(self, port: int, host: str = "127.0.0.1") -> None:
        self.target = (host, port)
        self.port = 0
        self._held: list[tuple[asyncio.StreamWriter, bytes]] = []
        self._tasks: set[asyncio.Task[Any]] = set()
        self._writers: list[asyncio.StreamWriter] = []
        self._server: asyncio.Server | None = None

    async def __aenter__(self) -> Gate:
        self._server = await asyncio.start_server(self._connect, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for writer in self._writers:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()
        await self._server.wait_closed()

    async def _connect(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(*self.target)
        self._writers += [writer, up_writer]

        async def hold() -> None:
            while data := await reader.read(65536):
                self._held.append((up_writer, data))

        async def relay() -> None:
            while data := await up_reader.read(65536):
                writer.write(data)
                await writer.drain()

        for work in (hold(), relay()):
            task = asyncio.create_task(work)
            self._tasks.add(task)

    def release(self, but: bytes | None = None) -> int:
        """Send on everything held (`but` the chunks that hold those bytes); how many."""
        held = [h for h in self._held if but is None or but not in h[1]]
        self._held = [h for h in self._held if but is not None and but in h[1]]
        for up_writer, data in held:
            up_writer.write(data)
        return len(held)

    def holds(self, part: bytes) -> bool:
        """Whether something held (a command's name, say) holds those bytes."""
        return any(part in data for _, data in self._held)

    async def waves(self, work: Awaitable[T]) -> tuple[T, int]:
        """Run `work` to its end, releasing what it sends; its result and how many releases
        it waited for."""
        task = asyncio.ensure_future(work)
        waves = idle = 0
        while idle < IDLE_WAVES:
            await asyncio.wait([task], timeout=SETTLE_S)
            if task.done():
                return task.result(), waves
            if self.release():
                waves, idle = waves + 1, 0
            else:
                idle += 1
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        raise TimeoutError(f"the work sent nothing for {IDLE_WAVES * SETTLE_S:.0f} s, unfinished")
