"""The load test (`agon bench load`) in a tiny configuration, so that it cannot silently break.

It runs end to end against a redis-server the test starts (lent with `--redis-url`): every
service as its own OS process, 1 then 2 engines, then a gateway with spectators. Its figures
must be sane (games finished, p50 <= p99, memory per game above zero, every spectator event
delivered in order); no figure is held to a speed, since the machine is shared. Also: every
process it started is gone afterwards (a paused one too, stopped cleanly, on Ctrl-C as on
return), its keys are removed from the lent server, and bad counts are one-line errors.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest
import redis as redis_sync
import redis.asyncio as aioredis

from bench.fleet import Fleet
from bench.load import BOT, GROUPS, Tracker, print_load_table, run_load_bench, take
from schemas.codec import FIELD_BYTES, unpack
from services.bus.embedded import EmbeddedRedis
from services.bus.keys import Keys
from services.bus.text import id_ms
from services.cli import main as agon
from services.cli.pipeline import create_games
from services.engine_service import EngineService
from tests.support.procs import processes_with


def test_a_tiny_load_test_runs_end_to_end_with_sane_figures(
    redis_server_factory: Callable[..., EmbeddedRedis], capsys: pytest.CaptureFixture[str]
) -> None:
    server = redis_server_factory()
    rows = run_load_bench(
        games=10, seconds=2.0, engines="1,2", gateways="1", spectators=4, redis_url=server.url
    )
    *configs, run = rows
    assert [(r["engines"], r["gateways"]) for r in configs] == [(1, 0), (2, 0), (1, 1)]
    for r in configs:
        assert r["moves"] > 0 and r["games_ended"] > 0, r["name"]
        assert r["moves_per_sec"] > 0 and r["games_per_sec_mean"] > 0
        assert 0 <= r["latency_p50_ms"] <= r["latency_p99_ms"] <= r["latency_max_ms"]
        assert set(r["lag"]) == set(GROUPS)
        for v in r["lag"].values():  # the last sample is one of those the peak is taken over
            assert 0 <= v["end_lag"] <= v["peak_lag"] and 0 <= v["end_pending"] <= v["peak_pending"]
        m = r["memory"]
        assert m["settled"], r["name"]
        assert m["per_finished_game_bytes"] > 0
        assert m["live_games"] > 0 and m["per_live_game_bytes"] > 0
        assert {"engine 1", "redis", "client"} <= set(r["cpu_cores"])
        assert r["ratio"] > 0 and r["ratio_to"] == "1 engine"
    assert configs[0]["ratio"] == 1.0
    assert "engine 2" in configs[1]["cpu_cores"] and "gateway 1" in configs[2]["cpu_cores"]
    assert "spectators 1" in configs[2]["cpu_cores"]
    assert all(r["feed_events_missed"] == 0 for r in configs)
    assert all(r["engine_moves"] > 0 for r in configs)
    watched = configs[2]["spectator"]
    assert watched["deliveries"] > 0 and watched["sockets_opened"] >= 4
    assert 0 <= watched["p50_ms"] <= watched["p99_ms"]
    assert watched["events_missed"] == 0 and watched["errors"] == {}
    # Nothing left behind: no process, no key on the lent server, no log directory.
    assert run["process_errors"] == {} and run["logs"] is None
    assert processes_with(run["prefix"]) == []
    with redis_sync.Redis.from_url(server.url) as client:
        assert list(client.scan_iter(match=f"{run['prefix']}:*")) == []
    print_load_table(rows)
    out = capsys.readouterr().out
    assert "random against random" in out and "consumer groups: lag" in out
    assert "compete with Redis" in out and "1 gateway: spectators p99" in out
    assert "KiB per live game" in out and "Conflicts per 1,000 moves" in out


async def test_what_a_feed_lost_before_the_load_test_read_it_is_read_from_the_log(
    redis: aioredis.Redis, namespace: str
) -> None:
    """The services trim what their groups acknowledged; a load test that lags behind them
    finds a game's feed starting past its first events. It reads those from the game's log
    (each counted as filled), so its rows count every move."""
    keys = Keys(prefix=namespace, partitions=1)
    ids = await create_games(redis, keys, [("teeko", {})], 2, [BOT, BOT])
    await EngineService(redis, keys).drain()
    rows = await redis.xrange(keys.feed(0))
    assert len(rows) == 8  # created, two seats, started: per game
    await redis.xtrim(
        keys.feed(0), minid=rows[3][0], approximate=False
    )  # the first game's first three went
    tracker = Tracker()
    for entry_id, fields in await redis.xrange(keys.feed(0)):
        await take(redis, keys, tracker, id_ms(entry_id), unpack(fields[FIELD_BYTES]))
    assert (tracker.filled, tracker.missed) == (3, 0)
    assert {g: head for g, (head, _) in tracker.heads.items()} == dict.fromkeys(ids, 4)


def test_every_process_stops_on_ctrl_c_even_a_paused_one(
    redis_server_factory: Callable[..., EmbeddedRedis],
) -> None:
    server = redis_server_factory()
    with pytest.raises(KeyboardInterrupt), Fleet(server.url, "load-t-stop") as fleet:
        engine = fleet.start("engine")
        asyncio.run(fleet.ready([engine]))
        fleet.pause(engine)
        raise KeyboardInterrupt
    # SIGCONT before SIGTERM: the engine stopped on its own (0), not by SIGKILL.
    assert engine.process.returncode == 0
    assert fleet.running == [] and not fleet.dir.exists()
    assert processes_with("load-t-stop") == []


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--engines", "0"], "--engines wants whole numbers ≥ 1"),
        (["--engines", "1,two"], "--engines wants whole numbers ≥ 1"),
        (["--gateways", "-1"], "--gateways wants whole numbers ≥ 1"),
        (["--games", "0"], "--games wants a whole number ≥ 1"),
        (["--seconds", "0"], "--seconds wants a number > 0"),
        (["--game", "chess"], "chess"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert agon(["bench", "load", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("agon bench: ") and message in err
    assert len(err.strip().splitlines()) == 1
