"""Safe by default on a replicated Redis (issue 27): one-process commands wait for a replica
when there is one, and every command rides out a failover.

- `agon up`, `agon selfplay`, `agon tournament run`, `agon match` and the one-service
  commands take `--ack-replicas N|auto` (default auto): 1 when the primary (any primary of a
  cluster) has a replica connected, else 0; a number given wins. Each service says what it
  waits for once, and beats with it (`agon status`). On a Redis without replicas nothing
  sends WAIT: as fast as before.
- The issue's scenario, on a 3-master cluster with a replica each (as `test_failover.py`):
  selfplay of Teeko and Supplier Sabotage, a master other than the one named by the URL
  killed with SIGKILL while it plays (it comes back, as an operator would bring it back, and
  follows the replica that took over); `agon verify` started the moment selfplay ends passes.
  `AGON_FAULTS=full` (`make faults`) plays more games and kills later.
- Commands started while a cluster cannot serve a master's slots (its master killed, its
  replica held still, so no failover yet) say so in one line, wait, and succeed once the
  replica takes over: no traceback.
- `agon up` on that cluster with no flag, people playing through a master that dies holding
  writes its replica lacks (as `test_failover.py` kills them): no acknowledged event lost.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import time
from collections.abc import Sequence

import pytest

from services.bus.clients import CommandClient
from services.bus.connection import connect
from services.bus.embedded import free_port
from services.bus.keys import Keys
from services.cli import build_parser
from services.cli.common import replicas_to_wait_for
from tests.conftest import PrimaryAndReplica
from tests.support.cluster import RedisClusterProcesses
from tests.support.commandstats import calls
from tests.support.faults import FaultLine, Tally, drive, lost_and_doubled, record, settle
from tests.support.procs import Proc, Processes

FULL = os.environ.get("AGON_FAULTS") == "full"
#: Every command that runs services in its process, with what it needs besides the URL.
RUNS_SERVICES: Sequence[tuple[str, ...]] = (
    ("up",),
    ("selfplay", "--game", "teeko"),
    ("tournament", "run"),
    ("match", "random", "greedy", "--game", "teeko", "--sprt", "0,10"),
    ("engine",),
    ("projector",),
    ("dispatcher",),
    ("bots",),
)
#: How long a process may take to end after its work is done (s): a generous bound.
ENDS_S = 120.0


async def chosen(url: str, *argv: str) -> dict[tuple[str, ...], int]:
    """The replicas each service-running command would wait for, given `argv` besides."""
    client = await connect(url)
    try:
        out = {}
        for command in RUNS_SERVICES:
            parser, _ = build_parser(command[0])
            args = parser.parse_args([*command, "--redis-url", url, *argv])
            out[command] = await replicas_to_wait_for(client, args)
        return out
    finally:
        await client.aclose()


async def test_auto_waits_for_a_replica_only_when_the_primary_has_one(
    primary_and_replica: PrimaryAndReplica,
) -> None:
    pair = primary_and_replica
    url = f"redis://127.0.0.1:{pair.port}/0"
    alone = await chosen(url)
    assert set(alone.values()) == {0}, alone
    await pair.follow()
    followed = await chosen(url)
    assert set(followed.values()) == {1}, followed
    # What the user states wins: the faster unsafe mode, or more replicas.
    assert set((await chosen(url, "--ack-replicas", "0")).values()) == {0}
    assert set((await chosen(url, "--ack-replicas", "2")).values()) == {2}


async def until_exit(proc: Proc, timeout_s: float = ENDS_S) -> int:
    deadline = time.monotonic() + timeout_s
    while proc.alive and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    assert not proc.alive, f"{proc.kind} still runs after {timeout_s:.0f} s:\n{proc.text()[-3000:]}"
    return int(proc.process.returncode)


@pytest.mark.parametrize("replica", [False, True], ids=["single Redis", "with a replica"])
async def test_up_says_and_beats_what_it_waits_for(
    primary_and_replica: PrimaryAndReplica, replica: bool
) -> None:
    pair = primary_and_replica
    url = f"redis://127.0.0.1:{pair.port}/0"
    if replica:
        await pair.follow()
    said = "waits for 1 replica per write" if replica else "does not wait for replicas"
    with Processes(url) as procs:
        up = procs.start("up", "--port", str(free_port()), "--bots", "random", "--prefix", "sd")
        # Games through `agon up`'s services: selfplay only drives them.
        play = procs.start(
            "selfplay", "--services", "none", "--prefix", "sd", "--game", "teeko", "--games", "3",
            wait=False,
        )  # fmt: skip
        assert await until_exit(play) == 0, play.text()[-3000:]
        status = procs.start("status", "--prefix", "sd", "--json", wait=False)
        assert await until_exit(status) == 0, status.text()
        up_text = up.text()
    beats = json.loads(status.text().strip().splitlines()[-1])["processes"]
    # The gateway and the director acknowledge nothing a failover could lose: they say nothing.
    services = {p["role"]: p["ack_replicas"] for p in beats if p["ack_replicas"] is not None}
    assert services == dict.fromkeys(
        ["engine", "projector", "dispatcher", "bot-random"], int(replica)
    ), beats
    # Each service said it once, at start.
    assert up_text.count(said) == 4, up_text
    # On a Redis without replicas the services never send WAIT: as fast as before.
    waits = await calls(pair.redis, "wait")
    assert waits > 0 if replica else waits == 0, waits


# -- the scenario: selfplay through a master's death, then verify at once ----------------
#: Games per game name, and when the master dies (s after the services are ready): the
#: issue's 60 games play in under 3 s here, so the long form plays more to be killed mid-way.
GAMES, KILL_AFTER_S = (200, 5.0) if FULL else (40, 1.0)
GAME_NAMES = ("teeko", "supplier-sabotage")
#: How long the dead master stays dead after its replica took over (s).
REVIVE_AFTER_S = 3.0


async def revive_later(cluster: RedisClusterProcesses, victim: int) -> None:
    """Once a replica took over from `victim`, bring it back after `REVIVE_AFTER_S`."""
    await asyncio.to_thread(cluster.wait_ok, 30.0)
    await asyncio.sleep(REVIVE_AFTER_S)
    cluster.revive(victim)


async def test_verify_started_as_selfplay_ends_after_a_master_died_passes() -> None:
    with (
        RedisClusterProcesses(masters=3, replicas=1, node_timeout_ms=1000) as cluster,
        Processes(cluster.url) as procs,
    ):
        named = cluster.ports[0]  # the node --redis-url names lives; another master dies
        games = [a for name in GAME_NAMES for a in ("--game", name)]
        play = procs.start(
            "selfplay", "--prefix", "sd", *games, "--games", str(GAMES),
            "--bots", "random,random",
        )  # fmt: skip
        await asyncio.sleep(KILL_AFTER_S)
        assert play.alive, f"selfplay ended before the master died:\n{play.text()[-2000:]}"
        victim = next(port for port in cluster.current_master_ports() if port != named)
        cluster.kill(victim)
        # Its replica takes over; a while later the dead node comes back and follows it, as an
        # operator (or a supervisor) brings it back: waiting for a replica needs one.
        reviving = asyncio.create_task(revive_later(cluster, victim))
        assert await until_exit(play, 300.0) == 0, play.text()[-3000:]
        verify = procs.start("verify", "--prefix", "sd", wait=False)
        status = await until_exit(verify)
        played, checked = play.text(), verify.text()
        await reviving
    total = GAMES * len(GAME_NAMES)
    ended = re.search(r"(\d+)/\d+ games ended, (\d+) moves.*", played)
    record(
        FaultLine(
            "selfplay (auto: WAIT 1), master killed, verify",
            games=total,
            acked=int(ended.group(2)) if ended else 0,  # the moves played, each acknowledged
            lost=0,
            wedged=total - (int(ended.group(1)) if ended else 0),
            problems=0 if status == 0 else 1,
            note=ended.group(0) if ended else "selfplay printed no summary",
        )
    )
    assert "waits for 1 replica per write" in played, played[-3000:]  # auto, on a cluster
    assert f"{total}/{total} games ended" in played, played[-3000:]
    assert "Traceback" not in checked, checked[-3000:]
    assert status == 0 and f"verify: {total} games" in checked and ": OK" in checked, checked


# -- a command started while a master's slots have nobody to serve them ----------------------
async def test_commands_started_during_a_failover_say_so_once_and_succeed() -> None:
    with (
        RedisClusterProcesses(masters=3, replicas=1, node_timeout_ms=1000) as cluster,
        Processes(cluster.url) as procs,
    ):
        prefix = ("--prefix", "fo")
        play = procs.start("selfplay", *prefix, "--game", "teeko", "--games", "10", wait=False)
        assert await until_exit(play) == 0, play.text()[-3000:]
        victim = next(port for port in cluster.current_master_ports() if port != cluster.ports[0])
        # No failover yet: the replica is held still, so the cluster cannot serve its slots.
        behind = cluster.replica_of(victim)
        cluster.pause(behind)
        cluster.kill(victim)
        commands = {
            "verify": procs.start("verify", *prefix, wait=False),
            "status": procs.start("status", *prefix, "--json", wait=False),
            "rebuild": procs.start("rebuild", *prefix, "--workers", "2", wait=False),
        }
        deadline = time.monotonic() + 60.0
        waiting = dict(commands)
        while waiting and time.monotonic() < deadline:
            for name, proc in list(waiting.items()):
                if "Redis unavailable" in proc.text() or not proc.alive:
                    del waiting[name]
            await asyncio.sleep(0.1)
        cluster.resume(behind)  # ... and now the replica takes over
        await asyncio.to_thread(cluster.wait_ok, 30.0)
        ended = {name: await until_exit(proc) for name, proc in commands.items()}
        texts = {name: proc.text() for name, proc in commands.items()}
    for name, text in texts.items():
        said = [line for line in text.splitlines() if "Redis unavailable" in line]
        assert ended[name] == 0 and "Traceback" not in text, f"{name}:\n{text[-3000:]}"
        assert len(said) == 1 and said[0].startswith(f"agon {name}: Redis unavailable ("), text
    assert "verify: 10 games" in texts["verify"] and ": OK" in texts["verify"], texts["verify"]


# -- `agon up` on a cluster, people playing through a master's death ---------------------------
#: People playing at once, play before the failover, the replica's lag before its master
#: dies (as test_failover.py: the master dies holding writes no replica has), and how long
#: play may take to resume (s; the engine retries what the replica did not confirm).
PEOPLE, PLAY_S, LAG_S, RECOVER_S = 6, 1.5, 0.5, 60.0


async def test_agon_up_on_a_cluster_loses_no_acknowledged_move_through_a_failover() -> None:
    with (
        RedisClusterProcesses(masters=3, replicas=1, node_timeout_ms=1000) as cluster,
        Processes(cluster.url) as procs,
    ):
        up = procs.start("up", "--prefix", "up", "--bots", "random", "--port", str(free_port()))
        redis = await connect(cluster.url)
        keys = Keys(prefix="up")
        tally = Tally()
        try:
            async with CommandClient(redis, keys, timeout_s=1.0) as client:
                stop_at = time.monotonic() + 3600  # until the failover is done
                drivers = [
                    asyncio.create_task(drive(redis, keys, client, n, stop_at, tally))
                    for n in range(PEOPLE)
                ]
                await asyncio.sleep(PLAY_S)
                victim = next(p for p in cluster.current_master_ports() if p != cluster.ports[0])
                await asyncio.to_thread(cluster.kill_holding_unreplicated_writes, victim, LAG_S)
                before, since = len(tally.acked), time.monotonic()
                while len(tally.acked) <= before + PEOPLE and time.monotonic() - since < RECOVER_S:
                    await asyncio.sleep(0.05)
                for task in drivers:
                    task.cancel()
                await asyncio.gather(*drivers, return_exceptions=True)
            resumed = len(tally.acked) > before + PEOPLE
            try:
                await settle(redis, keys, {a.game_id for a in tally.acked})
            except AssertionError as exc:  # (what the services said, to find who lost what)
                raise AssertionError(f"{exc}\n{up.text()[-6000:]}") from None
            lost, doubled = await lost_and_doubled(redis, keys, tally)
        finally:
            await redis.aclose()
        text = up.text()
    record(
        FaultLine(
            "agon up (auto: WAIT 1), master failover",
            games=len({a.game_id for a in tally.acked}),
            acked=len(tally.acked),
            lost=lost,
            doubled=doubled,
            note=f"play resumed in {time.monotonic() - since:.1f} s" if resumed else "",
        )
    )
    assert text.count("waits for 1 replica per write") == 4, text[-3000:]  # auto, on a cluster
    assert resumed, f"play did not resume after the failover:\n{text[-3000:]}"
    assert lost == 0 and doubled == 0, (
        f"{len(tally.acked)} acknowledged: {lost} lost, {doubled} doubled"
    )
