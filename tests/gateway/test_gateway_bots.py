"""Outside bots through the gateway, and gateways side by side, over real HTTP and Redis."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from bots.sdk.client import AuthError, register_bot, rotate_key, run_bot, set_accept_challenges
from bots.sdk.example import choose
from schemas.api import EndedMessage, decode_bot_server_message, decode_server_message
from schemas.tokens import SEND_GRACE_MS, clock_key, stamped_deadline
from services.bus.connection import connect
from services.bus.keys import Keys
from services.gateway import appkeys
from services.gateway.live import TurnReader
from services.gateway.turns import STREAMS_PER_BOT
from tests.support.cluster import ClusterTarget
from tests.support.gateway import Arena, new_game, play_out, until, view

pytestmark = pytest.mark.timeout(120)


async def register(client: TestClient, name: str, *, accept_challenges: bool = True) -> str:
    """Register `name`; by default it accepts challenges, so any test may seat it."""
    body = {"name": name, "accept_challenges": accept_challenges}
    resp = await client.post("/api/bots", json=body)
    assert resp.status == 201, await resp.text()
    key: str = (await resp.json())["key"]
    return key


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def test_registration_shows_the_key_once_and_keeps_only_its_hash(
    arena: Arena, client: TestClient
) -> None:
    key = await register(client, "outside")
    again = await client.post("/api/bots", json={"name": "outside"})
    assert again.status == 409 and (await again.json())["code"] == "name_taken"
    for builtin in ("random", "random.x"):  # a label names another of the built-in bot
        taken = await client.post("/api/bots", json={"name": builtin})
        assert taken.status == 409 and (await taken.json())["code"] == "name_reserved", builtin
    keys, redis = arena.keys, arena.redis
    stored = repr(
        [await redis.hgetall(keys.registered_bots()), await redis.hgetall(keys.bot_key_hashes())]
    )
    assert "outside" in stored and key not in stored
    for bad in ({}, auth("agon_wrong")):
        resp = await client.get("/api/bot/stream", headers=bad)
        assert resp.status == 401 and (await resp.json())["code"] == "bad_key"


async def test_a_bot_streams_its_turns_answers_them_and_hears_the_result(
    client: TestClient,
) -> None:
    key = await register(client, "streamer", accept_challenges=False)
    body = {"game": "teeko", "seats": [{"bot": "streamer"}, {"bot": "random"}]}
    resp = await client.post("/api/games", json=body, headers=auth(key))  # its own game
    assert resp.status == 201, await resp.text()
    created = await resp.json()
    gid = created["id"]
    stream = await client.get("/api/bot/stream?ready=teeko", headers=auth(key))
    assert stream.headers["Content-Type"].startswith("application/x-ndjson")
    answered = 0
    ended: EndedMessage | None = None
    while ended is None:
        line = await asyncio.wait_for(stream.content.readline(), 10)
        if line.strip() == b"":
            continue  # keep-alive
        message = decode_bot_server_message(line)
        if message.type == "turn":
            assert message.game_id == gid and message.seat == 1 and "token" not in line.decode()
            v = await view(client, gid)
            assert message.moves == v["moves"] and message.seq == v["seq"]
            assert message.legal_moves == v["legal_moves"] and message.ply == v["ply"]
            resp = await client.post(
                f"/api/bot/games/{gid}/moves",
                json={"move": message.legal_moves[0], "seq": message.seq},
                headers=auth(key),
            )
            assert resp.status == 200, await resp.text()
            answered += 1
        elif message.type == "ended":
            ended = message
    stream.close()
    final = await view(client, gid)
    assert ended.game_id == gid and final["status"] == "ended"
    assert answered == sum(1 for s in range(final["ply"]) if s % 2 == 0)
    assert (ended.winner, ended.draw) == (final["result"]["winner"], final["result"]["draw"])


async def test_a_reconnecting_bot_is_sent_its_pending_turn_again(client: TestClient) -> None:
    key = await register(client, "forgetful")
    created = await new_game(client, seats=[{"bot": "forgetful"}, {"bot": "random"}])
    first = await client.get("/api/bot/stream?ready=*", headers=auth(key))
    turn = decode_bot_server_message(await asyncio.wait_for(first.content.readline(), 10))
    first.close()  # dropped before answering
    second = await client.get("/api/bot/stream?ready=*", headers=auth(key))
    again = decode_bot_server_message(await asyncio.wait_for(second.content.readline(), 10))
    assert (again.type, again.game_id, again.seq) == ("turn", created["id"], turn.seq)
    second.close()


async def test_a_bot_plays_over_its_websocket(client: TestClient) -> None:
    key = await register(client, "socketeer")
    seats = [{"bot": "socketeer"}, {"bot": "random"}]
    created = await new_game(client, seats=seats, move_time=60)
    ws = await client.ws_connect("/ws/bot?ready=teeko", headers=auth(key))
    seen: dict[str, Any] = {}
    signer = clock_key(client.app[appkeys.SECRET])
    async for msg in ws:
        m = decode_bot_server_message(msg.data)
        seen.setdefault(m.type, m)
        if m.type == "turn":
            # A clocked turn carries its signed deadline (with the platform's send grace);
            # sent back, the clock runs from the hand-over.
            stamped = stamped_deadline(signer, m.game_id, m.seq, m.clock)
            assert stamped == m.deadline + SEND_GRACE_MS and m.deadline > 0, m
            assert m.allowance == m.move_time_ms == 60_000 and m.bank_ms == 0, m
            move = {"type": "move", "game_id": m.game_id, "move": m.legal_moves[0]}
            await ws.send_str(json.dumps(move | {"seq": m.seq, "clock": m.clock}))
        elif m.type == "reply":
            assert m.ok, m
        elif m.type == "ended":
            break
    await ws.close()
    assert seen["ended"].game_id == created["id"] and seen["reply"].ok


async def test_the_sdk_example_bot_plays_supply_chains_to_the_end(
    arena: Arena, client: TestClient
) -> None:
    url = str(client.make_url("")).rstrip("/")
    key = await register_bot(url, "example", accept_challenges=True)
    created = await new_game(client, "supply-chains", seats=[{"bot": "random"}, {"bot": "example"}])
    results: list[Any] = []
    stop = asyncio.Event()
    bot = asyncio.create_task(run_bot(url, key, choose, stop=stop, on_result=results.append))
    try:
        final = await until(lambda: _ended(client, created["id"]), timeout_s=90)
        assert final and final["ply"] > 10
        assert await until(lambda: _true(results), timeout_s=10)
    finally:
        stop.set()
        await asyncio.wait_for(bot, 10)
    assert results[0].game_id == created["id"] and results[0].seat == 2


async def _ended(client: TestClient, gid: str) -> dict[str, Any] | None:
    v = await view(client, gid)
    return v if v["status"] == "ended" else None


async def _true(items: list[Any]) -> bool:
    return bool(items)


async def test_two_gateways_each_spectator_sees_every_event_once(arena: Arena) -> None:
    one, two = await arena.gateway(), await arena.gateway()
    created = await new_game(one)
    sockets = [await g.ws_connect(f"/ws/games/{created['id']}") for g in (one, two, one, two)]
    end = await play_out(two, created["id"], created["tokens"][0])
    for ws in sockets:
        seqs = []
        async for msg in ws:
            m = decode_server_message(msg.data)
            seqs.append(m.seq)
            if m.seq == end["seq"]:
                break
        assert seqs == list(range(1, end["seq"] + 1))
        await ws.close()


async def test_a_socket_far_behind_gets_a_snapshot_then_the_rest(arena: Arena) -> None:
    client = await arena.gateway(snapshot_gap=3)
    created = await new_game(client)
    end = await play_out(client, created["id"], created["tokens"][0])
    ws = await client.ws_connect(f"/ws/games/{created['id']}")
    first = decode_server_message((await ws.receive()).data)
    assert first.type == "snapshot" and first.seq == end["seq"] and first.view.status == "ended"
    await ws.close()


async def test_a_bot_may_hold_only_a_few_streams_per_gateway(client: TestClient) -> None:
    key = await register(client, "greedy-streams")
    held = [await client.get("/api/bot/stream", headers=auth(key)) for _ in range(STREAMS_PER_BOT)]
    assert {r.status for r in held} == {200}
    refused = await client.get("/api/bot/stream", headers=auth(key))
    assert refused.status == 429 and (await refused.json())["code"] == "too_many_streams"
    held[0].close()
    again = await until(lambda: _opened(client, key))
    assert again
    for stream in held[1:]:
        stream.close()


async def _opened(client: TestClient, key: str) -> bool:
    resp = await client.get("/api/bot/stream", headers=auth(key))
    ok = resp.status == 200
    resp.close()
    return ok


async def test_socket_messages_count_against_the_rate_limit(arena: Arena) -> None:
    client = await arena.gateway(rate_per_s=1.0, burst=4)
    created = await new_game(client)
    ws = await client.ws_connect(f"/ws/games/{created['id']}")
    for _ in range(6):
        await ws.send_str('{"type": "ping"}')
    kinds = []
    async for msg in ws:
        m = decode_server_message(msg.data)
        if m.type in ("ping", "error"):
            kinds.append(m.type if m.type == "ping" else m.code)
        if len(kinds) == 6:
            break
    assert "rate_limited" in kinds and "ping" in kinds
    await ws.close()


async def _reader_delivers_each_inbox_to_its_listeners(redis: Any, keys: Keys) -> None:
    """One TurnReader follows several bots' inboxes and hands each entry to the listeners of
    its bot only; a bot whose last listener went is no longer read."""
    reader = TurnReader(redis, keys, "gw-test")
    stop = asyncio.Event()
    running = asyncio.create_task(reader.run(stop))
    try:
        listeners = {b: [reader.listen(b, "h"), reader.listen(b, "h")] for b in ("a", "b", "c")}
        for bot in listeners:
            reader.start(bot, "0-0")
        for bot in ("a", "c"):
            await redis.xadd(keys.bot_turns(bot), {"m": f"turn of {bot}"})
        for bot, pair in listeners.items():
            for listener in pair:
                entries, _ = await listener.take(0.5 if bot == "b" else 5.0)
                sent = [e[1][b"m"].decode() for e in entries]
                assert sent == ([] if bot == "b" else [f"turn of {bot}"]), (bot, sent)
        for listener in listeners["a"]:
            reader.unlisten(listener)
        assert "a" not in reader.last and reader.streams("b") == 2
    finally:
        stop.set()
        await asyncio.wait_for(running, 5)


async def test_one_reader_fans_inboxes_out(redis: Any, namespace: str) -> None:
    await _reader_delivers_each_inbox_to_its_listeners(redis, Keys(prefix=namespace))


async def test_one_reader_fans_inboxes_out_on_a_cluster(cluster_url: ClusterTarget) -> None:
    redis = await connect(cluster_url.url)
    try:
        await _reader_delivers_each_inbox_to_its_listeners(redis, Keys(prefix=cluster_url.prefix))
    finally:
        await redis.aclose()


async def test_the_sdk_rotates_its_key_and_sets_its_consent(client: TestClient) -> None:
    url = str(client.make_url("")).rstrip("/")
    old = await register_bot(url, "sdk-bot")
    refused = await client.post("/api/games", json={"game": "teeko", "seats": SDK_SEATS})
    assert refused.status == 403 and (await refused.json())["code"] == "bot_consent_required"
    new = await rotate_key(url, "sdk-bot", old)
    with pytest.raises(AuthError):
        await set_accept_challenges(url, "sdk-bot", old, True)
    await set_accept_challenges(url, "sdk-bot", new, True)
    accepted = await client.post("/api/games", json={"game": "teeko", "seats": SDK_SEATS})
    assert accepted.status == 201, await accepted.text()


SDK_SEATS = [{"bot": "sdk-bot"}, {"bot": "random"}]
