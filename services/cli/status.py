"""`agon status`: a deployment at a glance, read from Redis.

What it shows, all read in one pipeline (and one INFO per primary):

- processes: every heartbeat in `Keys.processes` (engines, projectors, dispatchers, bot
  workers, gateways, directors): role, host and pid, the age of its last beat, alive or
  stale (no beat for `ALIVE_MS`, the one rule of `services.bus.presence`, by which other
  consumers claim its work),
  how many replicas its writes wait for (`--ack-replicas`), and the counters it beats with;
- consumer groups: lag (entries not yet delivered) and pending entries (delivered, not
  acknowledged) of every group on each partition's command stream and feed and on each bot
  inbox (built-in, registered and served bots), summed per group with the worst partition
  or inbox named; the reply stream of each gateway (no group: a gateway reads its replies
  as they come) with its length; dead letters;
- games: waiting, playing (live) and finished, from the projector's status index;
  tournaments, all and active;
- Redis: single server or cluster (and its state), and per primary its role, version,
  memory used against `maxmemory`, eviction policy, AOF and replicas.

A rich table by default, one JSON object with `--json`; `--watch S` redraws every S
seconds. `--check` is for health checks: exit 0 when a process (with `--here`: one on
this host, i.e. this container) has beaten within `ALIVE_MS` (0.7 s), else 1. A Redis that cannot be
reached, or that refuses the reads, is one line on stderr and exit 1; one that goes away
once it answered (a failover) is said in one line and waited for, up to `--wait-s` (not
with `--check`: a health check answers at once).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import socket
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from redis.asyncio.cluster import RedisCluster
from redis.exceptions import RedisError, ResponseError
from rich.console import Group, RenderableType
from rich.live import Live
from rich.table import Table
from rich.text import Text

from services.bus.clients import STATUSES, QueryClient
from services.bus.connection import Client, RedisUnavailable, connect, redact, ride_out
from services.bus.keys import Keys
from services.bus.presence import Beat, GroupRow, alive, group_totals, rows_of
from services.bus.text import as_text, now_ms
from services.cli.common import (
    WHICH_REDIS,
    add_service_arguments,
    add_wait_argument,
    make_console,
    say_arena,
    setup_logging,
)
from services.cli.options import UsageError, positive_float

#: INFO sections read from every primary (several sections in one INFO: Redis >= 7).
INFO_SECTIONS = ("server", "memory", "replication", "persistence")
#: Groups in the order the table lists them (others follow by name).
GROUP_ORDER = ("engine", "projector", "dispatcher", "workers")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_service_arguments(parser, private=False)
    add_wait_argument(parser)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument(
        "--watch", type=positive_float, metavar="SECONDS", help="redraw every SECONDS"
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="exit 0 if a process has beaten within 0.7 s, else 1 (for health checks)",
    )
    parser.add_argument(
        "--here", action="store_true", help="only the processes of this host (container)"
    )


def run(args: argparse.Namespace) -> int:
    setup_logging(args.verbose)
    if not args.redis_url:
        raise UsageError(WHICH_REDIS)
    say_arena(args)
    keys = Keys(args.prefix, args.partitions)
    try:
        return asyncio.run(_main(args, keys))
    except KeyboardInterrupt:
        if args.watch:
            return 0  # Ctrl-C is how a watch ends
        raise


def _fail(message: str) -> int:
    print(f"agon status: {message}", file=sys.stderr)
    return 1


def _refusal(exc: Exception) -> str:
    """One line for a Redis that failed a read: away, or refusing this user."""
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    if isinstance(exc, ResponseError) and ("NOPERM" in text or "NOAUTH" in text):
        return f"Redis refused a read ({text}): use a user that may read the deployment"
    return f"Redis failed a read ({text})"


async def _main(args: argparse.Namespace, keys: Keys) -> int:
    try:
        redis = await connect(args.redis_url, wait_s=0)
    except RedisUnavailable as exc:
        return _fail(str(exc))
    except RedisError as exc:  # e.g. a cluster whose slots are not all served
        return _fail(f"cannot use Redis at {redact(args.redis_url)}: {exc}")
    try:
        if args.check:
            return await _check(redis, keys, here=args.here)
        if args.watch:
            return await _watch(redis, keys, args)
        try:
            status = await ride_out(
                lambda: collect(redis, keys, url=args.redis_url, here=args.here),
                wait_s=args.wait_s,
                say=lambda line: print(f"agon status: {line}", file=sys.stderr, flush=True),
            )
        except RedisUnavailable as exc:
            return _fail(str(exc))
        except (RedisError, OSError) as exc:
            return _fail(_refusal(exc))
        if args.json:
            print(json.dumps(status))
        else:
            make_console().print(render(status))
        return 0
    finally:
        with contextlib.suppress(Exception):
            await redis.aclose()


async def _watch(redis: Client, keys: Keys, args: argparse.Namespace) -> int:
    """Collect and show every `args.watch` seconds until interrupted; Redis going away is
    shown, and the next round tries again."""
    console = make_console()
    with contextlib.ExitStack() as stack:
        live = None if args.json else stack.enter_context(Live(console=console))
        while True:
            try:
                status = await collect(redis, keys, url=args.redis_url, here=args.here)
                shown: RenderableType = render(status)
            except (RedisError, OSError) as exc:
                status = {"error": _refusal(exc), "time": now_ms()}
                shown = Text(f"{_refusal(exc)}; trying again in {args.watch:g} s", style="red")
            if live is None:
                print(json.dumps(status), flush=True)
            else:
                live.update(shown)
            await asyncio.sleep(args.watch)


async def _check(redis: Client, keys: Keys, *, here: bool) -> int:
    """Health check: a process (of this host with `here`) beat within `ALIVE_MS`."""
    try:
        beats = await QueryClient(redis, keys).processes()
    except (RedisError, OSError) as exc:
        return _fail(_refusal(exc))
    now = now_ms()
    host = socket.gethostname()
    chosen = [
        _process(name, beat, now) for name, beat in beats.items() if not here or beat.host == host
    ]
    live = sorted(p["name"] for p in chosen if p["alive"])
    where = f" on {host}" if here else ""
    if not live:
        return _fail(f"no live process{where} ({len(chosen)} stale)")
    print(f"ok: {len(live)} live process(es){where}: {', '.join(live[:4])}")
    return 0


# -- collecting -----------------------------------------------------------------------------
def _process(name: str, beat: Beat, now: int) -> dict[str, Any]:
    return {
        "name": name,
        "role": beat.role,
        "group": beat.group or None,
        "host": beat.host,
        "pid": beat.pid,
        "age_ms": max(0, now - beat.time),
        "alive": alive(beat, now),
        # replicas its writes wait for; None for a process that does not say (a gateway)
        "ack_replicas": beat.stats.get("ack_replicas"),
        "stats": {k: v for k, v in beat.stats.items() if k != "ack_replicas"},
    }


def _answer(value: Any) -> Any:
    """A pipeline answer; None where the key does not exist. Any other error raises: a
    refusal (NOPERM) or a lost connection must not pass for an empty deployment."""
    if isinstance(value, ResponseError) and "no such key" in str(value).lower():
        return None
    if isinstance(value, Exception):
        raise value
    return value


def _bots_served(processes: Sequence[dict[str, Any]]) -> set[str]:
    return {p["role"][4:] for p in processes if p["role"].startswith("bot-")}


async def collect(
    redis: Client, keys: Keys, *, url: str = "", here: bool = False
) -> dict[str, Any]:
    """Everything `agon status` shows, as a JSON-able dict."""
    from bots import bot_names  # the built-in bots' inboxes; imported only here

    now = now_ms()
    beats = await QueryClient(redis, keys).processes()
    host = socket.gethostname()
    processes = sorted(
        (
            _process(name, beat, now)
            for name, beat in beats.items()
            if not here or beat.host == host
        ),
        key=lambda p: (p["role"], p["name"]),
    )
    registered: Any = await redis.hkeys(keys.registered_bots())
    bots = sorted({*bot_names(), *(as_text(b) for b in registered), *_bots_served(processes)})
    parts = list(keys.all_partitions())
    streams = [(keys.commands(p), f"partition {p}") for p in parts]
    streams += [(keys.feed(p), f"partition {p}") for p in parts]
    streams += [(keys.bot_turns(b), f"bot {b}") for b in bots]
    gateways = [p for p in processes if p["role"] == "gateway"]

    pipe = redis.pipeline(transaction=False)
    for stream, _ in streams:
        pipe.xinfo_groups(stream)
    for g in gateways:
        pipe.xlen(str(g["stats"].get("replies") or keys.reply_stream(g["name"])))
    for p in parts:
        pipe.xlen(keys.dead_letter(p))
    pipe.xlen(keys.reader_dead_letter())
    for p in parts:
        for s in STATUSES:
            pipe.zcard(keys.index_status(p, s))
        pipe.zcard(keys.games(p))
    pipe.zcard(keys.tournaments())
    pipe.zcard(keys.active_tournaments())
    answers = iter([_answer(a) for a in await pipe.execute(raise_on_error=False)])

    rows = rows_of([stream for stream, _ in streams], [next(answers) for _ in streams])
    replies = [
        {
            "gateway": g["name"],
            "stream": str(g["stats"].get("replies") or keys.reply_stream(g["name"])),
            "entries": int(next(answers) or 0),
            "alive": g["alive"],
        }
        for g in gateways
    ]
    dead_commands = sum(int(next(answers) or 0) for _ in parts)
    dead_readers = int(next(answers) or 0)
    games = dict.fromkeys((*STATUSES, "total"), 0)
    for _ in parts:
        for s in (*STATUSES, "total"):
            games[s] += int(next(answers) or 0)
    tournaments = {"total": int(next(answers) or 0), "active": int(next(answers) or 0)}
    return {
        "time": now,
        "url": redact(url) if url else None,
        "prefix": keys.prefix,
        "partitions": keys.partitions,
        "redis": await servers(redis),
        "processes": processes,
        "groups": _groups(rows, dict(streams)),
        "replies": replies,
        "dead_letters": {"commands": dead_commands, "readers": dead_readers},
        "games": {
            "waiting": games["waiting"],
            "live": games["playing"],
            "finished": games["ended"],
            "total": games["total"],
        },
        "tournaments": tournaments,
    }


def _groups(found: Sequence[GroupRow], where: Mapping[str, str]) -> list[dict[str, Any]]:
    """The group rows of every stream (`where` says what each stream is), summed per group,
    each with its worst stream."""
    by_group: dict[str, list[dict[str, Any]]] = {}
    for r in found:
        by_group.setdefault(r.group, []).append(
            {
                "stream": r.stream,
                "where": where[r.stream],
                "consumers": r.consumers,
                "lag": r.lag,
                "pending": r.pending,
            }
        )
    totals = group_totals(found)
    out = []
    order = {name: i for i, name in enumerate(GROUP_ORDER)}
    for name in sorted(by_group, key=lambda n: (order.get(n, len(order)), n)):
        rows = by_group[name]
        worst = max(rows, key=lambda r: ((r["lag"] or 0) + r["pending"], r["pending"]))
        backlog = (worst["lag"] or 0) + worst["pending"]
        lag, pending = totals[name]
        out.append(
            {
                "group": name,
                "streams": len(rows),
                "consumers": max(r["consumers"] for r in rows),
                "lag": lag,
                "lag_unknown": sum(r["lag"] is None for r in rows),
                "pending": pending,
                "worst": worst if backlog else None,
                "by_stream": rows,
            }
        )
    return out


async def servers(redis: Client) -> dict[str, Any]:
    """The server, or the cluster's state and each primary: role, version, memory, AOF."""
    if not isinstance(redis, RedisCluster):
        info: Any = await redis.info(*INFO_SECTIONS)
        kwargs = redis.connection_pool.connection_kwargs
        name = kwargs.get("path") or f"{kwargs.get('host')}:{kwargs.get('port')}"
        return {"cluster": False, "state": "ok", "nodes": [_node(str(name), info)]}
    primaries = redis.get_primaries()
    infos = await asyncio.gather(*(redis.info(*INFO_SECTIONS, target_nodes=n) for n in primaries))
    cluster: Any = await redis.cluster_info()
    return {
        "cluster": True,
        "state": cluster.get("cluster_state"),
        "known_nodes": int(cluster.get("cluster_known_nodes", 0)),
        "slots_ok": int(cluster.get("cluster_slots_ok", 0)),
        "nodes": [_node(n.name, i) for n, i in zip(primaries, infos, strict=True)],
    }


def _node(name: str, info: dict[str, Any]) -> dict[str, Any]:
    return {
        "node": name,
        "role": info.get("role"),
        "version": info.get("redis_version"),
        "used_memory": int(info.get("used_memory", 0)),
        "used_memory_human": info.get("used_memory_human"),
        "maxmemory": int(info.get("maxmemory", 0)),
        "maxmemory_human": info.get("maxmemory_human"),
        "maxmemory_policy": info.get("maxmemory_policy"),
        "aof": bool(int(info.get("aof_enabled", 0))),
        "replicas": int(info.get("connected_slaves", 0)),
    }


# -- showing --------------------------------------------------------------------------------
def _age(ms: int) -> str:
    if ms < 60_000:
        return f"{ms / 1000:.1f} s"
    if ms < 3_600_000:
        return f"{ms // 60_000} min"
    return f"{ms // 3_600_000} h"


def render(status: dict[str, Any]) -> RenderableType:
    """The status as rich tables: Redis, processes, groups, then the counts."""
    r = status["redis"]
    kind = f"Redis Cluster, state {r['state']}" if r["cluster"] else "Redis, single server"
    head = Text.assemble(
        ("agon status ", "bold"),
        f"{status['url'] or ''} · prefix {status['prefix']} · {status['partitions']} partitions"
        f" · {kind}",
    )
    return Group(head, _nodes(r), _processes(status), _group_table(status), _counts(status))


def _nodes(r: dict[str, Any]) -> Table:
    table = Table(title="Redis primaries" if r["cluster"] else None, title_justify="left")
    for column in ("node", "role", "version", "memory", "maxmemory", "policy", "AOF", "replicas"):
        table.add_column(column)
    for n in r["nodes"]:
        limit = "unset"
        if n["maxmemory"]:
            share = 100 * n["used_memory"] / n["maxmemory"]
            limit = f"{n['maxmemory_human']} ({share:.0f}% used)"
        table.add_row(
            n["node"], n["role"], n["version"], n["used_memory_human"], limit,
            n["maxmemory_policy"], "on" if n["aof"] else "[red]off[/]", str(n["replicas"]),
        )  # fmt: skip
    return table


def _processes(status: dict[str, Any]) -> Table:
    procs = status["processes"]
    stale = sum(not p["alive"] for p in procs)
    title = f"processes: {len(procs) - stale} alive, {stale} stale"
    table = Table(title=title, title_justify="left")
    table.add_column("name", overflow="fold")  # it names the consumer: never cut it
    for column in ("role", "host/pid", "last beat", "state", "waits for", "counters"):
        table.add_column(column)
    for p in procs:
        stats = " ".join(f"{k}={v}" for k, v in p["stats"].items() if k not in ("replies",))
        state = "alive" if p["alive"] else "[red]stale[/]"
        where = f"{p['host']}/{p['pid']}"
        acks = _acks(p["ack_replicas"])
        table.add_row(p["name"], p["role"], where, _age(p["age_ms"]), state, acks, stats)
    return table


def _acks(replicas: Any) -> str:
    """What a process's writes wait for, as the table shows it."""
    if replicas is None:
        return "-"
    if not replicas:
        return "none"
    return f"{replicas} replica{'s' * (replicas != 1)}"


def _group_table(status: dict[str, Any]) -> Table:
    table = Table(title="consumer groups", title_justify="left")
    for column in ("group", "streams", "consumers", "lag", "pending", "worst"):
        table.add_column(column)
    for g in status["groups"]:
        worst = "-"
        if g["worst"] is not None:
            w = g["worst"]
            worst = f"{w['where']}: lag {w['lag'] if w['lag'] is not None else '?'}"
            worst += f", pending {w['pending']}"
        lag = str(g["lag"]) + (f" (+{g['lag_unknown']} unknown)" if g["lag_unknown"] else "")
        table.add_row(
            g["group"], str(g["streams"]), str(g["consumers"]), lag, str(g["pending"]), worst
        )
    for reply in status["replies"]:
        state = "" if reply["alive"] else " (gateway stale)"
        table.add_row(
            "gateway replies", "1", "-", "-", "-", f"{reply['gateway']}: {reply['entries']}"
            f" entries{state}",
        )  # fmt: skip
    return table


def _counts(status: dict[str, Any]) -> Text:
    g, t, d = status["games"], status["tournaments"], status["dead_letters"]
    return Text(
        f"games: {g['live']} live, {g['waiting']} waiting, {g['finished']} finished"
        f" ({g['total']} in all) · tournaments: {t['active']} active of {t['total']}"
        f" · dead letters: {d['commands']} commands, {d['readers']} readers"
    )
