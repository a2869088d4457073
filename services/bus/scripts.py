"""Lua scripts: loaded once, called by SHA, reloaded in one place when the server forgot them.

A server forgets its scripts on restart, failover or SCRIPT FLUSH; the call then answers
NOSCRIPT without having run. `Script.run_many` sends many calls in one pipeline, loads the
script again when any call answered NOSCRIPT and sends exactly those calls again, so a
caller never sees the difference. Each call must name only keys of one hash slot (on a
cluster the client routes it by its first key).

`run_replicated` sends commands (a script's calls with `Script.run_replicated`) followed by
a `WAIT` on the same connection, for writes that must be on replicas before they count.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
from collections.abc import Callable, Sequence
from typing import Any

from redis.asyncio.cluster import ClusterNode, PipelineCommand, RedisCluster
from redis.exceptions import AskError, MovedError, NoScriptError, RedisClusterException
from redis.exceptions import ConnectionError as RedisConnectionError

from services.bus.connection import (
    RETRIED_ERRORS,
    TRANSIENT_ERRORS,
    AgonCluster,
    Client,
    Patience,
    ReplicasBehind,
    patient_pipeline,
)

#: One script call: its keys and its arguments.
Call = tuple[Sequence[Any], Sequence[Any]]

#: One more command to ride in a script's pipeline (`Script.run_many`, and after the WAIT
#: of `run_replicated` on a single server only): given the pipeline, it queues one command
#: and returns what takes that command's answer, or queues none and returns None.
Rider = Callable[[Any], Callable[[Any], None] | None]


async def execute_riding(pipe: Any, rider: Rider | None) -> list[Any]:
    """`pipe`'s answers, errors in their place; `rider`'s command (if it queues one) goes
    last, and its answer is handed to it rather than returned."""
    take = rider(pipe) if rider is not None else None
    answers: list[Any] = await pipe.execute(raise_on_error=False)
    if take is not None:
        take(answers.pop())
    return answers


#: A node that did not answer: away (a failover) or too slow to wait for.
UNANSWERED: tuple[type[Exception], ...] = (*TRANSIENT_ERRORS, TimeoutError)


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
        """Load the script (on every primary of a cluster that answers: one that does not
        is asked again when a call there meets NOSCRIPT)."""
        if not isinstance(client, RedisCluster):
            await client.script_load(self.lua)
            return
        answers = await asyncio.gather(
            *(
                client.execute_command("SCRIPT LOAD", self.lua, target_nodes=node)
                for node in client.get_primaries()
            ),
            return_exceptions=True,
        )
        for answer in answers:
            if isinstance(answer, BaseException) and not isinstance(answer, UNANSWERED):
                raise answer

    async def run_many(
        self,
        client: Client,
        calls: Sequence[Call],
        *,
        raise_on_error: bool = True,
        patience: Patience | None = None,
        rider: Rider | None = None,
    ) -> list[Any]:
        """Run the calls in one round trip (per node); results in call order.

        With `raise_on_error` False an error of one call is returned in its place; with
        `patience`, a node that answers later than it allows fails its calls with
        `NodeTooSlow` (`patient_pipeline`). A `rider` adds its command after the first
        attempt's calls and is handed its answer (an error in its place).
        """
        results: list[Any] = [None] * len(calls)
        todo = list(range(len(calls)))
        for attempt in range(2):
            pipe = patient_pipeline(client, patience)
            for i in todo:
                self.queue(pipe, *calls[i])
            answers = await execute_riding(pipe, rider if attempt == 0 else None)
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

    async def run_per_node(
        self, client: Client, calls: Sequence[Call], timeout_s: float
    ) -> list[Any]:
        """`run_many` with errors in place, each node's calls on their own and given at most
        `timeout_s`: a node that does not answer in time (its host died, and nobody knows
        yet) costs its own calls a `TimeoutError`, and holds none of the others back."""

        async def run(part: list[int]) -> None:
            try:
                async with asyncio.timeout(timeout_s):
                    answers = await self.run_many(
                        client, [calls[i] for i in part], raise_on_error=False
                    )
            except UNANSWERED as exc:
                answers = [exc] * len(part)
            for i, answer in zip(part, answers, strict=True):
                results[i] = answer

        results: list[Any] = [None] * len(calls)
        parts: dict[str, list[int]] = {}
        for i, (keys, _) in enumerate(calls):
            node = client.get_node_from_key(keys[0]) if isinstance(client, RedisCluster) else None
            parts.setdefault(node.name if node is not None else "", []).append(i)
        await asyncio.gather(*(run(part) for part in parts.values()))
        return results

    async def __call__(self, client: Client, keys: Sequence[Any], args: Sequence[Any]) -> Any:
        return (await self.run_many(client, [(keys, args)]))[0]

    async def run_replicated(
        self,
        client: Client,
        calls: Sequence[Call],
        replicas: int,
        timeout_ms: int,
        node_timeout_s: float | None = None,
        *,
        rider: Rider | None = None,
    ) -> list[tuple[Any, bool]]:
        """Run the calls, then `WAIT replicas timeout_ms` on the connection that ran them
        (`run_replicated`, each node given at most `node_timeout_s`): per call its answer
        (or error) and whether at least `replicas` replicas acknowledged it. Calls that met
        NOSCRIPT are sent again once the script is loaded (every call checks its own head
        and command id, so that is safe)."""
        commands = [
            (keys[0], ("EVALSHA", self.sha, len(keys), *keys, *args)) for keys, args in calls
        ]
        out = await run_replicated(
            client, commands, replicas, timeout_ms, node_timeout_s, rider=rider
        )
        lost = [i for i, (answer, _) in enumerate(out) if isinstance(answer, NoScriptError)]
        if lost:
            # Loaded on the same connection as the calls, ahead of them (after a failover a
            # cluster-wide SCRIPT LOAD may not know the new master yet).
            load = ("SCRIPT", "LOAD", self.lua)
            again = await run_replicated(
                client,
                [c for i in lost for c in ((commands[i][0], load), commands[i])],
                replicas,
                timeout_ms,
                node_timeout_s,
            )
            for i, one in zip(lost, again[1::2], strict=True):
                out[i] = one
        return out


#: One command for `run_replicated`: the key that routes it, and its words.
Command = tuple[Any, tuple[Any, ...]]


async def run_replicated(
    client: Client,
    commands: Sequence[Command],
    replicas: int,
    timeout_ms: int,
    node_timeout_s: float | None = None,
    *,
    rider: Rider | None = None,
) -> list[tuple[Any, bool]]:
    """Send the commands, then `WAIT replicas timeout_ms` on the connection that sent them.

    Returns per command its answer (or error) and whether at least `replicas` replicas
    acknowledged it. WAIT covers the writes of its own connection only, so each node's
    commands and their WAIT travel on one connection: one pipeline on a single server, the
    node's own connection on a cluster, with no redirection: a command that met MOVED or a
    dropped connection is just not confirmed, and its caller asks again later. With
    `node_timeout_s`, a node that does not answer in time (its host died, and nobody knows
    yet) costs its own commands a `TimeoutError`, and holds none of the others back. A
    `rider` goes in the same pipeline after the WAIT, on a single server only.
    """
    if not isinstance(client, RedisCluster):
        try:
            async with asyncio.timeout(node_timeout_s):
                return await _replicated(client, None, commands, replicas, timeout_ms, rider)
        except TimeoutError as exc:
            if node_timeout_s is None:
                raise
            return [(exc, False)] * len(commands)
    by_node: dict[str, tuple[ClusterNode, list[int]]] = {}
    for i, (key, _) in enumerate(commands):
        node = client.get_node_from_key(key)
        if node is None:
            raise RedisClusterException(f"no node serves {key!r}")
        by_node.setdefault(node.name, (node, []))[1].append(i)
    groups = list(by_node.values())

    async def on(node: ClusterNode, idx: list[int]) -> list[tuple[Any, bool]]:
        async with asyncio.timeout(node_timeout_s):
            return await _replicated(client, node, [commands[i] for i in idx], replicas, timeout_ms)

    answers = await asyncio.gather(*(on(node, idx) for node, idx in groups), return_exceptions=True)
    out: list[tuple[Any, bool]] = [(None, False)] * len(commands)
    stale = False
    for (node, idx), answer in zip(groups, answers, strict=True):
        if isinstance(answer, BaseException):
            # A node merely slow to answer (`node_timeout_s`) moved no slots.
            stale = stale or not isinstance(answer, TimeoutError)
            if isinstance(client, AgonCluster) and isinstance(answer, TRANSIENT_ERRORS):
                client.node_failed(node)
            answer = [(answer, False)] * len(idx)
        for i, one in zip(idx, answer, strict=True):
            out[i] = one
            stale = stale or isinstance(one[0], MovedError | AskError)
    if stale:  # the slots moved (a failover): learn where they went before the next call
        if isinstance(client, AgonCluster):
            await client.refresh_slots()
        else:
            with contextlib.suppress(*TRANSIENT_ERRORS, RedisClusterException):
                await client.nodes_manager.initialize()
    return out


def confirmed(answers: Sequence[tuple[Any, bool]], short: str) -> None:
    """Check `run_replicated`'s answers: raise the first error that is not a moment of a
    failover, then `ReplicasBehind(short)` if any write lacks its replicas."""
    if any(isinstance(a, Exception) for a in each_confirmed(answers, short)):
        raise ReplicasBehind(short)


def each_confirmed(answers: Sequence[tuple[Any, bool]], short: str) -> list[Any]:
    """`run_replicated`'s answers one by one: each confirmed answer, in place of each other
    its error (a moment of a failover) or `ReplicasBehind(short)`; an error that is no
    moment of a failover is raised."""
    out = []
    for answer, ok in answers:
        if isinstance(answer, Exception) and not isinstance(answer, RETRIED_ERRORS):
            raise answer
        out.append(answer if ok or isinstance(answer, Exception) else ReplicasBehind(short))
    return out


async def _replicated(
    client: Client,
    node: ClusterNode | None,
    commands: Sequence[Command],
    replicas: int,
    timeout_ms: int,
    rider: Rider | None = None,
) -> list[tuple[Any, bool]]:
    words = [*(command for _, command in commands), ("WAIT", replicas, timeout_ms)]
    if node is None:
        pipe = client.pipeline(transaction=False)
        for command in words:
            pipe.execute_command(*command)
        answers = await execute_riding(pipe, rider)
    else:
        if isinstance(client, AgonCluster) and client.is_down(node):
            raise RedisConnectionError(f"node {node.name} is down")
        sent = [PipelineCommand(i, *command) for i, command in enumerate(words)]
        await node.execute_pipeline(sent)
        answers = [command.result for command in sent]
    acked = answers[-1]
    ok = not isinstance(acked, BaseException) and int(acked) >= replicas
    return [(a, ok and not isinstance(a, BaseException)) for a in answers[:-1]]
