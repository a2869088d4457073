"""The fault suite's one line per scenario: what was acknowledged, lost, doubled, left dead.

Each fault test ends with `record(FaultLine(...))`; the session prints every line at the end
(`pytest_terminal_summary` in conftest.py), so `make faults` shows the whole table at once.
The honest drivers (`drive`) play Teeko as people do and write down every event the engine
acknowledged; `lost_and_doubled` compares that with the logs afterwards.

A line with `promise=False` is a measurement of what Agon does not promise (e.g. failovers
without WAIT): its losses are printed, not failed on.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from redis.exceptions import RedisClusterException, ResponseError

from engine import load_game
from engine.core import State
from schemas.base import new_command_id
from schemas.codec import unpack_event
from schemas.commands import Command, CreateGame, PlayMove, SeatPlayer, SeatSpec
from schemas.replies import Accepted, Reply
from services.bus.clients import CommandClient, QueryClient
from services.bus.connection import TRANSIENT_ERRORS, Client
from services.bus.keys import (
    DISPATCHER_GROUP,
    ENGINE_GROUP,
    PROJECTOR_GROUP,
    WORKERS_GROUP,
    Keys,
)
from services.bus.ownership import Ownership
from services.bus.text import as_text, now_ms
from services.gamelog.fold import fold


@dataclass(frozen=True)
class FaultLine:
    scenario: str
    games: int
    acked: int
    lost: int
    doubled: int = 0
    dead_consumers: int = 0
    wedged: int = 0
    problems: int = 0
    promise: bool = True
    #: anything else worth a figure (e.g. how long play took to resume)
    note: str = ""

    def __str__(self) -> str:
        verdict = "measured" if not self.promise else "ok" if self.clean else "FAILED"
        return (
            f"{self.scenario:<44} games {self.games:>4}  acked {self.acked:>6}  "
            f"lost {self.lost:>3}  doubled {self.doubled:>3}  dead consumers "
            f"{self.dead_consumers:>2}  wedged {self.wedged:>2}  verify problems "
            f"{self.problems:>3}  {verdict}" + (f"  ({self.note})" if self.note else "")
        )

    @property
    def clean(self) -> bool:
        counts = (self.lost, self.doubled, self.dead_consumers, self.wedged, self.problems)
        return not any(counts)


LINES: list[FaultLine] = []


def record(line: FaultLine) -> None:
    LINES.append(line)


# -- honest drivers: what was acknowledged, and was it kept ----------------------------------
#: What makes a driver send its command again: no reply in time, or Redis away for a moment.
RESENT: tuple[type[Exception], ...] = (TimeoutError, RedisClusterException, *TRANSIENT_ERRORS)
#: How long past its wait a count of unfinished games reads again through a failover (s).
READ_AGAIN_S = 20.0


@dataclass
class Acked:
    """An acknowledged command: the events it produced are seqs first..last of the game."""

    game_id: str
    first: int
    last: int
    kind: str
    move: str = ""


@dataclass
class Tally:
    acked: list[Acked] = field(default_factory=list)
    resyncs: int = 0
    #: per game, the move commands sent (distinct command ids)
    sent: dict[str, int] = field(default_factory=dict)
    unanswered: int = 0
    recovery_s: float = 0.0


async def ask(client: CommandClient, command: Command, stop_at: float, tally: Tally) -> Reply:
    """The command's reply, sending it again (same id) through failovers until answered."""
    while True:
        try:
            return await client.submit(command, timeout_s=1.0)
        except RESENT:
            tally.unanswered += 1
            if time.monotonic() > stop_at + 30:
                raise
            await asyncio.sleep(0.1)


async def resync(redis: Client, keys: Keys, game_id: str) -> tuple[State, int]:
    """The game as its log has it now (after a rejection: the log is the truth)."""
    entries = await QueryClient(redis, keys).log(game_id)
    game = fold(game_id, (unpack_event(e.data) for e in entries))
    assert game.state is not None
    return game.state, game.seq


async def drive(
    redis: Client, keys: Keys, client: CommandClient, n: int, stop_at: float, tally: Tally
) -> None:
    """Play games one after another until `stop_at`, recording what was acknowledged."""
    rng = random.Random(n)
    while time.monotonic() < stop_at:
        gid = f"fo{n}x{rng.randrange(10**9)}"
        seats = [SeatSpec(kind="human", name="ann"), SeatSpec(kind="human", name="bob")]
        create = CreateGame(command_id=new_command_id(), game_id=gid, game="teeko", seats=seats)
        reply = await ask(client, create, stop_at, tally)
        assert isinstance(reply, Accepted), reply
        tally.acked.append(Acked(gid, 1, reply.seq, "game_created"))
        seq, tokens = reply.seq, {}
        for seat, name in ((1, "ann"), (2, "bob")):
            take = SeatPlayer(command_id=new_command_id(), game_id=gid, seat=seat, name=name)
            reply = await ask(client, take, stop_at, tally)
            assert isinstance(reply, Accepted) and reply.token, reply
            tally.acked.append(Acked(gid, seq + 1, reply.seq, "player_seated"))
            seq, tokens[seat] = reply.seq, reply.token
        state = load_game("teeko").new_initial_state()
        while not state.is_terminal and time.monotonic() < stop_at:
            move = str(rng.choice(state.legal_moves()))
            seat = state.seat_to_move
            play = PlayMove(
                command_id=new_command_id(),
                game_id=gid,
                seat=seat,
                token=tokens[seat],
                move=move,
                expected_seq=seq,
            )
            tally.sent[gid] = tally.sent.get(gid, 0) + 1
            reply = await ask(client, play, stop_at, tally)
            if isinstance(reply, Accepted):
                tally.acked.append(Acked(gid, seq + 1, reply.seq, "move_played", move))
                state.apply(move)
                seq = reply.seq
            else:  # the log lost what this driver was told (no WAIT): play on from the log
                tally.resyncs += 1
                state, seq = await resync(redis, keys, gid)


async def bot_games(
    client: CommandClient, stop_at: float, tally: Tally, created: list[str], every_s: float = 0.25
) -> None:
    """Create games of the random bot against itself until `stop_at`, one every `every_s`:
    the dispatcher and the workers play them; `created` gets each acknowledged id."""
    n = 0
    while time.monotonic() < stop_at:
        gid, n = f"bots{n}x{random.randrange(10**9)}", n + 1
        seats = [SeatSpec(kind="bot", name="random")] * 2
        create = CreateGame(command_id=new_command_id(), game_id=gid, game="teeko", seats=seats)
        reply = await ask(client, create, stop_at, tally)
        assert isinstance(reply, Accepted), reply
        tally.acked.append(Acked(gid, 1, reply.seq, "game_created"))
        created.append(gid)
        await asyncio.sleep(every_s)


async def unfinished(
    redis: Client, keys: Keys, game_ids: Sequence[str], within_s: float
) -> list[str]:
    """The games that have not ended (by their views) within `within_s`, each as a line
    saying where it stands (its view and its log's last event); a read that meets a
    failover still in progress (play may resume on the other masters first) is read again,
    for up to `READ_AGAIN_S` past `within_s` (an election can outlast a short wait on a
    loaded machine); a game read then counts as ended only if it ended in time."""
    query, ids = QueryClient(redis, keys), list(game_ids)
    deadline, ends_by = time.monotonic() + within_s, now_ms() + int(within_s * 1000)
    while True:
        try:
            views = await query.views(ids)
        except RESENT:
            if time.monotonic() > deadline + READ_AGAIN_S:
                raise
        else:
            ids = [
                g
                for g, v in zip(ids, views, strict=True)
                if not v or v["status"] != "ended" or v["updated"] > ends_by
            ]
            if not ids or time.monotonic() > deadline:
                break
        await asyncio.sleep(0.2)
    return [await _where(query, gid) for gid in ids]


async def _where(query: QueryClient, game_id: str) -> str:
    """One unfinished game's standing: what its view says, and its log's last event."""
    try:
        view, log = await query.view(game_id), await query.log(game_id)
    except RESENT as exc:
        return f"{game_id}: not read ({exc!r})"
    last = unpack_event(log[-1].data)["type"] if log else None
    seen = f"view {view['status']} at seq {view['seq']}" if view else "no view"
    return f"{game_id}: {seen}; log {len(log)} events, the last {last}"


async def lost_and_doubled(redis: Client, keys: Keys, tally: Tally) -> tuple[int, int]:
    """Acknowledged commands whose event is not in its log where the reply said it was,
    and events beyond what was sent or a bot's move applied twice (a command applied twice)."""
    query = QueryClient(redis, keys)
    logs = {}
    for gid in {a.game_id for a in tally.acked}:
        logs[gid] = [unpack_event(e.data) for e in await query.log(gid)]
    lost = 0
    for a in tally.acked:
        events = logs[a.game_id][a.first - 1 : a.last]
        if not any(
            ev["type"] == a.kind and (not a.move or ev.get("move") == a.move) for ev in events
        ):
            lost += 1
    doubled = 0
    for gid, events in logs.items():
        kinds = [ev["type"] for ev in events]
        doubled += max(0, kinds.count("game_created") - 1)
        doubled += max(0, kinds.count("player_seated") - 2)
        if gid in tally.sent:  # a driver's game: no more moves than it sent
            doubled += max(0, kinds.count("move_played") - tally.sent[gid])
        else:  # the bots': no move command applied twice
            ids = [ev["command_id"] for ev in events if ev["type"] == "move_played"]
            doubled += len(ids) - len(set(ids))
    return lost, doubled


async def settle(redis: Client, keys: Keys, game_ids: set[str]) -> None:
    """Wait until the engine has decided every command sent and the projector has caught
    up with every game's log (a command resent through a failover may still be waiting in
    its stream when play has stopped)."""
    query = QueryClient(redis, keys)
    ids, behind = sorted(game_ids), ["the streams' groups"]
    for _ in range(200):
        with contextlib.suppress(*TRANSIENT_ERRORS):
            behind = await _groups_behind(redis, keys)
            if not behind:
                heads = await query.heads(ids)
                views = await query.views(ids)
                pairs = zip(ids, views, heads, strict=True)
                # (a game a failover lost whole has neither; one it cut short may have a
                # view ahead of its log: counted by the caller, not waited for)
                behind = [
                    f"{g} {v and v['seq']}/{h}" for g, v, h in pairs if h > (v or {}).get("seq", 0)
                ]
                if not behind:
                    return
        await asyncio.sleep(0.1)
    raise AssertionError(f"the engine or the projector did not catch up in 20 s: {behind[:5]}")


async def _groups_behind(redis: Client, keys: Keys) -> list[str]:
    """The engine's and the projector's groups that have not been handed, or have not
    acknowledged, every entry of their partition's stream: stream, group, pending count,
    last delivered and last written ids."""
    behind = []
    for p in keys.all_partitions():
        for stream, group in ((keys.commands(p), ENGINE_GROUP), (keys.feed(p), PROJECTOR_GROUP)):
            if not await redis.exists(stream):
                continue
            last = as_text((await redis.xinfo_stream(stream))["last-generated-id"])
            for info in await redis.xinfo_groups(stream):
                delivered = as_text(info["last-delivered-id"])
                if as_text(info["name"]) == group and (info["pending"] or delivered != last):
                    pending = info["pending"]
                    held = await _pending_detail(redis, stream, group) if pending else ""
                    behind.append(f"{stream} {group}: {pending} pending{held}, {delivered}/{last}")
    return behind


async def _pending_detail(redis: Client, stream: str, group: str) -> str:
    """Who holds a group's first pending entries, how long idle and how often delivered:
    what a failure of `settle` needs to say which consumer lost track of what."""
    rows = await redis.xpending_range(stream, group, "-", "+", 3)
    held = "; ".join(
        f"{as_text(r['message_id'])} with {as_text(r['consumer'])}, idle"
        f" {r['time_since_delivered']} ms, delivered {r['times_delivered']}x"
        for r in rows
    )
    return f" ({held})"


async def hold_share(ownership: Ownership, within_s: float = 10.0) -> None:
    """Take rounds until `ownership` holds its whole share, as a running member does a round
    every 0.25 s: on a loaded machine one round may take nothing (each master's takes get
    `NODE_WAIT_S`, and the first one there loads the script too)."""
    async with asyncio.timeout(within_s):
        await ownership.round()
        while len(ownership.owned) < ownership.count or set(ownership.owned) != ownership.wanted:
            await asyncio.sleep(0.05)  # not a spin on Redis while another's lease runs out
            await ownership.round()


async def beating(redis: Client, keys: Keys, within_ms: int) -> set[str]:
    """The processes whose heartbeat (`Keys.processes`) is at most `within_ms` old."""
    beats = await QueryClient(redis, keys).processes()
    now = now_ms()
    return {name for name, beat in beats.items() if now - beat.time <= within_ms}


async def group_consumers(
    redis: Client, keys: Keys, bots: Sequence[str]
) -> list[tuple[str, str, dict[str, Any] | Exception]]:
    """Every consumer of every service group (engine, projector, dispatcher, the workers of
    `bots`) as (stream, group, XINFO CONSUMERS row), or the error that reading a group gave."""
    groups = [(keys.commands(p), ENGINE_GROUP) for p in keys.all_partitions()]
    for p in keys.all_partitions():
        groups += [(keys.feed(p), PROJECTOR_GROUP), (keys.feed(p), DISPATCHER_GROUP)]
    groups += [(keys.bot_turns(b), WORKERS_GROUP) for b in bots]
    out: list[tuple[str, str, dict[str, Any] | Exception]] = []
    for stream, group in groups:
        try:
            consumers: Any = await redis.xinfo_consumers(stream, group)
        except ResponseError as exc:
            out.append((stream, group, exc))
            continue
        out += [(stream, group, {**c, "name": as_text(c["name"])}) for c in consumers]
    return out
