"""Lua scripts: loaded once, called by SHA, reloaded in one place when the server forgot them.

A server forgets its scripts on restart, failover or SCRIPT FLUSH; the call then answers
NOSCRIPT without having run. `Script.run_many` sends many calls in one pipeline, loads the
script again when any call answered NOSCRIPT and sends exactly those calls again, so a
caller never sees the difference. Each call must name only keys of one hash slot (on a
cluster the client routes it by its first key).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

from redis.exceptions import NoScriptError

from services.bus.connection import Client

#: One script call: its keys and its arguments.
Call = tuple[Sequence[Any], Sequence[Any]]


class Script:
    """A Lua script called by SHA over a single server or a cluster."""

    def __init__(self, lua: str) -> None:
        self.lua = lua
        self.sha = hashlib.sha1(lua.encode()).hexdigest()

    def queue(self, pipe: Any, keys: Sequence[Any], args: Sequence[Any]) -> None:
        """Add one call to a pipeline (the caller runs it through `run_many` semantics)."""
        # `execute_command`: a cluster pipeline refuses `evalsha` but routes this by key.
        pipe.execute_command("EVALSHA", self.sha, len(keys), *keys, *args)

    async def load(self, client: Client) -> None:
        """Load the script (on every primary of a cluster)."""
        await client.script_load(self.lua)

    async def run_many(
        self, client: Client, calls: Sequence[Call], *, raise_on_error: bool = True
    ) -> list[Any]:
        """Run the calls in one round trip (per node); results in call order.

        With `raise_on_error` False an error of one call is returned in its place.
        """
        results: list[Any] = [None] * len(calls)
        todo = list(range(len(calls)))
        for attempt in range(2):
            pipe = client.pipeline(transaction=False)
            for i in todo:
                self.queue(pipe, *calls[i])
            answers = await pipe.execute(raise_on_error=False)
            lost = []
            for i, answer in zip(todo, answers, strict=True):
                if isinstance(answer, NoScriptError) and attempt == 0:
                    lost.append(i)  # this call did not run: send it again once loaded
                elif isinstance(answer, Exception) and raise_on_error:
                    raise answer
                else:
                    results[i] = answer
            if not lost:
                break
            await self.load(client)
            todo = lost
        return results

    async def __call__(self, client: Client, keys: Sequence[Any], args: Sequence[Any]) -> Any:
        return (await self.run_many(client, [(keys, args)]))[0]
