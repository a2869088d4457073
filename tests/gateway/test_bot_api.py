"""Bot API v2 over a live gateway and the whole pipeline: self-sufficient turns, warm-up,
resigning, results, and every message checked against the published JSON Schema."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections import defaultdict
from typing import Any

import jsonschema_rs
import pytest
from aiohttp.test_utils import TestClient

from bots.sdk.client import RESIGN, register_bot, run_bot
from bots.sdk.example import choose as example_choose
from engine import State
from schemas.api import EndedMessage, TurnMessage, decode_bot_server_message
from schemas.commands import SeatSpec
from schemas.events import GameCreated, GameEnded
from services.gamelog.fold import GameFold
from services.gateway.live import EndedListener
from services.gateway.turns import _within, ended_message
from services.gateway.views import api_view
from tests.support.gateway import Arena, new_game, until, view

pytestmark = pytest.mark.timeout(180)


async def register(client: TestClient, name: str) -> str:
    resp = await client.post("/api/bots", json={"name": name, "accept_challenges": True})
    assert resp.status == 201, await resp.text()
    key: str = (await resp.json())["key"]
    return key


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def ended_view(client: TestClient, gid: str) -> dict[str, Any] | None:
    v = await view(client, gid)
    return v if v["status"] == "ended" else None


class Published:
    """The gateway's published message schema, and every message checked against it."""

    def __init__(self, schema: dict[str, Any]) -> None:
        defs = schema["$defs"]
        self.any = jsonschema_rs.validator_for(schema)
        self.server = jsonschema_rs.validator_for({"$defs": defs, **defs["BotServerMessage"]})
        self.client = jsonschema_rs.validator_for({"$defs": defs, **defs["BotClientMessage"]})
        self.kinds: set[tuple[str, str]] = set()

    def from_server(self, text: str | bytes, how: str) -> Any:
        message = json.loads(text)
        self.server.validate(message)  # raises with the reason
        self.kinds.add((how, message["type"]))
        return decode_bot_server_message(text)

    def from_bot(self, message: dict[str, Any], how: str) -> str:
        self.client.validate(message)
        self.kinds.add((how, message["type"]))
        return json.dumps(message)


async def published(client: TestClient) -> Published:
    """The schema served beside (and listed in) the OpenAPI document."""
    paths = (await (await client.get("/openapi.json")).json())["paths"]
    assert "/api/bot/messages.json" in paths
    resp = await client.get("/api/bot/messages.json")
    assert resp.status == 200
    return Published(await resp.json())


# -- warm-up: a slow first turn of each game type costs the bot no time ------------------------
async def test_a_bot_preparing_each_game_type_loses_no_game_on_time(
    arena: Arena, client: TestClient
) -> None:
    """An SDK bot with 0.5 s a move whose rules take 2 s to get ready for each game type (it
    cannot move before): the gateway holds each first turn's clock until it is ready."""
    url = str(client.make_url("")).rstrip("/")
    key = await register_bot(url, "warming", accept_challenges=True)
    loaded: dict[tuple[str, str], threading.Event] = defaultdict(threading.Event)
    prepared: list[str] = []

    def prepare(game: str, options: dict[str, str]) -> None:
        prepared.append(game)
        time.sleep(2.0)  # a bot loading its network or opening book
        loaded[game, json.dumps(options, sort_keys=True)].set()

    def choose(state: State, seconds_left: float | None, turn: TurnMessage) -> str:
        # It cannot think before it is ready for the game type; a turn sent before the bot
        # said so would spend its clock here.
        loaded[turn.game, json.dumps(turn.options, sort_keys=True)].wait()
        return str(example_choose(state, seconds_left, turn))

    games = [
        await new_game(client, game, seats=seats, move_time=0.5)
        for game in ("teeko", "supply-chains")
        for seats in ([{"bot": "warming"}, {"bot": "random"}],
                      [{"bot": "random"}, {"bot": "warming"}])
    ]  # fmt: skip
    stop = asyncio.Event()
    bot = asyncio.create_task(run_bot(url, key, choose, stop=stop, prepare=prepare))
    try:
        finals = [await until(lambda g=g: ended_view(client, g["id"]), 120) for g in games]
    finally:
        stop.set()
        await asyncio.wait_for(bot, 10)
    assert all(finals), finals
    for seat, final in zip((1, 2, 1, 2), finals, strict=True):
        result = final["result"]
        lost_on_time = result["reason"] == "time_forfeit" and result["winner"] != seat
        assert not lost_on_time and result["reason"] == "natural", (seat, result)
    assert sorted(prepared) == ["supply-chains", "teeko"]


# -- every message against the published schema ------------------------------------------------
async def test_every_stream_and_socket_message_matches_the_published_schema(
    client: TestClient,
) -> None:
    check = await published(client)
    key = await register(client, "schematic")
    # Over NDJSON: prepare, turns and the result, answered by POSTs of the same bodies.
    gid = (await new_game(client, seats=[{"bot": "schematic"}, {"bot": "random"}], move_time=30))[
        "id"
    ]
    stream = await client.get("/api/bot/stream", headers=auth(key))
    while True:
        line = await asyncio.wait_for(stream.content.readline(), 20)
        if not line.strip():
            continue
        m = check.from_server(line, "ndjson")
        if m.type == "prepare":
            body = json.loads(check.from_bot({"type": "ready", "game": m.game,
                                              "options": m.options}, "ndjson"))  # fmt: skip
            del body["type"]
            resp = await client.post("/api/bot/ready", json=body, headers=auth(key))
            assert resp.status == 200 and (await resp.json())["released"] == 1
        elif m.type == "turn":
            move = {"type": "move", "game_id": gid, "move": m.legal_moves[0], "seq": m.seq,
                    "clock": m.clock}  # fmt: skip
            body = json.loads(check.from_bot(move, "ndjson"))
            del body["type"], body["game_id"]
            resp = await client.post(f"/api/bot/games/{gid}/moves", json=body, headers=auth(key))
            assert resp.status == 200, await resp.text()
        elif m.type == "ended":
            break
    stream.close()
    # Over the socket: the same, plus ping, reply, error and a resignation.
    gid = (await new_game(client, seats=[{"bot": "random"}, {"bot": "schematic"}], move_time=30))[
        "id"
    ]
    ws = await client.ws_connect("/ws/bot", headers=auth(key))
    await ws.send_str(check.from_bot({"type": "ping"}, "ws"))
    await ws.send_str('{"type": "castle"}')  # answered with an error, not fatal
    moved = False
    async for msg in ws:
        m = check.from_server(msg.data, "ws")
        if m.type == "prepare":
            await ws.send_str(check.from_bot({"type": "ready", "game": m.game,
                                              "options": m.options}, "ws"))  # fmt: skip
        elif m.type == "turn" and not moved:
            moved = True
            await ws.send_str(check.from_bot({"type": "move", "game_id": gid,
                                              "move": m.legal_moves[0], "seq": m.seq,
                                              "clock": m.clock}, "ws"))  # fmt: skip
        elif m.type == "turn":
            await ws.send_str(check.from_bot({"type": "resign", "game_id": gid}, "ws"))
        elif m.type == "ended":
            break
    await ws.close()
    server = {"prepare", "turn", "ended"}
    assert {k for how, k in check.kinds if how == "ndjson"} >= server | {"ready", "move"}
    everything = server | {"ping", "reply", "error", "ready", "move", "resign"}
    assert {k for how, k in check.kinds if how == "ws"} == everything
    assert not check.any.is_valid({"type": "turn", "game_id": gid})  # the schema has teeth


# -- resigning ---------------------------------------------------------------------------------
async def test_a_bot_resigns_over_http_and_the_sdk_resigns_for_it(client: TestClient) -> None:
    key = await register(client, "quitter")
    gid = (await new_game(client, seats=[{"bot": "quitter"}, {"bot": "random"}]))["id"]
    stream = await client.get("/api/bot/stream?ready=*", headers=auth(key))
    turn = decode_bot_server_message(await asyncio.wait_for(stream.content.readline(), 20))
    assert turn.type == "turn" and turn.game_id == gid
    stranger = await register(client, "stranger")
    refused = await client.post(f"/api/bot/games/{gid}/resign", headers=auth(stranger))
    assert refused.status == 403 and (await refused.json())["code"] == "not_your_game"
    resp = await client.post(f"/api/bot/games/{gid}/resign", headers=auth(key))
    assert resp.status == 200, await resp.text()
    ended = await _next_ended(stream)
    stream.close()
    final = await view(client, gid)
    assert final["result"]["reason"] == "resignation" and final["result"]["winner"] == 2
    assert (ended.winner, ended.draw, ended.reason) == (2, False, "resignation")
    # The SDK: `choose` answers RESIGN.
    url = str(client.make_url("")).rstrip("/")
    gid = (await new_game(client, seats=[{"bot": "random"}, {"bot": "quitter"}]))["id"]
    stop = asyncio.Event()
    bot = asyncio.create_task(run_bot(url, key, lambda state, left: RESIGN, stop=stop))
    try:
        final = await until(lambda: ended_view(client, gid))
    finally:
        stop.set()
        await asyncio.wait_for(bot, 10)
    assert final["result"]["reason"] == "resignation" and final["result"]["winner"] == 1


async def _next_ended(stream: Any) -> EndedMessage:
    async with asyncio.timeout(20):  # keep-alives come meanwhile
        while True:
            line = await stream.content.readline()
            if line.strip():
                message = decode_bot_server_message(line)
                if isinstance(message, EndedMessage):
                    return message


# -- results -----------------------------------------------------------------------------------
async def test_ended_reaches_a_bot_that_never_got_a_turn(client: TestClient) -> None:
    key = await register(client, "bystander")
    stream = await client.get("/api/bot/stream?ready=*", headers=auth(key))
    await asyncio.sleep(0.2)  # the stream is open before the game exists
    created = await new_game(client, seats=[{"human": {}}, {"bot": "bystander"}])
    gid = created["id"]
    resp = await client.post(f"/api/games/{gid}/resign", json={"token": created["tokens"][0]})
    assert resp.status == 200, await resp.text()
    ended = await _next_ended(stream)
    stream.close()
    assert (ended.game_id, ended.seat, ended.winner, ended.draw) == (gid, 2, 2, False)


@pytest.mark.parametrize(
    ("result", "reason", "winner", "draw"),
    [(2, "natural", 2, False), (0, "natural", None, True), (0, "aborted", None, False),
     (0, "abort", None, False)],
    ids=["win", "draw", "aborted", "abort"],
)  # fmt: skip
def test_ended_says_winner_and_draw_as_the_view_does(
    result: int, reason: str, winner: int | None, draw: bool
) -> None:
    base: dict[str, Any] = {"game_id": "g", "command_id": "c", "prev_hash": "", "time": 1}
    seats = [SeatSpec(kind="bot", name="a"), SeatSpec(kind="bot", name="b")]
    created = GameCreated(**base, seq=1, game="teeko", options={}, seats=seats,
                          move_time_ms=0, seed=0, engine_version="1")  # fmt: skip
    end = GameEnded(**base, seq=2, result=result, scores=None, reason=reason)  # type: ignore[arg-type]
    game = GameFold.start(created.model_dump())  # type: ignore[arg-type]
    game.apply(end.model_dump())  # type: ignore[arg-type]
    told = ended_message("g", 1, end.model_dump())
    shown = api_view(game).result
    assert shown is not None
    assert (told.winner, told.draw) == (shown["winner"], shown["draw"]) == (winner, draw)


async def test_a_game_with_a_bank_tells_its_turns_the_limit_and_the_bank(
    client: TestClient,
) -> None:
    key = await register(client, "banker")
    seats = [{"bot": "banker"}, {"bot": "random"}]
    body: dict[str, Any] = {
        "seats": seats, "move_time": 2, "time_bank": 30, "on_timeout": "random_move",
    }  # fmt: skip
    gid = (await new_game(client, **body))["id"]
    v = await view(client, gid)
    events = await (await client.get(f"/api/games/{gid}/events")).json()
    created = events[0]
    assert (created["time_bank_ms"], created["on_timeout"]) == (30_000, "random_move")
    stream = await client.get("/api/bot/stream?ready=teeko", headers=auth(key))
    turn = decode_bot_server_message(await asyncio.wait_for(stream.content.readline(), 20))
    stream.close()
    assert isinstance(turn, TurnMessage) and turn.game_id == gid
    assert (turn.move_time_ms, turn.bank_ms, turn.allowance) == (2_000, 30_000, 32_000)
    assert turn.legal_moves == v["legal_moves"] and turn.ply == 0 and turn.colour == 1
    lonely = await client.post(
        "/api/games", json={"game": "teeko", "seats": body["seats"], "time_bank": 30}
    )
    assert lonely.status == 422


def test_a_bot_stream_hears_of_its_own_games_only_and_overflows_to_the_views() -> None:
    """The hub tells a bot stream of the games created that seat its bot and of their ends,
    nothing of anyone else's; past its bound the stream is told to ask the views instead
    of losing an end."""
    listener = EndedListener("bravo", {"known": 2})
    mine = {"seats": [{"kind": "bot", "name": "alpha"}, {"kind": "bot", "name": "bravo"}]}
    theirs = {"seats": [{"kind": "human", "name": "bravo"}, {"kind": "bot", "name": "alpha"}]}
    listener.created("g1", mine)
    listener.created("g2", theirs)
    assert listener.games == {"known": 2, "g1": 2}
    for gid in ("g1", "g2", "known"):
        listener.ended(gid, {"result": 1, "reason": "natural"})
    told = [listener.queue.get_nowait()[0] for _ in range(listener.queue.qsize())]
    assert told == ["g1", "known"] and not listener.overflowed
    small = EndedListener("bravo", {f"g{i}": 1 for i in range(3)}, asyncio.Queue(2))
    for i in range(3):
        small.ended(f"g{i}", {"result": 0, "reason": "natural"})
    assert small.overflowed and small.queue.qsize() == 2


async def test_a_stream_whose_client_stops_reading_ends_so_its_bot_is_not_served() -> None:
    """A client that reads nothing must not keep its bot 'served' (its games would end as
    the platform's fault): a write that takes longer than the bound ends the stream."""
    stalled = asyncio.Event()

    async def never_read(message: object) -> None:
        await stalled.wait()

    bounded = _within(0.05, never_read)
    with pytest.raises(TimeoutError):
        await bounded(None)
