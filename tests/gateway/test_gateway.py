"""The gateway over real HTTP and WebSockets against a real Redis and the whole pipeline."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import jsonschema_rs
import msgpack
import pytest
from aiohttp import WSMsgType
from aiohttp.test_utils import TestClient

from engine import game_names
from schemas.api import decode_server_message
from schemas.codec import FIELD_BYTES
from services.bus.connection import connect
from services.bus.feeds import FeedTail
from services.bus.keys import Keys
from services.gamelog.export import verify_export
from services.gateway.live import Hub
from services.gateway.routes import ROUTES, openapi
from tests.support.cluster import ClusterTarget
from tests.support.gateway import Arena, new_game, play_out, until, view

#: A body sent as raw bytes, declared JSON (anything else is refused with 415).
JSON_BODY = {"Content-Type": "application/json"}

pytestmark = pytest.mark.timeout(120)


async def test_a_person_plays_teeko_against_the_random_bot_to_the_end(client: TestClient) -> None:
    created = await new_game(client)
    token = created["tokens"][0]
    assert created["tokens"][1] is None and len(token) >= 24
    first = await view(client, created["id"])
    assert first["status"] == "playing" and first["to_move"] == 1
    assert len(first["legal_moves"]) == 25 and first["board"]["hands"] == [8, 8]
    assert [c["label"] for c in first["board"]["cells"][:2]] == ["A1", "B1"]
    end = await play_out(client, created["id"], token)
    assert end["status"] == "ended" and end["legal_moves"] == [] and end["to_move"] is None
    assert end["result"]["reason"] in ("natural", "resignation")
    assert len(end["moves"]) == end["ply"]
    # Every position of the replay agrees with the moves played up to it.
    for ply in (0, 1, end["ply"] // 2, end["ply"]):
        at = await view(client, created["id"], ply=ply)
        assert at["ply"] == ply and at["moves"] == end["moves"][:ply]
    assert (await view(client, created["id"], ply=0))["board"]["hands"] == [8, 8]


async def test_a_page_of_plies_is_every_ply_view_from_one_fold(client: TestClient) -> None:
    created = await new_game(client)
    end = await play_out(client, created["id"], created["tokens"][0])
    gid, total = created["id"], end["ply"]
    views: list[dict[str, Any]] = []
    for first in range(0, total + 1, 50):  # pages of 50, the last one past the end
        resp = await client.get(f"/api/games/{gid}/plies?from_ply={first}&to_ply={first + 49}")
        assert resp.status == 200
        views += (await resp.json())["views"]
    assert [v["ply"] for v in views] == list(range(total + 1))
    for ply in range(total + 1):
        assert views[ply] == await view(client, gid, ply=ply), f"ply {ply}"
    resp = await client.get(f"/api/games/{gid}/plies?from_ply=2&to_ply=3")
    assert [v["ply"] for v in (await resp.json())["views"]] == [2, 3]
    resp = await client.get(f"/api/games/{gid}/plies?from_ply=0&to_ply=50")
    assert resp.status == 400 and (await resp.json())["code"] == "bad_request"  # > a page
    resp = await client.get("/api/games/nope/plies")
    assert resp.status == 404 and (await resp.json())["code"] == "unknown_game"


async def test_a_refused_move_says_why_with_the_pipelines_code(client: TestClient) -> None:
    created = await new_game(client)
    gid, token = created["id"], created["tokens"][0]
    v = await view(client, gid)
    cases = [
        ({"move": "Z9", "seq": v["seq"], "token": token}, 422, "invalid_move"),
        ({"move": "A1", "seq": v["seq"] - 1, "token": token}, 409, "stale_seq"),
        ({"move": "A1", "seq": v["seq"], "token": "x" * 32}, 403, "bad_token"),
        ({"move": "A1", "seq": v["seq"]}, 422, "invalid_request"),
    ]
    for body, status, code in cases:
        resp = await client.post(f"/api/games/{gid}/moves", json=body)
        got = await resp.json()
        assert (resp.status, got["code"]) == (status, code), got
        assert got["message"]
    assert (await view(client, gid))["seq"] == v["seq"]  # nothing changed
    resp = await client.post("/api/games/nope/moves", json={"move": "A1", "seq": 1, "token": "t"})
    assert resp.status == 404 and (await resp.json())["code"] == "unknown_game"
    resp = await client.post(f"/api/games/{gid}/moves", data=b"{not json", headers=JSON_BODY)
    assert resp.status == 400 and (await resp.json())["code"] == "bad_request"


async def test_bad_game_requests_are_one_clear_refusal(client: TestClient) -> None:
    bad = [
        ({"game": "chess", "seats": [{"human": {}}, {"bot": "random"}]}, "unknown_game"),
        ({"game": "teeko", "seats": [{"human": {}}, {"bot": "nobody"}]}, "unknown_bot"),
        ({"game": "teeko", "seats": [{"human": {}}]}, "invalid_request"),
        ({"game": "teeko", "options": {"markers": "9"}, "seats": [{"human": {}}] * 2}, "malformed"),
    ]
    for body, code in bad:
        resp = await client.post("/api/games", json=body)
        got = await resp.json()
        assert got["code"] == code and 400 <= resp.status < 500, got
    resp = await client.get("/api/games", params={"status": "paused"})
    assert resp.status == 400
    resp = await client.get("/no/such/route")
    assert resp.status == 404 and (await resp.json())["code"] == "not_found"


async def test_msgpack_when_asked_and_resignation(client: TestClient) -> None:
    created = await new_game(client, "overflow")
    gid, token = created["id"], created["tokens"][0]
    resp = await client.get(f"/api/games/{gid}", headers={"Accept": "application/msgpack"})
    assert resp.content_type == "application/msgpack"
    got = msgpack.unpackb(await resp.read())
    assert got["id"] == gid and {"label", "height", "house"} <= set(got["board"]["cells"][0])
    resp = await client.post(f"/api/games/{gid}/resign", json={"token": token})
    assert resp.status == 200
    v = await view(client, gid)
    assert v["status"] == "ended" and v["result"]["reason"] == "resignation"
    assert v["result"]["winner"] == 2


async def test_the_game_list_filters_and_pages(arena: Arena, client: TestClient) -> None:
    ids = [(await new_game(client, g))["id"] for g in ("teeko", "teeko", "hexade")]

    async def listed() -> list[str]:
        resp = await client.get("/api/games", params={"game": "teeko", "limit": "1"})
        page = await resp.json()
        found = [g["id"] for g in page["games"]]
        while page["cursor"]:
            resp = await client.get(
                "/api/games", params={"game": "teeko", "limit": "1", "cursor": page["cursor"]}
            )
            page = await resp.json()
            found += [g["id"] for g in page["games"]]
        return found if len(found) == 2 else []

    assert sorted(await until(listed)) == sorted(ids[:2])


async def test_events_as_json_and_as_a_live_ndjson_stream(client: TestClient) -> None:
    created = await new_game(client)
    gid = created["id"]
    resp = await client.get(f"/api/games/{gid}/events", params={"since": "1"})
    events = await resp.json()
    assert [e["seq"] for e in events] == list(range(2, len(events) + 2))
    stream = await client.get(
        f"/api/games/{gid}/events", headers={"Accept": "application/x-ndjson"}
    )
    end = await play_out(client, gid, created["tokens"][0])
    lines = [json.loads(line) for line in (await stream.text()).splitlines() if line]
    assert [e["seq"] for e in lines] == list(range(1, end["seq"] + 1))
    assert lines[-1]["type"] == "game_ended"


async def test_export_verifies_offline_and_the_text_record_reads_like_pgn(
    client: TestClient,
) -> None:
    created = await new_game(client)
    end = await play_out(client, created["id"], created["tokens"][0])
    resp = await client.get(f"/api/games/{created['id']}/export", params={"format": "jsonl"})
    text = await resp.text()
    game_id, count, problems = verify_export(text)
    assert (game_id, count, problems) == (created["id"], end["seq"], [])
    record = await (await client.get(f"/api/games/{created['id']}/export?format=text")).text()
    assert '[Game "teeko"]' in record and f"1. seat 1: {end['moves'][0]}" in record
    assert created["tokens"][0] not in record and created["tokens"][0] not in text


async def _socket_events(ws: Any, until_seq: int) -> list[int]:
    seqs: list[int] = []
    async for msg in ws:
        assert msg.type == WSMsgType.TEXT
        m = decode_server_message(msg.data)
        if m.type == "event":
            seqs.append(m.seq)
            if m.seq >= until_seq:
                break
    return seqs


async def test_a_socket_resumes_with_exactly_the_missed_events(client: TestClient) -> None:
    created = await new_game(client)
    gid, token = created["id"], created["tokens"][0]
    ws = await client.ws_connect(f"/ws/games/{gid}")
    start = await view(client, gid)
    assert await _socket_events(ws, start["seq"]) == list(range(1, start["seq"] + 1))
    await ws.close()  # dropped; play goes on
    end = await play_out(client, gid, token)
    again = await client.ws_connect(f"/ws/games/{gid}", params={"since": str(start["seq"])})
    got = await _socket_events(again, end["seq"])
    assert got == list(range(start["seq"] + 1, end["seq"] + 1))
    await again.close()


async def test_a_seat_plays_through_its_socket(client: TestClient) -> None:
    created = await new_game(client)
    gid, token = created["id"], created["tokens"][0]
    ws = await client.ws_connect(f"/ws/games/{gid}")
    v = await view(client, gid)
    await ws.send_str(json.dumps({"type": "move", "move": "C3", "seq": v["seq"], "token": token}))
    await ws.send_str(json.dumps({"type": "dance"}))
    kinds: dict[str, Any] = {}
    async for msg in ws:
        m = decode_server_message(msg.data)
        kinds.setdefault(m.type, m)
        if "reply" in kinds and "error" in kinds:
            break
    assert kinds["reply"].ok and kinds["reply"].seq == v["seq"] + 1
    assert kinds["error"].code == "invalid_request"
    await ws.close()


async def test_sockets_refuse_foreign_pages(client: TestClient) -> None:
    created = await new_game(client)
    resp = await client.get(
        f"/ws/games/{created['id']}",
        headers={"Origin": "https://evil.example", "Upgrade": "websocket", "Connection": "Upgrade",
                 "Sec-WebSocket-Version": "13", "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ=="},
    )  # fmt: skip
    assert resp.status == 403 and (await resp.json())["code"] == "forbidden_origin"


async def test_rate_limit_answers_429_with_retry_after(arena: Arena) -> None:
    client = await arena.gateway(rate_per_s=1.0, burst=3)
    statuses = [(await client.get("/api/games")).status for _ in range(5)]
    assert statuses[:3] == [200, 200, 200] and statuses[-1] == 429
    resp = await client.get("/api/games")
    assert int(resp.headers["Retry-After"]) >= 1 and (await resp.json())["code"] == "rate_limited"


async def test_oversized_bodies_are_refused(arena: Arena) -> None:
    client = await arena.gateway(max_body_bytes=1024)
    resp = await client.post("/api/games", data=b"x" * 4096, headers=JSON_BODY)
    assert resp.status == 413 and (await resp.json())["code"] == "too_large"


async def test_openapi_documents_exactly_the_served_routes(client: TestClient) -> None:
    doc = await (await client.get("/openapi.json")).json()
    assert doc == json.loads(json.dumps(openapi())) and doc["openapi"].startswith("3.1")
    served = {
        (r.method, r.resource.canonical)
        for r in client.app.router.routes()  # type: ignore[union-attr]
        if r.method != "HEAD" and r.resource is not None
    }
    documented = {(m.upper(), p) for p, ops in doc["paths"].items() for m in ops}
    assert served == documented == {(r.method, r.path) for r in ROUTES}
    for path, ops in doc["paths"].items():
        for op in ops.values():
            for answer in op["responses"].values():
                for media in answer.get("content", {}).values():
                    ref = media["schema"].get("$ref", "")
                    assert not ref or ref.split("/")[-1] in doc["components"]["schemas"], path


async def test_metrics_and_health(client: TestClient) -> None:
    created = await new_game(client)
    await play_out(client, created["id"], created["tokens"][0])
    text = await (await client.get("/metrics")).text()
    for name in ("agon_command_seconds_bucket", 'agon_commands_total{code="accepted"}',
                 "agon_consumer_lag", "agon_consumer_pending", "agon_live_games",
                 'agon_turn_lag_ms{stage="delivery"}', "agon_turns_undelivered"):  # fmt: skip
        assert name in text, name
    assert created["tokens"][0] not in text
    health = await (await client.get("/health")).json()
    assert health["status"] == "ok" and health["redis"] is True


async def test_a_supply_chains_view_shows_chains_surplus_and_warehouses(client: TestClient) -> None:
    created = await new_game(client, "supply-chains")
    gid, token = created["id"], created["tokens"][0]
    for _ in range(4):  # a few of our moves, and the bot's answers
        v = await until(lambda: _my_turn(client, gid))
        resp = await client.post(
            f"/api/games/{gid}/moves",
            json={"move": v["legal_moves"][0], "seq": v["seq"], "token": token},
        )
        assert resp.status == 200
    board = (await until(lambda: _my_turn(client, gid)))["board"]
    pieces = {c["label"]: c for c in board["cells"] if c["piece"] is not None}
    assert len(pieces) >= 8 and set(board["deficit_warehouses"]) == {"1", "2"}
    chained = {label for chain in board["chains"] for label in chain["cells"]}
    assert chained == set(pieces)  # every piece is in exactly the chains shown
    for chain in board["chains"]:
        assert {pieces[c]["piece"] for c in chain["cells"]} == {chain["owner"]}
        if chain["surplus"] >= 0:  # a deficit keeps the last number shown (RULES.md §1)
            assert {pieces[c]["surplus"] for c in chain["cells"]} == {chain["surplus"]}


async def _my_turn(client: TestClient, gid: str) -> dict[str, Any] | None:
    v = await view(client, gid)
    return v if v["to_move"] == 1 else None


async def test_an_exported_game_imports_as_a_finished_game_and_a_tampered_one_does_not(
    client: TestClient,
) -> None:
    created = await new_game(client)
    end = await play_out(client, created["id"], created["tokens"][0])
    exported = await (await client.get(f"/api/games/{created['id']}/export")).text()
    registered = await client.post("/api/bots", json={"name": "importer"})
    auth = {"Authorization": f"Bearer {(await registered.json())['key']}"}
    resp = await client.post("/api/games/import", data=exported, headers=auth)
    assert resp.status == 201, await resp.text()
    imported = await view(client, (await resp.json())["id"])
    assert imported["status"] == "ended" and imported["moves"] == end["moves"]
    assert imported["result"] == end["result"] and imported["id"] != created["id"]
    assert imported["imported_from"] == created["id"]
    lines = exported.splitlines()
    move = next(i for i, line in enumerate(lines) if '"move_played"' in line)
    lines[move] = lines[move].replace('"ply":0', '"ply":1')
    resp = await client.post("/api/games/import", data="\n".join(lines), headers=auth)
    assert resp.status == 422 and (await resp.json())["code"] == "invalid_import"


@pytest.mark.parametrize("game", game_names())
async def test_views_pages_and_rows_are_what_openapi_publishes(
    client: TestClient, game: str
) -> None:
    """A game's view, its page of plies and its row in the list, waiting for a person and
    then played to the end by bots, validate against the schemas `/openapi.json` names for
    those routes (`schemas.views`): every board shape, Supply Chains' chains and surplus."""
    doc = openapi()
    defs = doc["components"]["schemas"]

    def validator(path: str) -> Any:
        answer = doc["paths"][path]["get"]["responses"]["200"]["content"]["application/json"]
        name = answer["schema"]["$ref"].rsplit("/", 1)[-1]
        return jsonschema_rs.validator_for({"components": doc["components"], **defs[name]})

    one, plies, page = (
        validator("/api/games/{id}"),
        validator("/api/games/{id}/plies"),
        validator("/api/games"),
    )
    waiting = await new_game(client, game, seats=[{"human": {}}, {"human": {}}])
    played = await new_game(client, game, seats=[{"bot": "random"}, {"bot": "random"}])
    final = await until(lambda: _ended_view(client, played["id"]), timeout_s=60)
    assert final, f"{game}: the bots' game did not end"
    for gid in (waiting["id"], played["id"]):
        one.validate(await view(client, gid))
        resp = await client.get(f"/api/games/{gid}/plies", params={"from_ply": 0})
        plies.validate(await resp.json())
    listed = await (await client.get("/api/games", params={"game": game})).json()
    page.validate(listed)
    assert {played["id"], waiting["id"]} <= {row["id"] for row in listed["games"]}


async def _ended_view(client: TestClient, game_id: str) -> dict[str, Any] | None:
    v = await view(client, game_id)
    return v if v["status"] == "ended" else None


async def test_a_hub_nobody_listens_to_reads_no_event_and_its_first_listener_misses_none(
    redis: Any, namespace: str
) -> None:
    await _quiet_hub(redis, Keys(prefix=namespace, partitions=2))


async def test_a_quiet_hub_on_a_cluster(cluster_url: ClusterTarget) -> None:
    redis = await connect(cluster_url.url)
    try:
        await _quiet_hub(redis, Keys(prefix=cluster_url.prefix, partitions=4))
    finally:
        await redis.aclose()


async def _quiet_hub(redis: Any, keys: Keys) -> None:
    # Every gateway reading every event would cost each the whole arena's moves: while
    # nobody listens it reads none. The first listener wakes it; what was appended while it
    # woke reaches the listener from the hub, or the listener is sent to the log for it.
    feed = keys.feed(keys.partition("g1"))

    async def append(seq: int) -> None:
        event = msgpack.packb({"game_id": "g1", "seq": seq, "type": "move_played"})
        await redis.xadd(feed, {FIELD_BYTES: event})

    async def seqs_until(last: int) -> tuple[list[int], bool]:
        got, overflowed = [], False
        while last not in got:
            events, dropped = await listener.take(2.0)
            assert events or dropped, "nothing came"
            got, overflowed = got + [e.seq for e in events], overflowed or dropped
        return got, overflowed

    hub, stop = Hub(FeedTail(redis, keys, block_ms=100)), asyncio.Event()
    running = asyncio.create_task(hub.run(stop))
    try:
        for seq in (1, 2, 3):
            await append(seq)
        await asyncio.sleep(0.3)
        assert hub.events_seen == 0 and not hub.following.is_set()
        listener = hub.listen("g1")
        await append(4)  # before or after the hub fixed where it follows from
        await until(lambda: asyncio.sleep(0, hub.following.is_set()))
        await append(5)
        got, overflowed = await seqs_until(5)
        # 4 came from the hub, or the listener was told to read the log (which has it)
        assert got == [4, 5] or (overflowed and got[-1:] == [5] and set(got) <= {4, 5})
        hub.unlisten(listener)
        await until(lambda: asyncio.sleep(0, not hub.following.is_set()))
        seen = hub.events_seen
        await append(6)
        await asyncio.sleep(0.3)
        assert hub.events_seen == seen
    finally:
        stop.set()
        await running


async def test_sockets_opened_and_closed_fast_wake_the_hub_at_most_once_a_read(
    redis: Any, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # An attacker opening and closing sockets as fast as it can: each wake reads every
    # feed's end, but the hub stops following only after a read (at most `block_ms`), so
    # the wakes are bounded by the reads, not by the client.
    tail = FeedTail(redis, Keys(prefix=namespace, partitions=2), block_ms=100)
    wakes, start_here = 0, tail.start_here

    async def counted() -> None:
        nonlocal wakes
        wakes += 1
        await start_here()

    monkeypatch.setattr(tail, "start_here", counted)
    hub, stop = Hub(tail), asyncio.Event()
    running = asyncio.create_task(hub.run(stop))
    loop = asyncio.get_running_loop()
    began = loop.time()
    try:
        for _ in range(500):
            listener = hub.listen("g1")
            await asyncio.sleep(0)
            hub.unlisten(listener)
            await asyncio.sleep(0.001)
        elapsed = loop.time() - began
    finally:
        stop.set()
        await running
    assert 1 <= wakes <= elapsed / 0.1 + 2, (wakes, elapsed)
