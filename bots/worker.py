"""The bot worker: reads a bot's inbox, thinks, and submits the move with the expected seq.

Every worker of one bot joins the inbox's consumer group `workers`, so any number of
processes share the turns. A turn request is dropped when it is stale: its deadline has
passed, or the game's log has moved beyond the seq it answers (a redelivered or duplicated
request). Otherwise the bot chooses on a position rebuilt from the request's moves (cached per
game, so only the new moves are replayed) and the worker sends a `PlayMove` whose command id
is "<bot>:<game>:<seq>": a duplicate answer, even a different move from another worker, gets
the engine's first reply and changes nothing. Workers ask for no reply; the log tells.

The bot thinks in a thread, so that the worker's heartbeat goes on while it does: a worker
that stops beating (killed) has its turns taken over by another worker within seconds.
Handled turns are trimmed from the inbox.

With `replicas` (`--ack-replicas`, as the engine's), a batch of turns is acknowledged only
once that many replicas hold the moves sent for it; otherwise the turns are answered again
(under the same command ids), so a master failover cannot lose a move and stall its game.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
from collections.abc import Callable, Sequence
from typing import Any

from bots.base import Bot, TurnContext, load_bot
from engine import Game, Move, State, load_game
from schemas.codec import FIELD, DecodeError, decode_turn
from schemas.commands import PlayMove
from schemas.turns import TurnRequest
from services.bus.cache import LRU
from services.bus.clients import CommandClient
from services.bus.connection import Client
from services.bus.consumer import Entry, StreamConsumer, now_ms
from services.bus.keys import WORKERS_GROUP, Keys

log = logging.getLogger("agon.bots")


class BotWorker(StreamConsumer):
    """Serves one bot's inbox: `run` until stopped, or `drain` what is there."""

    trim_groups = (WORKERS_GROUP,)

    def __init__(
        self,
        redis: Client,
        bot: Bot | str,
        keys: Keys | None = None,
        *,
        consumer: str | None = None,
        batch: int = 200,
        block_ms: int = 1000,
        claim_idle_ms: int = 30_000,
        clock: Callable[[], int] = now_ms,
        cache_size: int = 10_000,
        replicas: int = 0,
        replica_timeout_ms: int = 1000,
    ) -> None:
        self.bot = load_bot(bot) if isinstance(bot, str) else bot
        keys = keys or Keys()
        self.role = f"bot-{self.bot.name}"
        self.join(
            redis,
            keys,
            [keys.bot_turns(self.bot.name)],
            WORKERS_GROUP,
            consumer,
            batch=batch,
            block_ms=block_ms,
            claim_idle_ms=claim_idle_ms,
        )
        self.commands = CommandClient(redis, keys)
        self.clock = clock
        self.replicas = replicas
        self.replica_timeout_ms = replica_timeout_ms
        self.moves_sent = 0
        self.stale = 0
        self.failed = 0
        self._games: dict[tuple[str, tuple[tuple[str, str], ...]], Game] = {}
        self._states: LRU[str, tuple[State, int]] = LRU(cache_size)

    def stats(self) -> dict[str, int]:
        return {
            "moves": self.moves_sent,
            "stale": self.stale,
            "failed": self.failed,
            "set_aside": self.entries_set_aside,
        }

    def forget(self) -> None:
        self._states.clear()

    async def process(self, entries: Sequence[Entry]) -> None:
        requests = []
        for entry in entries:
            try:
                if entry.data is None:
                    raise DecodeError("malformed", f"no field {FIELD!r}")
                requests.append(decode_turn(entry.data))
            except DecodeError as exc:
                # Only the dispatcher writes inboxes: there is nobody to answer.
                await self.set_aside(entry, f"{exc.code}: {exc.message}")
        current = await self._current(requests)
        loop = asyncio.get_running_loop()
        sent: list[concurrent.futures.Future[None]] = []

        def think() -> None:
            # One turn after another, each move sent the moment it is chosen; turn i of k
            # may think until (i + 1) / k of its time is gone, so the last is not starved.
            start = self.clock()
            current.sort(key=lambda r: r.deadline or 2**62)
            for i, req in enumerate(current):
                share = 0
                if req.deadline:
                    share = start + (req.deadline - start) * (i + 1) // len(current)
                command = self._answer(req, share)
                if command is not None:
                    coro = self.commands.send(
                        [command], replicas=self.replicas, timeout_ms=self.replica_timeout_ms
                    )
                    sent.append(asyncio.run_coroutine_threadsafe(coro, loop))

        await asyncio.to_thread(think)
        await asyncio.gather(*(asyncio.wrap_future(f) for f in sent))
        self.moves_sent += len(sent)
        await self.reader.ack(entries)

    async def _current(self, requests: list[TurnRequest]) -> list[TurnRequest]:
        """The requests still worth answering: in time, and the log still at their seq."""
        now = self.clock()
        live = [r for r in requests if not r.deadline or r.deadline > now]
        latest: dict[tuple[str, int], TurnRequest] = {(r.game_id, r.seq): r for r in live}
        pipe = self.redis.pipeline(transaction=False)
        for game_id, _ in latest:
            pipe.xlen(self.keys.log(game_id))
        heads: list[Any] = await pipe.execute() if latest else []
        out = [r for r, head in zip(latest.values(), heads, strict=True) if int(head) == r.seq]
        self.stale += len(requests) - len(out)
        return out

    def _answer(self, req: TurnRequest, deadline: int = 0) -> PlayMove | None:
        """The bot's move as a command, or None when the bot has none that can be sent.

        The bot is told `deadline` (its share of the turn's time), else the turn's own."""
        try:
            state = self._position(req)
            context = TurnContext(req.game_id, req.seat, req.seq, deadline or req.deadline)
            move = self.bot.choose(state, context)
            return PlayMove(
                command_id=f"{self.bot.name}:{req.game_id}:{req.seq}",
                game_id=req.game_id,
                seat=req.seat,
                token=req.token,
                move=move,
                expected_seq=req.seq,
                clock=req.clock,
            )
        except Exception:
            # A bot that cannot move, or answers what no command can carry, must not stop
            # the other games; the move clock, if the game has one, ends this one.
            log.exception("bot %s: no move for game %s seq %d", self.bot.name, req.game_id, req.seq)
            self._states.pop(req.game_id)
            self.failed += 1
            return None

    def _position(self, req: TurnRequest) -> State:
        """The position after the request's moves, replaying only moves not yet cached."""
        cached = self._states.get(req.game_id)
        if cached is not None and cached[1] <= len(req.moves):
            state, done = cached
        else:
            state, done = self._game(req).new_initial_state(), 0
        game = state.game
        for text in req.moves[done:]:
            # The engine validated these moves when it logged them.
            state.apply_action(game.action_of(Move.parse(text)))
        self._states.put(req.game_id, (state, len(req.moves)))
        return state.clone()

    def _game(self, req: TurnRequest) -> Game:
        key = (req.game, tuple(sorted(req.options.items())))
        game = self._games.get(key)
        if game is None:
            game = self._games[key] = load_game(req.game, **req.options)
        return game
