"""The SDK's client: `run_bot` plays a bot's turns from the gateway's NDJSON stream.

One stream per bot (`GET /api/bot/stream`) brings `turn`, `prepare`, `ended`, `error` and
`ping` messages, one JSON object a line, and an empty line as a keep-alive. The SDK reads only
what they carry: it never fetches a game's view, and a turn's legal moves and clock come with
it. Each turn is answered in a task of its own: the position is rebuilt from the turn's moves
(cached per game, so only new moves are replayed), the user's `choose` thinks in a thread (the
stream is read meanwhile) and the move is POSTed with the turn's seq and clock; `choose` may
return `RESIGN` to give the game up. A turn is answered once per (game id, seq), however often
it arrives; a turn whose deadline has passed is skipped. Before the first turn of a game type
(game and options) the gateway sends `prepare`, with no clock running: the SDK loads the
rules and calls the bot's `prepare(game, options)` hook, if any, in a thread and answers
`POST /api/bot/ready`, and the turn follows with its clock started then. `ended` says
`winner` (null when there is none) and `draw`, as the game's view does.

The connection comes back by itself: a lost stream, a 5xx or a 429 is retried with capped
exponential backoff and jitter, one log line per attempt. A 401 (a bad key) is final:
`AuthError`, never retried. `rotate_key` replaces a key (the old one stops working at once)
and `set_accept_challenges` says whether anyone may seat the bot in a game, or only a
creator bearing its key.
"""

from __future__ import annotations

import asyncio
import email.utils
import inspect
import logging
import random
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import pydantic

from engine import Game, InvalidMoveError, Move, State, load_game
from schemas.api import (
    BotKeyBody,
    EndedMessage,
    ErrorBody,
    ErrorMessage,
    PrepareMessage,
    TurnMessage,
    decode_bot_server_message,
)

log = logging.getLogger("agon.bot")

#: The user's bot: the position (its own copy) and the seconds left (None: no clock) to a move;
#: a `choose` with a third parameter is also given the turn (its legal moves, clocks, seat).
Choose = Callable[..., Move | str]
#: Called (in a thread) before the first turn of a game type: load what the bot needs for it.
Prepare = Callable[[str, dict[str, str]], object]
#: What `choose` returns to resign the game.
RESIGN = "resign"
#: Called with each `ended` message; may return an awaitable, which is awaited.
OnResult = Callable[[EndedMessage], object]

#: How many games' positions, and how many answered (game, seq) pairs, are remembered.
GAMES_KEPT = 1024
TURNS_KEPT = 16_384
#: Attempts to POST one move through connection errors and 5xx (429s wait as told).
POST_ATTEMPTS = 5


class BotError(Exception):
    """The gateway refused the bot in a way retrying cannot fix."""


class AuthError(BotError):
    """The gateway answered 401: the key is wrong or revoked."""


class _Retry(Exception):
    """A failure worth retrying, after at least `after` seconds."""

    def __init__(self, reason: str, after: float = 0.0) -> None:
        super().__init__(reason)
        self.after = after


class _Stopped(Exception):
    """Raised inside the task group when `stop` is set, to end every task."""


# -- the public API -----------------------------------------------------------------------------


async def run_bot(
    url: str,
    key: str,
    choose: Choose,
    *,
    stop: asyncio.Event | None = None,
    on_result: OnResult | None = None,
    on_connect: Callable[[], object] | None = None,
    prepare: Prepare | None = None,
    reconnect_min_s: float = 0.5,
    reconnect_max_s: float = 30.0,
    idle_timeout_s: float = 20.0,
) -> None:
    """Play the bot's turns until `stop` is set (returns) or the key is refused (`AuthError`).

    `on_connect()` is called each time the stream opens; `prepare(game, options)` before the
    first turn of each game type, after the SDK loaded its rules. A stream silent for
    `idle_timeout_s` (the gateway sends a keep-alive every 5 s) counts as lost.
    """
    stop = stop or asyncio.Event()
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=idle_timeout_s)
    headers = {"Authorization": f"Bearer {key}"}
    async with aiohttp.ClientSession(
        headers=headers, timeout=timeout, read_bufsize=2**20
    ) as session:
        bot = _Bot(_base(url), choose, session, on_result, on_connect, prepare)
        backoff = _Backoff(reconnect_min_s, reconnect_max_s)
        try:
            async with asyncio.TaskGroup() as group:
                group.create_task(_raise_when_set(stop))
                group.create_task(bot.connect_forever(group, backoff))
        except ExceptionGroup as failed:
            _reraise_unless_stopped(failed)


async def register_bot(url: str, name: str, *, accept_challenges: bool = False) -> str:
    """Register a bot called `name`; return its key (the gateway shows it only this once).

    Without `accept_challenges` the bot plays only the games created with its key (as
    `Authorization: Bearer KEY` on `POST /api/games`); with it, anyone may seat it.
    """
    body = {"name": name, "accept_challenges": accept_challenges}
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{_base(url)}/api/bots", json=body) as resp,
    ):
        if resp.status == 409:
            raise BotError(
                f"the bot name {name!r} is taken or reserved ({await _error_text(resp)})"
            )
        if resp.status not in (200, 201):
            raise BotError(f"cannot register {name!r}: {resp.status} {await _error_text(resp)}")
        return BotKeyBody.model_validate_json(await resp.text()).key


async def rotate_key(url: str, name: str, key: str) -> str:
    """A new key for the bot in place of `key`, which stops working (shown only this once)."""
    async with (
        aiohttp.ClientSession(headers={"Authorization": f"Bearer {key}"}) as session,
        session.post(f"{_base(url)}/api/bots/{name}/key") as resp,
    ):
        await _check_owner(resp, f"cannot rotate the key of {name!r}")
        return BotKeyBody.model_validate_json(await resp.text()).key


async def set_accept_challenges(url: str, name: str, key: str, accept: bool) -> None:
    """Whether anyone may seat the bot in a game (else only a creator bearing its key)."""
    async with (
        aiohttp.ClientSession(headers={"Authorization": f"Bearer {key}"}) as session,
        session.patch(f"{_base(url)}/api/bots/{name}", json={"accept_challenges": accept}) as resp,
    ):
        await _check_owner(resp, f"cannot change the settings of {name!r}")


# -- the bot's side of the stream ---------------------------------------------------------------


@dataclass
class _Bot:
    url: str
    choose: Choose
    session: aiohttp.ClientSession
    on_result: OnResult | None = None
    on_connect: Callable[[], object] | None = None
    prepare: Prepare | None = None
    positions: _Positions = field(default_factory=lambda: _Positions(GAMES_KEPT))
    taken: OrderedDict[tuple[str, int], None] = field(default_factory=OrderedDict)
    connected: bool = False

    def __post_init__(self) -> None:
        self.wants_turn = _takes_turn(self.choose)

    async def connect_forever(self, group: asyncio.TaskGroup, backoff: _Backoff) -> None:
        """Read the stream; when it is lost, wait (backoff) and read it again, forever."""
        while True:
            self.connected = False
            try:
                await self.read_stream(group)
                reason, after = "the gateway closed it", 0.0
            except _Retry as exc:
                reason, after = str(exc), exc.after
            except (aiohttp.ClientError, TimeoutError) as exc:
                reason, after = _describe(exc), 0.0
            if self.connected:
                backoff.reset()
            delay = max(backoff.next(), after)
            log.warning(
                "stream %s: %s; reconnecting in %.1f s (attempt %d)",
                self.url,
                reason,
                delay,
                backoff.attempt,
            )
            await asyncio.sleep(delay)

    async def read_stream(self, group: asyncio.TaskGroup) -> None:
        async with self.session.get(f"{self.url}/api/bot/stream") as resp:
            await _check_stream(resp)
            self.connected = True
            log.debug("stream %s open", self.url)
            if self.on_connect is not None:
                self.on_connect()
            async for raw in resp.content:
                line = raw.strip()
                if line:
                    self.dispatch(line, group)

    def dispatch(self, line: bytes, group: asyncio.TaskGroup) -> None:
        try:
            message = decode_bot_server_message(line)
        except pydantic.ValidationError as exc:
            log.warning(
                "ignored a message the SDK does not read (%d errors): %.200r",
                exc.error_count(),
                line,
            )
            return
        if isinstance(message, TurnMessage):
            self.take(message, group)
        elif isinstance(message, PrepareMessage):
            group.create_task(_logged(self.get_ready(message), "prepare"))
        elif isinstance(message, EndedMessage):
            self.ended(message, group)
        elif isinstance(message, ErrorMessage):
            log.warning("gateway error %s: %s", message.code, message.message)
        else:
            log.debug("gateway says %s", message)

    def take(self, turn: TurnMessage, group: asyncio.TaskGroup) -> None:
        """Start answering a turn, unless it was taken already or its deadline has passed."""
        key = (turn.game_id, turn.seq)
        if key in self.taken:
            log.debug("game %s seq %d: a turn already taken, ignored", *key)
            return
        self.taken[key] = None
        if len(self.taken) > TURNS_KEPT:
            self.taken.popitem(last=False)
        if _seconds_left(turn.deadline) == 0.0:
            log.info("game %s seq %d: the deadline has passed; turn skipped", *key)
            return
        group.create_task(self.play(turn))

    async def get_ready(self, message: PrepareMessage) -> None:
        """Run the bot's `prepare` for a game type, then tell the gateway it is ready (a
        failing `prepare` is logged, and the bot says ready all the same)."""
        try:
            await asyncio.to_thread(self.positions.rules, message.game, dict(message.options))
            if self.prepare is not None:
                await asyncio.to_thread(self.prepare, message.game, dict(message.options))
        except Exception as exc:
            log.warning("prepare %s failed: %s: %s", message.game, type(exc).__name__, exc)
        body = {"game": message.game, "options": message.options}
        async with self.session.post(f"{self.url}/api/bot/ready", json=body) as resp:
            if resp.status == 401:
                raise AuthError(f"the gateway refused the bot key (401 {await _error_text(resp)})")
            if resp.status != 200:
                log.warning("ready for %s refused: %s", message.game, await _error_text(resp))

    async def play(self, turn: TurnMessage) -> None:
        """Answer one turn; no failure but a refused key ends more than this turn."""
        try:
            await self.answer(turn)
        except AuthError:
            raise
        except Exception:
            log.exception("game %s seq %d: the turn failed", turn.game_id, turn.seq)

    async def answer(self, turn: TurnMessage) -> None:
        try:
            state = self.positions.state_for(turn)
        except ValueError as exc:
            log.error(
                "game %s seq %d: cannot rebuild the position: %s", turn.game_id, turn.seq, exc
            )
            return
        move = await self.decide(turn, state)
        if move is not None and not await self.post(turn, move):
            self.taken.pop((turn.game_id, turn.seq), None)  # a re-sent turn may try again

    async def decide(self, turn: TurnMessage, state: State) -> str | None:
        """The user's move if it is among the turn's legal moves (or `RESIGN`), else (one log
        line) the first legal move."""
        legal = turn.legal_moves
        if not legal:
            log.warning("game %s seq %d: no legal move to play", turn.game_id, turn.seq)
            return None
        args: tuple[Any, ...] = (state.clone(), _seconds_left(turn.deadline))
        try:
            chosen = await asyncio.to_thread(
                self.choose, *args, *([turn] if self.wants_turn else [])
            )
        except Exception as exc:
            problem = f"choose failed: {type(exc).__name__}: {exc}"
        else:
            if chosen == RESIGN:
                return RESIGN
            move = _legal_text(chosen, legal)
            if move is not None:
                return move
            problem = f"choose returned the illegal move {chosen!r}"
        log.warning("game %s seq %d: %s; playing %s", turn.game_id, turn.seq, problem, legal[0])
        return legal[0]

    async def post(self, turn: TurnMessage, move: str) -> bool:
        """POST the move (or the resignation); True once the gateway has answered it
        (accepted or refused)."""
        url = f"{self.url}/api/bot/games/{turn.game_id}/moves"
        body: dict[str, Any] = {"move": move, "seq": turn.seq}
        if turn.clock:
            body["clock"] = turn.clock  # the clock then runs from the hand-over
        if move == RESIGN:
            url, body = f"{self.url}/api/bot/games/{turn.game_id}/resign", {}
        backoff = _Backoff(0.25, 4.0)
        for _ in range(POST_ATTEMPTS):
            try:
                async with self.session.post(url, json=body) as resp:
                    return await _move_answered(resp, turn, move)
            except _Retry as exc:
                delay, reason = max(exc.after, backoff.next()), str(exc)
            except (aiohttp.ClientError, TimeoutError) as exc:
                delay, reason = backoff.next(), _describe(exc)
            if turn.deadline and time.time() + delay > turn.deadline / 1000:
                break
            log.info(
                "game %s seq %d: %s; move sent again in %.1f s",
                turn.game_id,
                turn.seq,
                reason,
                delay,
            )
            await asyncio.sleep(delay)
        log.warning("game %s seq %d: move %s not delivered", turn.game_id, turn.seq, move)
        return False

    def ended(self, message: EndedMessage, group: asyncio.TaskGroup) -> None:
        """Log the result from the bot's side, forget the game, tell `on_result`."""
        self.positions.forget(message.game_id)
        detail = f": {message.detail}" if message.detail else ""
        log.info("game %s: %s (%s%s)", message.game_id, _verdict(message), message.reason, detail)
        if self.on_result is None:
            return
        try:
            outcome = self.on_result(message)
        except Exception as exc:
            log.warning("on_result failed: %s: %s", type(exc).__name__, exc)
            return
        if inspect.isawaitable(outcome):
            group.create_task(_logged(outcome, "on_result"))


# -- positions ----------------------------------------------------------------------------------


@dataclass
class _Game:
    spec: tuple[str, tuple[tuple[str, str], ...]]
    state: State
    moves: list[str]


class _Positions:
    """The latest position of each game the bot plays, so a turn replays only new moves."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.games: OrderedDict[str, _Game] = OrderedDict()
        self.loaded: dict[tuple[str, tuple[tuple[str, str], ...]], Game] = {}

    def rules(self, game: str, options: dict[str, str]) -> Game:
        """The rules of a game type, loaded once (what the SDK's warm-up does first)."""
        spec = (game, tuple(sorted(options.items())))
        rules = self.loaded.get(spec)
        if rules is None:
            rules = self.loaded[spec] = load_game(game, **options)
        return rules

    def state_for(self, turn: TurnMessage) -> State:
        """The position after the turn's moves (shared: copy it before handing it out)."""
        spec = (turn.game, tuple(sorted(turn.options.items())))
        entry = self.games.get(turn.game_id)
        if entry is None or entry.spec != spec or turn.moves[: len(entry.moves)] != entry.moves:
            state = self.rules(turn.game, turn.options).new_initial_state()
            entry = _Game(spec, state, [])
        for text in turn.moves[len(entry.moves) :]:
            entry.state.apply(text)
            entry.moves.append(text)
        self.games[turn.game_id] = entry
        self.games.move_to_end(turn.game_id)
        if len(self.games) > self.capacity:
            self.games.popitem(last=False)
        return entry.state

    def forget(self, game_id: str) -> None:
        self.games.pop(game_id, None)


# -- small helpers ------------------------------------------------------------------------------


class _Backoff:
    """Capped exponential delays with jitter: each is between half and all of min * 2**n."""

    def __init__(self, low: float, high: float) -> None:
        self.low, self.high, self.attempt = low, high, 0

    def next(self) -> float:
        self.attempt += 1
        ceiling = min(self.high, self.low * 2.0 ** (self.attempt - 1))
        return ceiling * random.uniform(0.5, 1.0)

    def reset(self) -> None:
        self.attempt = 0


def _base(url: str) -> str:
    return url.rstrip("/")


def _seconds_left(deadline_ms: int) -> float | None:
    """Seconds to the deadline (0.0 once it has passed), None when there is no clock."""
    if not deadline_ms:
        return None
    return max(0.0, deadline_ms / 1000 - time.time())


def _legal_text(chosen: object, legal: list[str]) -> str | None:
    """The chosen move's text if it is among the turn's legal moves, else None."""
    try:
        move = str(Move.parse(str(chosen)))
    except InvalidMoveError:
        return None
    return move if move in legal else None


def _takes_turn(choose: Choose) -> bool:
    """Whether `choose` has room for a third argument, the turn."""
    try:
        params = inspect.signature(choose).parameters.values()
    except (TypeError, ValueError):
        return False
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return len(positional) >= 3 or any(p.kind == p.VAR_POSITIONAL for p in params)


def _verdict(message: EndedMessage) -> str:
    if message.winner is None:
        return "draw" if message.draw else "no result"
    return "win" if message.winner == message.seat else "loss"


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def _retry_after(resp: aiohttp.ClientResponse, default: float = 1.0) -> float:
    """The Retry-After header in seconds (a number or an HTTP date), else `default`."""
    value = resp.headers.get("Retry-After", "")
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        return max(0.0, email.utils.parsedate_to_datetime(value).timestamp() - time.time())
    except (TypeError, ValueError):
        return default


async def _error_text(resp: aiohttp.ClientResponse) -> str:
    """An error body as "code: message" when it is the gateway's, else its first text."""
    text = await resp.text()
    try:
        body = ErrorBody.model_validate_json(text)
    except pydantic.ValidationError:
        return text.strip()[:200]
    return f"{body.code}: {body.message}"


def _raise_for_retry(resp: aiohttp.ClientResponse, what: str) -> None:
    if resp.status == 429:
        raise _Retry(f"{what}: 429 too many requests", _retry_after(resp))
    if resp.status >= 500:
        raise _Retry(f"{what}: gateway error {resp.status}")


async def _check_owner(resp: aiohttp.ClientResponse, what: str) -> None:
    if resp.status == 401:
        raise AuthError(f"{what}: the gateway refused the bot key (401 {await _error_text(resp)})")
    if resp.status not in (200, 201):
        raise BotError(f"{what}: {resp.status} {await _error_text(resp)}")


async def _check_stream(resp: aiohttp.ClientResponse) -> None:
    if resp.status == 200:
        return
    if resp.status == 401:
        raise AuthError(f"the gateway refused the bot key (401 {await _error_text(resp)})")
    _raise_for_retry(resp, "stream")
    raise BotError(f"the gateway refused the stream: {resp.status} {await _error_text(resp)}")


async def _move_answered(resp: aiohttp.ClientResponse, turn: TurnMessage, move: str) -> bool:
    if resp.status == 200:
        log.debug("game %s seq %d: %s accepted", turn.game_id, turn.seq, move)
        return True
    if resp.status == 401:
        raise AuthError(f"the gateway refused the bot key (401 {await _error_text(resp)})")
    _raise_for_retry(resp, "move")
    refusal = await _error_text(resp)
    log.warning("game %s seq %d: %s refused (%s)", turn.game_id, turn.seq, move, refusal)
    return True


async def _raise_when_set(stop: asyncio.Event) -> None:
    await stop.wait()
    raise _Stopped


async def _logged(awaitable: Any, what: str) -> None:
    try:
        await awaitable
    except Exception as exc:
        log.warning("%s failed: %s: %s", what, type(exc).__name__, exc)


def _reraise_unless_stopped(failed: ExceptionGroup[Exception]) -> None:
    """A task group ended: nothing if by `stop`, else its first real error, unwrapped."""
    errors = [e for e in failed.exceptions if not isinstance(e, _Stopped)]
    if errors:
        raise errors[0] from None


__all__ = [
    "RESIGN",
    "AuthError",
    "BotError",
    "Choose",
    "OnResult",
    "Prepare",
    "register_bot",
    "rotate_key",
    "run_bot",
    "set_accept_challenges",
]
