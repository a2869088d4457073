"""Master failovers during play on a real Redis Cluster of three masters with a replica each.

Drivers play Teeko as people do (create, take both seats, move, each step a command awaited
for its reply), and write down every event the engine acknowledged; beside them, games of
the random bot against itself are started all the time, and each must end (a bot's turn or
its move lost with a master would leave its game waiting for ever). Meanwhile every master
in turn dies with SIGKILL half a second after its replica lost its link (the replica is
stopped with SIGSTOP, the master drops the link, SIGCONT once the master is dead); the
replica takes over with what it had, and the killed node comes back as a replica. With the
engine waiting for a replica (`WAIT 1`) before it replies, no acknowledged event may be
missing from the logs afterwards, and every bot game ends (the dispatcher and the workers
wait for a replica too); without it, what was lost is counted and printed (Redis
replicates asynchronously: a master that dies takes the writes no replica has with it).
The services and the drivers are never restarted: their clients follow the slots to the
new masters by themselves.
"""

from __future__ import annotations

import asyncio
import time

from redis.asyncio.cluster import RedisCluster

from services.bus.clients import CommandClient
from services.bus.connection import connect
from services.bus.keys import Keys
from services.cli.pipeline import ServiceSet
from services.projector import verify
from tests.support.cluster import RedisClusterProcesses
from tests.support.faults import (
    FaultLine,
    Tally,
    bot_games,
    drive,
    lost_and_doubled,
    record,
    settle,
    unfinished,
)

GAMES = 8
#: Play between failovers (s): enough for every driver to get moves acknowledged.
PLAY_S = 1.5
#: How long each victim's replica falls behind before its master is killed (s).
LAG_S = 0.5
#: How long play may take to resume after the last failover (s).
RECOVER_S = 20.0


async def failover_run(ack_replicas: int) -> tuple[FaultLine, Tally]:
    """Play through one failover of each master; its fault line (recorded) and the tally."""
    with RedisClusterProcesses(masters=3, replicas=1, node_timeout_ms=1000) as cluster:
        redis = await connect(cluster.url)
        assert isinstance(redis, RedisCluster)
        keys = Keys(prefix="fo")
        services = ServiceSet(
            redis,
            keys,
            bots=["random"],
            director=False,
            claim_idle_ms=2000,
            ack_replicas=ack_replicas,
        )
        tally = Tally()
        await services.start()
        try:
            async with CommandClient(redis, keys, timeout_s=1.0) as client:
                stop_at = time.monotonic() + 3600  # until the failovers are done
                bots: list[str] = []
                drivers = [
                    asyncio.create_task(drive(redis, keys, client, n, stop_at, tally))
                    for n in range(GAMES)
                ]
                drivers.append(asyncio.create_task(bot_games(client, stop_at, tally, bots)))
                failovers = 0
                for _ in range(3):
                    await asyncio.sleep(PLAY_S)
                    victim = cluster.current_master_ports()[failovers % 3]
                    await asyncio.to_thread(cluster.kill_holding_unreplicated_writes, victim, LAG_S)
                    failovers += 1
                # Play goes on without a restart: count the time to the next acknowledgement.
                before, since = len(tally.acked), time.monotonic()
                while len(tally.acked) <= before + GAMES and time.monotonic() - since < RECOVER_S:
                    await asyncio.sleep(0.05)
                tally.recovery_s = time.monotonic() - since
                assert len(tally.acked) > before + GAMES, "play did not resume after failover"
                for task in drivers:
                    task.cancel()
                await asyncio.gather(*drivers, return_exceptions=True)
                # Without WAIT some never end: counting them needs no long wait.
                stalled = await unfinished(redis, keys, bots, RECOVER_S if ack_replicas else 5.0)
                assert services.failed() is None, services.failed()
            await settle(redis, keys, {a.game_id for a in tally.acked})
            lost, doubled = await lost_and_doubled(redis, keys, tally)
            problems = (await verify(redis, keys)).problems
            assert failovers == 3
            line = FaultLine(
                f"master failover x3, {'WAIT 1' if ack_replicas else 'no WAIT'}",
                games=len({a.game_id for a in tally.acked}),
                acked=len(tally.acked),
                lost=lost,
                doubled=doubled,
                wedged=len(stalled),
                problems=len(problems),
                promise=ack_replicas > 0,
                note=f"resumed in {tally.recovery_s:.1f} s, {tally.unanswered} commands "
                f"re-sent, {tally.resyncs} drivers re-read a log, {len(bots)} bot games"
                + "".join(f"\n  {p}" for p in [*stalled, *problems][:5]),
            )
            record(line)
            return line, tally
        finally:
            await services.stop()
            await redis.aclose()


async def test_failovers_lose_no_acknowledged_event_with_wait() -> None:
    line, tally = await failover_run(ack_replicas=1)
    assert line.clean and tally.resyncs == 0, str(line)


async def test_failovers_without_wait_count_what_is_lost() -> None:
    # Nothing is promised without WAIT: the count is printed, and play went on throughout.
    line, _ = await failover_run(ack_replicas=0)
    assert line.acked > 0 and line.doubled == 0, str(line)
