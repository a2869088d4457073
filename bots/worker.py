"""The bot worker: reads a bot's inbox, thinks, and submits the move with the expected seq.

Every worker of one bot joins the inbox's consumer group `workers`, so any number of
processes share the turns. A turn request is dropped when it is stale: the game's log has
moved beyond the seq it answers (a redelivered or duplicated request), or its clock was
claimed before the worker took it. The worker is part of the platform, so a turn's clock
starts when the worker takes it from the inbox (`services.bus.delivery`): the bot gets its
whole allowance from then, signed, however long the turn waited behind the platform's own
backlog in a process it shares. Otherwise the bot chooses on a position rebuilt from the
request's moves (cached per game, so only the new moves are replayed) and the worker sends
a `PlayMove` whose command id is "<bot>:<game>:<seq>": a duplicate answer, even a different
move from another worker, gets the engine's first reply and changes nothing. Workers ask
for no reply; the log tells.

The bot thinks in a thread, so that the worker's heartbeat goes on while it does: a worker
that stops beating (killed) has its turns taken over by another worker within seconds.
Handled turns are trimmed from the inbox.

With `pace_ms` (`agon bots --pace-ms`), a batch of turns is answered no sooner than that
after it was taken, on the bots' clocks like thinking: bot games a person can follow, and
bots that leave a host room to spare (`agon bench scale --pace-ms`). A worker answers one
batch at a time, so a turn that comes in meanwhile waits up to a pace more in the inbox
(counted as the platform's lag, never the bot's): give a paced bot more workers, and keep
the pace well inside the games' move time. A batch with turns a master held back is not
paced.

With `replicas` (`--ack-replicas`, as the engine's), a batch of turns is acknowledged only
once that many replicas hold the moves sent for it; otherwise those moves are sent again as
they were (the same command, whatever the log says meanwhile: a head past the turn may be
that very move, on a master that dies before a replica holds it), so a master failover
cannot lose a move and stall its game.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
from collections.abc import Callable, Collection, Sequence
from typing import Any, Unpack

from bots.base import Bot, TurnContext, load_bot
from bots.clock import OVERHEAD, take_planned_stop_ms
from engine import State
from engine.positions import Positions
from schemas.codec import FIELD, DecodeError, decode_turn
from schemas.commands import PlayMove
from schemas.turns import TurnRequest
from services.bus.clients import CommandClient
from services.bus.connection import (
    NODE_PATIENCE_S,
    RETRIED_ERRORS,
    TRANSIENT_ERRORS,
    Client,
    NodeTooSlow,
    Patience,
    is_cluster,
    patient_pipeline,
    patiently,
)
from services.bus.consumer import ConsumerOptions, ConsumerSettings, StreamConsumer
from services.bus.delivery import Deliveries
from services.bus.keys import WORKERS_GROUP, Keys
from services.bus.reader import Entry
from services.bus.secret import clock_signing_key
from services.bus.text import now_ms

log = logging.getLogger("agon.bots")


class BotWorker(StreamConsumer):
    """Serves one bot's inbox: `run` until stopped, or `drain` what is there."""

    trim_groups = (WORKERS_GROUP,)
    defaults = ConsumerSettings(batch=200, cache_size=10_000)

    def __init__(
        self,
        redis: Client,
        bot: Bot | str,
        keys: Keys | None = None,
        *,
        clock: Callable[[], int] = now_ms,
        clock_key: bytes | None = None,
        pace_ms: int = 0,
        settings: ConsumerSettings | None = None,
        **options: Unpack[ConsumerOptions],
    ) -> None:
        self.bot = load_bot(bot) if isinstance(bot, str) else bot
        keys = keys or Keys()
        self.role = f"bot-{self.bot.name}"
        inbox = [keys.bot_turns(self.bot.name)]
        self.join(redis, keys, inbox, WORKERS_GROUP, settings, **options)
        self.commands = CommandClient(redis, keys)
        self.clock = clock
        #: a move leaves no sooner than this after its turn was taken (its clock running)
        self.pace_ms = pace_ms
        self.moves_sent = 0
        self.stale = 0
        self.failed = 0
        self._positions = Positions(self.settings.cache_size)
        #: turns whose game's master did not answer: answered with the next batch
        self._held: list[Entry] = []
        #: the moves sent for turns held because no replica confirmed them, by (game, seq):
        #: sent again as they were
        self._unconfirmed: dict[tuple[str, int], PlayMove] = {}
        #: Starts the turns' clocks; without `clock_key`, `setup` finds the deployment's.
        self.deliveries = Deliveries(redis, keys, clock_key, clock) if clock_key else None

    async def setup(self) -> None:
        await super().setup()
        if self.deliveries is None:
            key = await clock_signing_key(self.redis, self.keys)
            self.deliveries = Deliveries(self.redis, self.keys, key, self.clock)

    def stats(self) -> dict[str, int]:
        lag = self.deliveries.lag.summary() if self.deliveries else {}
        return {
            "moves": self.moves_sent,
            "stale": self.stale,
            "failed": self.failed,
            "set_aside": self.entries_set_aside,
            **lag,
        }

    async def process(self, entries: Sequence[Entry]) -> None:
        """Answer a batch of turns, the turns a master held back last time first.

        A turn whose game lives on a master that does not answer (its host died, its
        replica not yet in charge) is kept for the next batch, unacknowledged: it holds
        back none of the other games' turns."""
        turns: list[tuple[Entry, TurnRequest]] = []
        # Paced: a batch of turns newly taken. Not one with turns a master held back: their
        # clocks ran on through the failover, and a pace more would be the bot's to pay.
        paced = bool(self.pace_ms and entries and not self._held)
        # The spell a master's failover took is written before the turns it held are
        # answered: the engine judges their moves with it (the time was the platform's).
        await self.write_spells()
        # A held turn may come back in the batch too (claimed again): once each.
        batch = {(e.stream, e.entry_id): e for e in [*self._held, *entries]}
        for entry in batch.values():
            try:
                if entry.data is None:
                    raise DecodeError("malformed", f"no field {FIELD!r}")
                turns.append((entry, decode_turn(entry.data)))
            except DecodeError as exc:
                # Only the dispatcher writes inboxes: there is nobody to answer.
                await self.set_aside(entry, f"{exc.code}: {exc.message}")
        away: set[str] = set()
        resend = [c for _, r in turns if (c := self._unconfirmed.get((r.game_id, r.seq)))]
        requests = [r for _, r in turns if (r.game_id, r.seq) not in self._unconfirmed]
        # Turns taken over from a worker that died with them: the bot's clock
        # starts again, what it lost there being the platform's.
        again = {r.game_id for e, r in turns if e.taken_over}
        patience = self._patience(retrying=not entries)
        requests = await self._current(requests, away, patience)
        current = await self._delivered(requests, away, again, patience)
        if current and paced:
            await asyncio.sleep(self.pace_ms / 1000)
        loop = asyncio.get_running_loop()
        sent: list[tuple[PlayMove, concurrent.futures.Future[None]]] = []
        # Sent again first, as they were: no thinking, and the turn's clock is the one sent.
        again_sent = [(c, asyncio.ensure_future(self._send(c, self.clock(), None))) for c in resend]

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
                planned = take_planned_stop_ms()  # when a thinking bot meant to stop
                if command is not None:
                    coro = self._send(command, self.clock(), planned)
                    sent.append((command, asyncio.run_coroutine_threadsafe(coro, loop)))

        await asyncio.to_thread(think)
        sent_all = [*again_sent, *((c, asyncio.wrap_future(f)) for c, f in sent)]
        results = await self._sent([f for _, f in sent_all], patience)
        for (command, _), result in zip(sent_all, results, strict=True):
            if isinstance(result, RETRIED_ERRORS):
                away.add(command.game_id)
                self._unconfirmed[command.game_id, command.expected_seq] = command
            elif isinstance(result, BaseException):
                raise result
            else:
                self._unconfirmed.pop((command.game_id, command.expected_seq), None)
        while len(self._unconfirmed) > self.settings.cache_size:
            del self._unconfirmed[next(iter(self._unconfirmed))]  # claimed by another
        self.moves_sent += len(sent_all) - sum(isinstance(r, BaseException) for r in results)
        self._held = [e for e, r in turns if r.game_id in away]
        # The next turns ride along unless held ones come first (`tick`).
        await self.reader.ack([e for e, r in turns if r.game_id not in away], ride=not self._held)

    async def tick(self) -> None:
        """Answer the turns a master held back, also while no new turn comes."""
        if self._held:
            await self.process([])

    def forget(self) -> None:
        self._positions.clear()
        self._held = []  # a failed batch is read again whole, these with it

    async def _sent(
        self, sends: list[asyncio.Future[None]], patience: Patience | None
    ) -> list[BaseException | None]:
        """Each send's outcome (None: done); with `patience`, a send that takes longer than
        it allows counts as not confirmed (`NodeTooSlow`): its turn is kept and the move
        sent again later (the first may still land: the engine answers a repeat as such)."""
        if not sends:
            return []
        late: set[asyncio.Future[None]] = set()
        if patience is None:
            await asyncio.wait(sends)
        else:
            late = await patiently(sends, patience)
        return [NodeTooSlow("no answer in time") if f in late else f.exception() for f in sends]

    def _patience(self, retrying: bool) -> Patience | None:
        """How long a batch waits on a master (`patiently`): on a cluster a master whose
        host died answers nothing until the masters agree it failed and its replica takes
        over (a second or so), and its games' turns must not hold back the others' (a kill-
        host run's workers stood still that long, every game of theirs); a batch of only
        turns kept for later (`retrying`) is given `NODE_PATIENCE_S` for a first answer, not
        `NODE_WAIT_S`, as the next batch's turns wait behind it. A single server is waited
        for."""
        if not is_cluster(self.redis):
            return None
        return Patience(first_s=NODE_PATIENCE_S) if retrying else Patience()

    async def _send(self, command: PlayMove, chosen: int, planned: int | None) -> None:
        """Send the move chosen at `chosen`: how long that took is the platform's lag, and
        how long after the bot `planned` to stop it arrived is the overhead its margin
        covers (`bots.clock.OVERHEAD`)."""
        await self.commands.send(
            [command], replicas=self.replicas, timeout_ms=self.replica_timeout_ms
        )
        arrived = self.clock()
        if self.deliveries is not None:
            self.deliveries.lag.observe_send(arrived - chosen)
        if planned is not None:
            OVERHEAD.observe(arrived - planned)

    async def _delivered(
        self,
        requests: list[TurnRequest],
        away: set[str],
        again: Collection[str] = (),
        patience: Patience | None = None,
    ) -> list[TurnRequest]:
        """The requests as they reach the bot now: their clocks start (the deadline and
        stamp given from now; again for the games in `again`), or they are dropped when
        their clocks were claimed first (or kept for later, in `away`, when their master
        did not answer)."""
        if self.deliveries is None:
            await self.setup()
        assert self.deliveries is not None
        out = []
        delivered = await self.deliveries.deliver(
            requests, away=away, again=again, patience=patience
        )
        for r, d in zip(requests, delivered, strict=True):
            if r.game_id in away:
                continue
            if d is None:
                self.stale += 1
            elif not r.allowance:
                out.append(r)  # no clock to start
            else:
                out.append(r.model_copy(update={"deadline": d.deadline, "clock": d.clock}))
        return out

    async def _current(
        self, requests: list[TurnRequest], away: set[str], patience: Patience | None = None
    ) -> list[TurnRequest]:
        """The requests still worth answering: the log still at their seq (a game whose
        master did not answer, or not in the time `patience` allows, goes to `away`)."""
        latest = {(r.game_id, r.seq): r for r in requests}
        pipe = patient_pipeline(self.redis, patience)
        for game_id, _ in latest:
            pipe.xlen(self.keys.log(game_id))
        heads: list[Any] = await pipe.execute(raise_on_error=False) if latest else []
        out = []
        for r, head in zip(latest.values(), heads, strict=True):
            if isinstance(head, TRANSIENT_ERRORS):
                away.add(r.game_id)
            elif isinstance(head, Exception):
                raise head
            elif int(head) == r.seq:
                out.append(r)
        self.stale += len(requests) - len(out) - sum(r.game_id in away for r in requests)
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
            self._positions.forget(req.game_id)
            self.failed += 1
            return None

    def _position(self, req: TurnRequest) -> State:
        """The position after the request's moves, replaying only moves not yet seen."""
        return self._positions.after(req.game_id, req.game, req.options, req.moves).clone()
