"""How a client sends (`services.bus.connection._QuickSend`), against a real redis-server:
no task a send, and a send the server does not take still times out."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Callable, Coroutine, Generator
from typing import Any

import pytest
import redis.exceptions

from services.bus.connection import plain_client
from services.bus.embedded import EmbeddedRedis


async def test_a_command_the_socket_takes_at_once_is_sent_without_a_task(redis_url: str) -> None:
    # redis-py's send runs under `asyncio.wait_for`, which on Python 3.11 makes a task of
    # every write: a fifth of a round trip's CPU. A socket timeout is set, as it is by
    # default, so that path would be taken.
    client = plain_client(redis_url, socket_timeout=5.0)
    loop = asyncio.get_running_loop()
    made: list[str] = []
    factory = loop.get_task_factory()

    def counting(
        loop: asyncio.AbstractEventLoop, coro: Generator[Any, None, Any] | Coroutine[Any, Any, Any]
    ) -> asyncio.Future[Any]:
        made.append(getattr(coro, "__qualname__", repr(coro)))
        return asyncio.Task(coro, loop=loop)

    try:
        await client.ping()  # (connects)
        loop.set_task_factory(counting)
        for _ in range(50):
            await client.ping()
        pipe = client.pipeline(transaction=False)
        pipe.ping()
        pipe.ping()
        assert await pipe.execute() == [True, True]
    finally:
        loop.set_task_factory(factory)
        await client.aclose()
    assert [name for name in made if "send" in name] == []


async def test_a_send_the_server_does_not_take_times_out_and_the_next_command_connects_again(
    redis_server_factory: Callable[..., EmbeddedRedis],
) -> None:
    # A stopped server reads nothing: once the kernel's buffers are full, the send waits
    # for the socket, and only for `socket_timeout`.
    server = redis_server_factory()
    client = plain_client(server.url, socket_timeout=0.5, retry=None)
    assert server.process is not None
    pid = server.process.pid
    try:
        await client.ping()
        os.kill(pid, signal.SIGSTOP)
        try:
            began = time.monotonic()
            with pytest.raises(redis.exceptions.TimeoutError, match="writing to socket"):
                await client.set("big", b"x" * (64 << 20))
            took = time.monotonic() - began
        finally:
            os.kill(pid, signal.SIGCONT)
        assert 0.4 <= took < 5.0
        assert await client.set("small", b"y") and await client.get("small") == b"y"
    finally:
        await client.aclose()
