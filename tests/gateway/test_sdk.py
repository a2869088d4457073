"""The Bot SDK against a small scripted gateway (a real aiohttp server defined here).

Each stream connection of the fake gateway plays the next script of the test: it writes NDJSON
lines (turns of a Teeko game, keep-alive empty lines, `ended`) and may wait for the bot's
moves in between; once the script is done the stream stays open with keep-alives. Every POSTed
move is recorded with its arrival time. The end-to-end test against the real gateway lives
with the gateway.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from subprocess import PIPE
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from bots.sdk import RESIGN, AuthError, BotError, register_bot, run_bot
from bots.sdk.__main__ import main
from bots.sdk.example import choose as example_choose
from engine import Move, State, load_game
from schemas.api import EndedMessage

ROOT = Path(__file__).resolve().parents[2]
KEY = "good-key"
GAME = "g1"

Script = Callable[["FakeGateway", web.Request], Awaitable[web.StreamResponse]]


def turn(
    seq: int,
    moves: list[str],
    *,
    game_id: str = GAME,
    deadline: int = 0,
    clock: str = "",
    legal: list[str] | None = None,
) -> dict[str, Any]:
    """A turn as the gateway sends it; `legal` overrides the legal moves it carries."""
    seat = 1 + len(moves) % 2
    return {
        "clock": clock,
        "type": "turn",
        "game_id": game_id,
        "game": "teeko",
        "options": {},
        "seat": seat,
        "colour": seat,
        "ply": len(moves),
        "seq": seq,
        "moves": moves,
        "legal_moves": [str(m) for m in position(moves).legal_moves()] if legal is None else legal,
        "deadline": deadline,
    }


def ended(winner: int, *, seat: int = 1, reason: str = "line") -> dict[str, Any]:
    return {
        "type": "ended", "game_id": GAME, "seat": seat, "winner": winner or None,
        "draw": not winner and reason != "abort", "reason": reason,
    }  # fmt: skip


def error_body(status: int, code: str, **headers: str) -> web.Response:
    body = {"code": code, "message": code.replace("_", " "), "seq": None}
    return web.json_response(body, status=status, headers=headers)


def position(moves: list[str]) -> State:
    state = load_game("teeko").new_initial_state()
    for move in moves:
        state.apply(move)
    return state


def first_legal(moves: list[str]) -> str:
    return str(position(moves).legal_moves()[0])


async def eventually(predicate: Callable[[], object], timeout: float = 5.0) -> None:
    """Wait (polling) until `predicate()` holds; fail the test after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail("timed out waiting for the bot")
        await asyncio.sleep(0.01)


class FakeGateway:
    """The bot routes of the gateway, scripted per stream connection."""

    def __init__(self) -> None:
        self.url = ""
        self.scripts: list[Script] = []
        self.move_replies: list[web.Response] = []
        self.connects: list[float] = []
        self.moves: list[tuple[str, dict[str, Any]]] = []
        self.move_times: list[float] = []
        self.names: set[str] = set()
        self.registrations: list[dict[str, Any]] = []
        self.ready: list[dict[str, Any]] = []
        self.resigned: list[str] = []
        self.closed = asyncio.Event()

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/api/bot/stream", self.stream)
        app.router.add_post("/api/bot/games/{game_id}/moves", self.move)
        app.router.add_post("/api/bot/games/{game_id}/resign", self.resign)
        app.router.add_post("/api/bot/ready", self.got_ready)
        app.router.add_post("/api/bots", self.register)
        return app

    async def stream(self, request: web.Request) -> web.StreamResponse:
        self.connects.append(time.monotonic())
        if request.headers.get("Authorization") != f"Bearer {KEY}":
            return error_body(401, "unauthorized")
        script = self.scripts.pop(0) if self.scripts else hold_only
        return await script(self, request)

    async def move(self, request: web.Request) -> web.Response:
        self.moves.append((request.match_info["game_id"], await request.json()))
        self.move_times.append(time.monotonic())
        if self.move_replies:
            return self.move_replies.pop(0)
        return web.json_response({"seq": self.moves[-1][1]["seq"] + 1})

    async def resign(self, request: web.Request) -> web.Response:
        self.resigned.append(request.match_info["game_id"])
        return web.json_response({"seq": 9})

    async def got_ready(self, request: web.Request) -> web.Response:
        self.ready.append(await request.json())
        return web.json_response({"released": 1})

    async def register(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.registrations.append(body)
        name = body["name"]
        if name in self.names:
            return error_body(409, "name_taken")
        self.names.add(name)
        return web.json_response({"name": name, "key": f"key-of-{name}"}, status=201)

    def seqs(self) -> list[int]:
        return [body["seq"] for _, body in self.moves]


async def open_stream(request: web.Request) -> web.StreamResponse:
    resp = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
    await resp.prepare(request)
    return resp


async def send(resp: web.StreamResponse, *messages: dict[str, Any] | None) -> None:
    """Write each message as one line; None writes an empty line (a keep-alive)."""
    for message in messages:
        line = json.dumps(message) if message is not None else ""
        await resp.write(line.encode() + b"\n")


async def hold(gw: FakeGateway, resp: web.StreamResponse) -> web.StreamResponse:
    """Keep the stream open with keep-alives until the bot leaves or the test ends."""
    with contextlib.suppress(ConnectionError):
        while not gw.closed.is_set():
            await send(resp, None)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(gw.closed.wait(), 0.05)
    return resp


async def hold_only(gw: FakeGateway, request: web.Request) -> web.StreamResponse:
    return await hold(gw, await open_stream(request))


@pytest.fixture
async def gw() -> AsyncIterator[FakeGateway]:
    gateway = FakeGateway()
    server = TestServer(gateway.app())
    await server.start_server()
    gateway.url = str(server.make_url("/"))
    try:
        yield gateway
    finally:
        gateway.closed.set()
        await server.close()


@contextlib.asynccontextmanager
async def bot_running(
    gw: FakeGateway, choose: Callable[[State, float | None], Move | str]
) -> AsyncIterator[list[EndedMessage]]:
    """Run the bot (fast reconnects) while the block runs; then stop it, which must be quick."""
    stop = asyncio.Event()
    results: list[EndedMessage] = []
    task = asyncio.create_task(
        run_bot(
            gw.url,
            KEY,
            choose,
            stop=stop,
            on_result=results.append,
            reconnect_min_s=0.01,
            reconnect_max_s=0.05,
        )
    )
    try:
        yield results
    finally:
        stop.set()
        await asyncio.wait_for(task, 2)


class Recorder:
    """A `choose` that records what it was shown and plays the example bot's move."""

    def __init__(self) -> None:
        self.seen: list[tuple[int, float | None]] = []

    def __call__(self, state: State, seconds_left: float | None) -> Move | str:
        self.seen.append((state.ply, seconds_left))
        return example_choose(state, seconds_left)


# -- turns, duplicates, results -----------------------------------------------------------------


async def two_turns_and_duplicates(gw: FakeGateway, request: web.Request) -> web.StreamResponse:
    resp = await open_stream(request)
    await send(resp, turn(0, []), None)
    await eventually(lambda: len(gw.moves) >= 1)
    moves = [gw.moves[0][1]["move"]]
    moves.append(first_legal(moves))  # the opponent's reply
    await send(resp, turn(2, moves), None, turn(2, moves))  # a duplicate while it thinks
    await eventually(lambda: len(gw.moves) >= 2)
    await send(resp, turn(2, moves), turn(0, []))  # re-sent after the answers
    await asyncio.sleep(0.2)  # room for a wrong second answer to arrive
    await send(resp, ended(winner=1))
    return await hold(gw, resp)


async def test_plays_legal_moves_once_per_turn_and_reports_the_result(
    gw: FakeGateway, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="agon.bot")
    gw.scripts = [two_turns_and_duplicates]
    choose = Recorder()
    async with bot_running(gw, choose) as results:
        await eventually(lambda: results)
    assert gw.seqs() == [0, 2]
    assert {game for game, _ in gw.moves} == {GAME}
    first, second = (body["move"] for _, body in gw.moves)
    reply = first_legal([first])
    assert Move.parse(first) in position([]).legal_moves()
    assert Move.parse(second) in position([first, reply]).legal_moves()
    assert [ply for ply, _ in choose.seen] == [0, 2]
    assert [seconds for _, seconds in choose.seen] == [None, None]
    assert [r.winner for r in results] == [1]
    assert f"game {GAME}: win (line)" in caplog.messages
    assert len(gw.connects) == 1


@pytest.mark.parametrize(("winner", "verdict"), [(2, "loss"), (0, "draw")])
async def test_logs_a_loss_or_a_draw_from_the_bots_side(
    gw: FakeGateway, caplog: pytest.LogCaptureFixture, winner: int, verdict: str
) -> None:
    caplog.set_level(logging.INFO, logger="agon.bot")

    async def end_only(gw: FakeGateway, request: web.Request) -> web.StreamResponse:
        resp = await open_stream(request)
        await send(resp, ended(winner, reason="resigned" if winner else "move-limit"))
        return await hold(gw, resp)

    gw.scripts = [end_only]
    async with bot_running(gw, Recorder()) as results:
        await eventually(lambda: results)
    reason = "resigned" if winner else "move-limit"
    assert f"game {GAME}: {verdict} ({reason})" in caplog.messages


async def test_a_turn_past_its_deadline_is_skipped_and_choose_gets_the_time_left(
    gw: FakeGateway,
) -> None:
    now_ms = int(time.time() * 1000)

    async def late_then_timely(gw: FakeGateway, request: web.Request) -> web.StreamResponse:
        resp = await open_stream(request)
        await send(resp, turn(0, [], game_id="late", deadline=now_ms - 1))
        await send(resp, turn(0, [], game_id="timely", deadline=now_ms + 5000, clock="c0ffee"))
        return await hold(gw, resp)

    gw.scripts = [late_then_timely]
    choose = Recorder()
    async with bot_running(gw, choose):
        await eventually(lambda: gw.moves)
        await asyncio.sleep(0.1)  # room for a wrong answer to the late turn
    assert [game for game, _ in gw.moves] == ["timely"]
    assert gw.moves[0][1]["clock"] == "c0ffee"  # the turn's signed deadline, sent back
    [(_, seconds_left)] = choose.seen
    assert seconds_left is not None and 3 < seconds_left <= 5


# -- connection trouble -------------------------------------------------------------------------


async def test_reconnects_after_the_stream_drops_and_after_a_5xx(
    gw: FakeGateway, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="agon.bot")

    async def one_turn_then_drop(gw: FakeGateway, request: web.Request) -> web.StreamResponse:
        resp = await open_stream(request)
        await send(resp, turn(0, []))
        await eventually(lambda: gw.moves)
        return resp  # the stream ends

    async def unavailable(gw: FakeGateway, request: web.Request) -> web.StreamResponse:
        return error_body(503, "unavailable")

    async def pending_turns_again(gw: FakeGateway, request: web.Request) -> web.StreamResponse:
        resp = await open_stream(request)
        moves = [gw.moves[0][1]["move"]]
        moves.append(first_legal(moves))
        await send(resp, turn(0, []), turn(2, moves))
        await eventually(lambda: len(gw.moves) >= 2)
        await send(resp, ended(winner=1))
        return await hold(gw, resp)

    gw.scripts = [one_turn_then_drop, unavailable, pending_turns_again]
    async with bot_running(gw, Recorder()) as results:
        await eventually(lambda: results)
    assert len(gw.connects) == 3
    assert gw.seqs() == [0, 2]
    retries = [m for m in caplog.messages if "reconnecting in" in m]
    assert len(retries) == 2
    assert "closed" in retries[0]
    assert "503" in retries[1]


async def test_a_refused_key_stops_the_bot_with_one_clear_error(gw: FakeGateway) -> None:
    with pytest.raises(AuthError, match="refused the bot key \\(401 unauthorized"):
        await asyncio.wait_for(run_bot(gw.url, "wrong-key", example_choose), 2)
    assert len(gw.connects) == 1


async def test_agon_bot_exits_1_with_one_line_on_a_refused_key(gw: FakeGateway) -> None:
    """`python -m bots.sdk`, as a user runs it (a process, so a retry loop cannot hang the test)."""
    argv = ["--url", gw.url, "--key", "wrong-key", "bots.sdk.example:choose"]
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bots.sdk", *argv, cwd=ROOT, stdout=PIPE, stderr=PIPE
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), 10)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode == 1
    assert out == b""
    [line] = err.decode().splitlines()
    assert "401" in line
    assert len(gw.connects) == 1


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
async def test_agon_bot_says_when_it_is_connected_and_stops_cleanly_on_a_signal(
    gw: FakeGateway, sig: signal.Signals
) -> None:
    argv = ["--url", gw.url, "bots.sdk.example:choose"]
    env = {**os.environ, "AGON_BOT_KEY": KEY}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bots.sdk", *argv, cwd=ROOT, env=env, stdout=PIPE, stderr=PIPE
    )
    try:
        assert proc.stdout is not None
        ready = await asyncio.wait_for(proc.stdout.readline(), 10)
        assert ready.decode().strip() == f"bot connected to {gw.url}"
        proc.send_signal(sig)
        _, err = await asyncio.wait_for(proc.communicate(), 5)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode == 0, err.decode()
    assert b"Traceback" not in err


async def test_a_429_is_retried_after_retry_after(gw: FakeGateway) -> None:
    async def busy(gw: FakeGateway, request: web.Request) -> web.StreamResponse:
        return error_body(429, "rate_limited", **{"Retry-After": "0.3"})

    async def one_turn(gw: FakeGateway, request: web.Request) -> web.StreamResponse:
        resp = await open_stream(request)
        await send(resp, turn(0, []))
        return await hold(gw, resp)

    gw.scripts = [busy, one_turn]
    gw.move_replies = [error_body(429, "rate_limited", **{"Retry-After": "0.3"})]
    async with bot_running(gw, Recorder()):
        await eventually(lambda: len(gw.moves) >= 2)
    assert len(gw.connects) == 2
    assert gw.connects[1] - gw.connects[0] >= 0.3
    assert gw.moves[0] == gw.moves[1]
    assert gw.move_times[1] - gw.move_times[0] >= 0.3


# -- a failing choose ----------------------------------------------------------------------------


def boom(state: State, seconds_left: float | None) -> str:
    raise RuntimeError("boom")


@pytest.mark.parametrize(
    ("choose", "played", "warning"),
    [
        (boom, "C1", "choose failed: RuntimeError: boom"),
        (lambda state, left: "A1", "C1", "illegal move 'A1'"),
        (lambda state, left: "zz", "C1", "illegal move 'zz'"),
        (lambda state, left: Move.parse("E5"), "E5", None),
    ],
    ids=["raises", "occupied", "not-a-move", "legal"],
)
async def test_a_failing_choose_falls_back_to_the_first_legal_move(
    gw: FakeGateway,
    caplog: pytest.LogCaptureFixture,
    choose: Callable[[State, float | None], Move | str],
    played: str,
    warning: str | None,
) -> None:
    async def one_turn(gw: FakeGateway, request: web.Request) -> web.StreamResponse:
        resp = await open_stream(request)
        await send(resp, turn(2, ["A1", "B1"]))
        return await hold(gw, resp)

    gw.scripts = [one_turn]
    async with bot_running(gw, choose):
        await eventually(lambda: gw.moves)
    assert gw.moves == [(GAME, {"move": played, "seq": 2})]
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    if warning is None:
        assert warnings == []
    else:
        assert len(warnings) == 1
        assert warning in warnings[0]
        assert warnings[0].endswith(f"playing {played}")


async def test_only_the_turns_legal_moves_are_played_and_the_turn_is_given_to_choose(
    gw: FakeGateway,
) -> None:
    seen: list[Any] = []

    def choose(state: State, seconds_left: float | None, turn: Any) -> str:
        seen.append(turn)
        return "C1"  # legal by the rules, but not among what the turn offers

    async def one_turn(gw: FakeGateway, request: web.Request) -> web.StreamResponse:
        resp = await open_stream(request)
        await send(resp, turn(2, ["A1", "B1"], legal=["E5", "D4"]))
        return await hold(gw, resp)

    gw.scripts = [one_turn]
    async with bot_running(gw, choose):
        await eventually(lambda: gw.moves)
    assert gw.moves == [(GAME, {"move": "E5", "seq": 2})]
    assert seen[0].legal_moves == ["E5", "D4"] and seen[0].ply == 2


async def test_prepare_runs_the_hook_then_says_ready_and_resign_resigns(gw: FakeGateway) -> None:
    prepared: list[tuple[str, dict[str, str]]] = []

    async def prepare_then_turn(gw: FakeGateway, request: web.Request) -> web.StreamResponse:
        resp = await open_stream(request)
        await send(resp, {"type": "prepare", "game": "teeko", "options": {"markers": "8"}})
        await eventually(lambda: gw.ready)
        await send(resp, turn(0, []))
        return await hold(gw, resp)

    gw.scripts = [prepare_then_turn]
    stop = asyncio.Event()
    task = asyncio.create_task(
        run_bot(
            gw.url, KEY, lambda state, left: RESIGN, stop=stop,
            prepare=lambda game, options: prepared.append((game, options)),
        )
    )  # fmt: skip
    try:
        await eventually(lambda: gw.resigned)
    finally:
        stop.set()
        await asyncio.wait_for(task, 2)
    assert prepared == [("teeko", {"markers": "8"})]
    assert gw.ready == [{"game": "teeko", "options": {"markers": "8"}}]
    assert gw.resigned == [GAME] and gw.moves == []


def test_the_example_bot_takes_an_immediate_win() -> None:
    state = position(["A1", "A5", "B1", "B5", "C1", "C5"])
    assert str(example_choose(state, None)) == "D1"


# -- registration and the command line ----------------------------------------------------------


async def test_register_bot_returns_the_key_and_refuses_a_taken_name(gw: FakeGateway) -> None:
    assert await register_bot(gw.url, "mybot") == "key-of-mybot"
    with pytest.raises(BotError, match="'mybot' is taken"):
        await register_bot(gw.url, "mybot")
    # Consent is the bot's to give: only on request may anyone seat it.
    await register_bot(gw.url, "willing", accept_challenges=True)
    assert [r["accept_challenges"] for r in gw.registrations] == [False, False, True]


@pytest.mark.parametrize(
    ("target", "says"),
    [
        ("no_such_module_xyz:choose", "cannot import no_such_module_xyz"),
        ("bots.sdk.example:nope", "has no function 'nope'"),
        ("bots.sdk.example", "is not module:function"),
    ],
)
def test_agon_bot_exits_2_with_one_line_for_a_bad_target(
    capsys: pytest.CaptureFixture[str], target: str, says: str
) -> None:
    assert main(["--url", "http://127.0.0.1:1", "--key", "k", target]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    [line] = captured.err.splitlines()
    assert says in line


def test_agon_bot_exits_2_without_a_key(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("AGON_BOT_KEY", raising=False)
    assert main(["--url", "http://127.0.0.1:1", "bots.sdk.example:choose"]) == 2
    [line] = capsys.readouterr().err.splitlines()
    assert "AGON_BOT_KEY" in line
