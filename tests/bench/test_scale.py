"""The scale harness (`agon bench scale`) on two simulated hosts for a few seconds, so that it
cannot silently break.

It builds the real layout (a network namespace and a CPU-quota cgroup per host, a Redis Cluster
master on each with its replica on the other, every service as its own process) and runs the
load through it. Its figures must be sane: moves flowed, p50 <= p99, each host's CPU stayed
under its quota (with a margin for the accounting), conflicts and Redis commands per move were
counted, the efficiency is printed. Nothing may be left behind: no agon-h* namespace, no link,
no agon-scale cgroup, no process on the hosts' addresses, on return as on SIGTERM. It skips,
saying why, only where namespaces or cgroups are unavailable (not root, no `ip`, no cgroup v1
cpu controller); no figure is held to a speed, since the machine is shared.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import redis as redis_sync
import redis.asyncio as aioredis

from bench.cluster import TOTAL_SLOTS, slot_ranges
from bench.fleet import Fleet
from bench.load import Tracker
from bench.scale import (
    BOT,
    CGROUP,
    CPU_ROOT,
    CPUACCT_ROOT,
    SUBNET,
    Feeds,
    FirstMove,
    Lab,
    listen_ports,
    log_time,
    our_links,
    our_namespaces,
    print_scale_table,
    resumption,
    run_scale_bench,
    stuck,
    told_slowest,
    with_efficiency,
)
from schemas.codec import FIELD, FIELD_BYTES, encode, unpack
from schemas.turns import TurnRequest
from services.bus.embedded import EmbeddedRedis
from services.bus.keys import WORKERS_GROUP, Keys
from services.bus.reader import ensure_group
from services.bus.text import now_ms
from services.cli import main as agon
from services.cli.common import LOG_FORMAT
from services.cli.pipeline import create_games
from services.engine_service import EngineService
from tests.support.procs import processes_with

ROOT = Path(__file__).resolve().parents[2]
LAB = Lab.probe()
needs_the_lab = pytest.mark.skipif(
    not (LAB.namespaces and LAB.cgroups), reason="; ".join(LAB.notes) or "no lab"
)
CPU = 0.3


def assert_nothing_left() -> None:
    assert our_namespaces() == [] and our_links() == []
    assert not (CPU_ROOT / CGROUP).exists() and not (CPUACCT_ROOT / CGROUP).exists()
    assert processes_with(f"{SUBNET}.") == []


def test_the_hosts_gateways_each_read_a_reply_stream_of_their_own(
    redis_server_factory: Callable[..., EmbeddedRedis],
) -> None:
    """The harness runs a `bench.gateway` on each host. Under one shared name they shared one
    reply stream: each gateway read, decoded and dropped every other's replies, so that a
    gateway's CPU a move grew with the hosts. Each command a gateway sends names its own."""
    server = redis_server_factory()
    keys = Keys(prefix="names")

    def sent(redis: redis_sync.Redis) -> list[dict[str, Any]]:
        return [
            unpack(fields[FIELD_BYTES])
            for p in keys.all_partitions()
            for _, fields in redis.xrange(keys.commands(p))
        ]

    async def create(url: str) -> None:
        body = {"game": "teeko", "seats": [{"bot": "random"}, {"bot": "random"}]}
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2.0)) as http:
            # No engine runs here: the command is sent, its reply never comes.
            with contextlib.suppress(TimeoutError):
                await http.post(f"{url}/api/games", json=body)

    with (
        Fleet(server.url, keys.prefix, name="names") as fleet,
        redis_sync.Redis.from_url(server.url) as redis,
    ):
        gateways = [fleet.start("gateway", module="bench.gateway") for _ in range(2)]
        fleet.wait_ready(gateways)
        for gateway in gateways:
            asyncio.run(create(gateway.url))
        deadline = time.monotonic() + 10.0
        while len(commands := sent(redis)) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
    assert len(commands) >= 2  # (a command unanswered for 10 s is sent again)
    assert len({c["reply_to"] for c in commands}) == 2, [c["reply_to"] for c in commands]


def test_listen_ports_are_distinct_free_and_never_ephemeral() -> None:
    """A host's listener never gets a port its own outgoing connections may hold (the
    kernel's ephemeral range), nor one a listener on this machine holds."""
    low = min(int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0]), 32768)
    ports = listen_ports()
    first = next(ports)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", first + 1))
        taken.listen()
        more = list(itertools.islice(ports, 200))
    assert first + 1 not in more, "a port in use was handed out"
    assert len({first, *more}) == 201
    assert all(10_000 <= p < low for p in [first, *more])


@needs_the_lab
@pytest.mark.timeout(900)
def test_two_hosts_for_a_few_seconds_with_sane_figures_and_nothing_left(
    capsys: pytest.CaptureFixture[str],
) -> None:
    rows = run_scale_bench(hosts="2", cpu=CPU, seconds=3.0, games=8, say=lambda _: None)
    (row, run) = rows
    assert row["hosts"] == 2 and row["cpu_quota"] == CPU
    assert row["moves"] > 0 and row["moves_per_sec"] > 0
    assert 0 <= row["latency_p50_ms"] <= row["latency_p99_ms"]
    assert len(row["host_cpu_cores"]) == 2
    for cores in row["host_cpu_cores"]:
        assert 0 < cores <= CPU * 1.15
    assert row["engine_moves"] > 0 and row["conflicts_per_1k_moves"] >= 0
    assert row["redis_ops_per_move"] > 0
    assert row["people"]["acknowledged"] > 0
    assert row["efficiency"] == 1.0  # the only count is its own baseline
    assert row["process_errors"] == {}
    assert run["layout"] == "network namespaces" and run["quotas"]
    assert run["left_after_cleanup"] == [] and run["logs"] == []
    assert_nothing_left()
    print_scale_table(rows)
    out = capsys.readouterr().out
    assert "efficiency" in out and "CPU per host" in out and "1.00" in out


@needs_the_lab
@pytest.mark.timeout(600)
def test_sigterm_mid_run_leaves_nothing_behind() -> None:
    argv = [sys.executable, "-m", "services.cli", "bench", "scale", "--hosts", "2",
            "--cpu", str(CPU), "--seconds", "120"]  # fmt: skip
    with subprocess.Popen(
        argv, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    ) as process:
        assert process.stderr is not None
        seen = []
        deadline = time.monotonic() + 300
        for line in process.stderr:
            seen.append(line)
            if "measuring" in line or time.monotonic() > deadline:
                break
        assert any("measuring" in line for line in seen), "".join(seen)
        os.kill(process.pid, signal.SIGTERM)
        process.stderr.read()
        assert process.wait(timeout=120) != 0
    assert_nothing_left()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--hosts", "0"], "--hosts wants whole numbers ≥ 1"),
        (["--hosts", "1,x"], "--hosts wants whole numbers ≥ 1"),
        (["--cpu", "0"], "--cpu wants cores per host > 0"),
        (["--seconds", "0"], "--seconds wants a number > 0"),
        (["--hosts", "1,2", "--kill-host"], "--kill-host needs 3 hosts or more"),
        (["--repeat", "0"], "--repeat wants a whole number ≥ 1"),
        (["--pace-ms", "-1"], "--pace-ms wants milliseconds ≥ 0"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert agon(["bench", "scale", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("agon bench: ") and message in err
    assert len(err.strip().splitlines()) == 1


def window(hosts: int, moves: float) -> dict[str, Any]:
    """A window's row with what the efficiency and the table read."""
    return {
        "name": f"{hosts} host{'s' * (hosts != 1)}, window 1", "hosts": hosts, "cpu_quota": 0.2,
        "moves_per_sec": moves, "latency_p50_ms": 100.0, "latency_p99_ms": 500.0,
        "conflicts_per_1k_moves": 0.0, "redis_ops_per_move": 30.0, "loadgen_cores": 0.05,
        "load_average_before": 1.0, "host_cpu_cores": [0.2] * hosts,
        "host_throttled": [0.5] * hosts, "people": {"acknowledged": 9, "offered": 10},
    }  # fmt: skip


def test_the_efficiency_is_of_the_medians_of_the_windows(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # One one-host window alone set every count's efficiency: with 40 as the baseline the
    # two-host windows would read 1.00-1.12, against the median of the three 0.89.
    curve = [window(1, 45.0), window(2, 80.0), window(1, 40.0), window(2, 90.0)]
    curve += [window(1, 50.0), window(2, 70.0)]
    summaries = with_efficiency(curve, repeat=3)
    assert [w["efficiency"] for w in curve] == [1.0, 0.889, 0.889, 1.0, 1.111, 0.778]
    assert [(r["name"], r["moves_per_sec"], r["efficiency"]) for r in summaries] == [
        ("1 host, median of 3", 45.0, 1.0),
        ("2 hosts, median of 3", 80.0, 0.889),
    ]
    assert with_efficiency([window(1, 40.0), window(2, 60.0)], repeat=1) == []
    print_scale_table([*curve, *summaries])
    out = capsys.readouterr().out
    assert "2 hosts, median of 3" in out and "0.89" in out


def test_hosts_under_their_quota_are_not_said_held_back_by_the_machine_alone(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Paced bots on four hosts used 0.26 of 0.4 cores each on a machine half idle: the
    # table blamed the machine.
    under, full = window(4, 100.0), window(4, 150.0)
    under["host_cpu_cores"] = [0.1] * 4
    print_scale_table([under, full, {"name": "run", "cores": 2}])
    lines = [line for line in capsys.readouterr().out.splitlines() if "the hosts used" in line]
    assert len(lines) == 1 and "0.10 of their 0.2 cores" in lines[0]
    assert "the load offered was" in lines[0] and "its load average before: 1.0" in lines[0]


def test_each_master_holds_an_equal_share_of_the_partitions() -> None:
    keys = Keys()
    hot = [keys.slot(p) for p in keys.all_partitions()]
    for masters in range(1, 9):
        ranges = slot_ranges(masters, hot)
        assert ranges[0][0] == 0 and ranges[-1][1] == TOTAL_SLOTS - 1
        assert all(a[1] + 1 == b[0] for a, b in itertools.pairwise(ranges))
        held = [sum(lo <= s <= hi for s in hot) for lo, hi in ranges]
        assert max(held) - min(held) <= 1, (masters, held)
    # (even ranges leave half of eight masters without a partition)
    assert min(sum(lo <= s <= hi for s in hot) for lo, hi in slot_ranges(8)) == 0


def test_play_resumes_when_every_bot_game_in_play_moved_again() -> None:
    """The games in play at the kill are measured, each from its own next move (or end):
    not a partition's first move, which a game created after the kill could make while a
    game in play there still waits, and which a partition whose games had just ended
    never makes. People's games are told apart: they move when the load offers. A game
    whose end came before the kill, though the feeds were read after it, was not in play
    (a kill-host run waited 60 s on one and reported play never resumed)."""
    in_play = {"b1": 0, "b2": 0, "b3": 1, "h1": 1}
    bots = {"b1", "b2", "b3"}
    killed = 10_000
    after = {"b1": 10_500, "b2": 13_000, "b3": 11_000, "h1": 25_000, "new": 10_100}
    got = resumption(in_play, bots, after, killed, on_dead={1}, ended_at={})
    assert got["resumed_s"] == 3.0, got
    assert (got["resumed_dead_master_s"], got["resumed_survivors_s"]) == (1.0, 3.0)
    assert got["resumed_by_partition_s"] == {0: 3.0, 1: 1.0}
    assert (got["people_games_in_play"], got["people_resumed_s"]) == (1, 15.0)
    waiting = resumption(in_play, bots, {"b1": 10_500}, killed, on_dead={1}, ended_at={})
    assert waiting["resumed_s"] is None and waiting["bot_games_not_resumed"] == ["b2", "b3"]
    ended = {"b2": 9_900, "b3": 12_000}  # b2 ended before the kill, b3 after
    late = resumption(in_play, bots, {"b1": 10_500}, killed, on_dead={1}, ended_at=ended)
    assert late["bot_games_not_resumed"] == ["b3"] and late["bot_games_in_play"] == 2


def test_the_kill_is_told_at_the_time_the_services_logs_write() -> None:
    killed_ms = 1_764_500_466_250
    record = logging.LogRecord("agon.bus", logging.INFO, __file__, 1, "x", None, None)
    record.created, record.msecs = killed_ms / 1000, killed_ms % 1000
    stamp = logging.Formatter(LOG_FORMAT).format(record).split(" ")[1]
    assert log_time(killed_ms) == stamp == stamp[:8] + ",250"


def test_the_slowest_game_to_move_again_shows_where_its_move_waited() -> None:
    """The last bot game in play to move again is named with its first move's wait split
    between the dispatcher and inbox (the move's lag), the worker (its think time) and
    the engine (the rest, to the move's entry); one that ended rather than moved has no
    split, and the printed line leaves it out."""
    in_play, bots, killed = {"b1": 0, "b2": 3}, {"b1", "b2"}, 10_000
    after = {"b1": 10_500, "b2": 12_900}
    # b2's turn came 0.1 s before the kill, reached a worker 1.5 s later, was answered in
    # 0.2 s, and the engine played it 1.3 s after that.
    first = {"b2": FirstMove(9_900, 12_900, 1_500, 200)}
    got = resumption(in_play, bots, after, killed, {3}, {}, first)["slowest"]
    assert got == {
        "game": "b2", "partition": 3, "resumed_s": 2.9, "turn_given_s": -0.1,
        "delivered_after_s": 1.5, "sent_after_s": 0.2, "played_after_s": 1.3,
    }, got  # fmt: skip
    # The platform's part leaves b2's 0.2 s of thinking out: 2.7 s; b1 (no split) 0.5 s.
    assert resumption(in_play, bots, after, killed, {3}, {}, first)["resumed_platform_s"] == 2.7
    # Only the thinking after the kill: a turn taken 0.3 s before it, thought on for 0.5 s.
    assert FirstMove(9_500, 10_400, 200, 500).thinking_after(killed) == 0.2
    ended = resumption(in_play, bots, after, killed, {3}, {}, {})["slowest"]
    assert ended == {"game": "b2", "partition": 3, "resumed_s": 2.9}
    assert told_slowest(ended) == "" and "partition 3" in told_slowest(got)


def test_the_feeds_note_each_game_s_first_move_after_the_kill_with_its_wait() -> None:
    """Only a game's first move or end after the kill counts, its wait measured from the
    move before it; a game with no move before it, one that ended, and a move the engine
    played for a seat out of time (no bot's thinking) get no think time of their own."""
    feeds = Feeds(None, Keys(), Tracker(), None)  # type: ignore[arg-type]
    feeds.since = 10_000
    feeds.moving = {"g": (3, 9_800), "t": (1, 9_900), "e": (2, 9_950)}

    def move(game: str, ms: int, **fields: Any) -> None:
        feeds._first_after(game, 0, ms, {"type": "move_played", **fields})

    move("g", 10_500, lag_ms=100, think_ms=300)
    move("g", 10_900, lag_ms=5, think_ms=5)
    move("new", 10_200, think_ms=50)
    move("t", 10_600, lag_ms=10, think_ms=600, timeout=True)
    feeds._first_after("e", 2, 10_300, {"type": "game_ended"})
    assert feeds.next_after == {"g": 10_500, "new": 10_200, "t": 10_600, "e": 10_300}
    assert feeds.first_moves == {
        "g": FirstMove(9_800, 10_500, 100, 300),
        "t": FirstMove(9_900, 10_600, 10, 0),
    }


async def test_a_game_that_did_not_move_again_is_shown_where_it_waits(
    redis: aioredis.Redis, namespace: str
) -> None:
    """A kill-host run waited 60 s on one bot game that did not move again, and said no
    more: the report now shows, for each such game, its log's last events, its clocks and
    its turns pending in the bot's inbox, with whom."""
    keys = Keys(prefix=namespace)
    [gid] = await create_games(redis, keys, [("teeko", {})], 1, [BOT, BOT])
    await EngineService(redis, keys).drain()
    since = now_ms()
    p = keys.partition(gid)
    await redis.zadd(keys.clocks(p), {f"{gid}|1|took": since + 2000, "other|1": since})
    turn = TurnRequest(
        game_id=gid, game="teeko", options={}, moves=[], seq=1, seat=1, colour=1, bot=BOT,
        token="t",
    )  # fmt: skip
    await ensure_group(redis, keys.bot_turns(BOT), WORKERS_GROUP)
    await redis.xadd(keys.bot_turns(BOT), {FIELD: encode(turn)})
    await redis.xreadgroup(WORKERS_GROUP, "worker-1", {keys.bot_turns(BOT): ">"})
    shown = (await stuck(redis, keys, [gid], since))[gid]
    assert shown["partition"] == p
    head = unpack((await redis.xrevrange(keys.log(gid), count=1))[0][1][FIELD_BYTES])
    assert shown["tail"][0][:2] == (head["type"], head["seq"])
    assert shown["clocks"] == [(f"{gid}|1|took", 2000)]
    assert [(c, n) for c, _, n in shown["turns_pending"]] == [("worker-1", 1)]
