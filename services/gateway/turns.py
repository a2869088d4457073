"""Outside bots' turn streams: one inbox reader per gateway, fanned out to every stream.

A connected bot's stream (`/api/bot/stream` NDJSON, or `/ws/bot`) is sent, on connect,
every turn still waiting for it (found from the game index and the newest inbox entries),
then each turn request written to its inbox `agon:bot:{<bot>}:turns`, without the seat
token, then `ended` as each of its games ends, and a keep-alive every `keepalive_s`.

No stream reads Redis itself. As lila-ws keeps one Redis subscription per process for
thousands of sockets, a gateway has one `TurnReader` (`services.gateway.live`): it reads
the inboxes of the bots that have a stream here (one blocking XREAD naming all of them
on a single server; on a Redis Cluster, where one command may not name two slots, one
pipelined non-blocking XREAD per inbox, a round trip per node, every `POLL_S`) and hands
each entry to that bot's listeners. It also writes, in one HSET, the heartbeat of every
bot served here, as its workers would, so the dispatcher does not abort its games as
unserved. So the Redis connections a gateway holds do not grow with its streams. A bot
may hold `STREAMS_PER_BOT` streams on a gateway; a stream ends when its client goes (its
transport closes), when its key stops being valid, and at once when the gateway shuts
down.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

from aiohttp import web
from pydantic import BaseModel

from schemas.api import EndedMessage, ErrorMessage, TurnMessage
from schemas.codec import FIELD_BYTES, DecodeError, decode_turn
from services.bus.consumer import as_text, now_ms
from services.gateway import appkeys
from services.gateway.http import ApiError
from services.gateway.live import EndedListener
from services.projector.fold import GameFold

#: Open turn streams (NDJSON or socket) of one bot on one gateway.
STREAMS_PER_BOT = 4
#: How often a stream looks whether its client is still there.
ALIVE_CHECK_S = 0.5
#: Games of one bot looked at for pending turns when it connects.
PENDING_LIMIT = 1_000
#: The newest inbox entries looked at for pending turns when a bot connects.
RECENT_TURNS = 200
#: What a turn request tells an outside bot: everything but its seat token.
TURN_FIELDS = {"game_id", "game", "options", "moves", "seq", "seat", "deadline", "clock"}


# -- one stream ------------------------------------------------------------------------------
class Turns:
    """What one connection of `bot` is sent: pending turns, inbox turns, ended games."""

    def __init__(self, app: web.Application, bot: str) -> None:
        self.app = app
        self.bot = bot
        self.sent: set[tuple[str, int]] = set()
        self.games: dict[str, int] = {}  # game id -> the seat it plays there
        self.inbox = app[appkeys.SETTINGS].keys.bot_turns(bot)
        self.last = "0-0"

    async def pending(self) -> list[TurnMessage]:
        """Turns waiting now; `last` becomes the newest inbox entry this looked at."""
        redis = self.app[appkeys.REDIS]
        recent: Any = await redis.xrevrange(self.inbox, count=RECENT_TURNS)
        self.last = as_text(recent[0][0]) if recent else "0-0"
        # The newest turn requests whose game has not moved on since: this finds a turn
        # sent just before the connection, which the index may not show yet.
        turns = self.from_inbox(list(reversed(recent)))
        query = self.app[appkeys.QUERY]
        heads = await query.heads([t.game_id for t in turns]) if turns else []
        out = [t for t, head in zip(turns, heads, strict=True) if head == t.seq]
        self.sent.difference_update((t.game_id, t.seq) for t in turns)
        self.sent.update((t.game_id, t.seq) for t in out)
        page = await query.games(status="playing", player=self.bot, limit=PENDING_LIMIT)
        for view in page.games:
            for s in view["seats"]:
                if s["kind"] == "bot" and s["name"] == self.bot:
                    self.games.setdefault(view["game_id"], s["seat"])  # to tell its end
            seat = view["seats"][view["to_move"] - 1] if view["to_move"] else None
            if seat is None or seat["kind"] != "bot" or seat["name"] != self.bot:
                continue
            game = await self.app[appkeys.STATES].current(view["game_id"])
            if game is not None and game.status == "playing":
                out.extend(self._turn_of(game))
        return out

    def _turn_of(self, game: GameFold) -> list[TurnMessage]:
        if (game.game_id, game.seq) in self.sent:
            return []
        self.sent.add((game.game_id, game.seq))
        self.games[game.game_id] = game.to_move
        created = game.created
        return [
            TurnMessage(
                game_id=game.game_id,
                game=created["game"],
                options=created["options"],
                moves=list(game.moves),
                seq=game.seq,
                seat=game.to_move,
                deadline=game.deadline,
            )
        ]

    def from_inbox(self, entries: Any) -> list[TurnMessage]:
        """The turn requests among inbox `entries` not sent yet nor past their deadline
        (now counted as sent)."""
        out: list[TurnMessage] = []
        now = now_ms()
        for _, fields in entries:
            try:
                turn = decode_turn(fields[FIELD_BYTES])
            except (DecodeError, KeyError):
                continue
            if (turn.game_id, turn.seq) in self.sent or (turn.deadline and turn.deadline < now):
                continue
            self.games[turn.game_id] = turn.seat
            self.sent.add((turn.game_id, turn.seq))
            out.append(TurnMessage(**turn.model_dump(include=TURN_FIELDS)))
        return out

    def ended(self, listener: EndedListener) -> list[BaseModel]:
        out: list[BaseModel] = []
        while not listener.queue.empty():
            game_id, ev = listener.queue.get_nowait()
            seat = self.games.pop(game_id, None)
            self.sent = {turn for turn in self.sent if turn[0] != game_id} if seat else self.sent
            if seat is not None:
                out.append(
                    EndedMessage(
                        game_id=game_id,
                        seat=seat,
                        winner=int(str(ev["result"])),
                        reason=str(ev["reason"]),
                        detail=str(ev.get("detail", "")),
                    )
                )
        return out


@contextlib.contextmanager
def stream_slot(app: web.Application, bot: str) -> Iterator[None]:
    """One of the bot's `STREAMS_PER_BOT` turn streams on this gateway, or 429."""
    connected = app[appkeys.BOT_CONNECTIONS]
    if connected[bot] >= STREAMS_PER_BOT:
        raise ApiError(
            "too_many_streams",
            f"{bot} has {STREAMS_PER_BOT} turn streams open on this gateway; close one first",
            status=429,
            headers={"Retry-After": "5"},
        )
    connected[bot] += 1
    try:
        yield
    finally:
        connected[bot] -= 1
        if not connected[bot]:
            del connected[bot]


async def serve_turns(
    app: web.Application,
    bot: str,
    emit: Callable[[BaseModel | None], Awaitable[None]],
    *,
    key_hash: str,
    alive: Callable[[], bool],
) -> None:
    """Feed `emit` the bot's messages (None: a keep-alive) until its client goes (`alive()`
    false), the key the stream was opened with (hashing to `key_hash`) is no longer valid
    (told as an `error`; the reader checks every `KEY_CACHE_S`), or the gateway stops."""
    reader, hub = app[appkeys.TURNS], app[appkeys.HUB]
    settings = app[appkeys.SETTINGS]
    inbox = reader.listen(bot, key_hash)  # before the search: nothing falls in between
    ended = EndedListener()
    hub.ended.add(ended)
    turns = Turns(app, bot)
    try:
        async with reader.opening:
            waiting = await turns.pending()
        reader.start(bot, turns.last)
        for turn in waiting:
            await emit(turn)
        quiet_since = time.monotonic()
        while alive() and not inbox.closed:
            entries, overflowed = await inbox.take(ALIVE_CHECK_S)
            messages: list[BaseModel] = [*turns.from_inbox(entries)]
            if overflowed:
                async with reader.opening:
                    messages += await turns.pending()
            messages += turns.ended(ended)
            for message in messages:
                await emit(message)
            now = time.monotonic()
            if messages:
                quiet_since = now
            elif now - quiet_since >= settings.keepalive_s:
                await emit(None)
                quiet_since = now
        if inbox.revoked:
            gone = f"the key of {bot} was rotated or revoked; connect with its new key"
            await emit(ErrorMessage(code="bad_key", message=gone))
    finally:
        hub.ended.discard(ended)
        reader.unlisten(inbox)
