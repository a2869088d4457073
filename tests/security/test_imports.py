"""Forged imports (issue 22, item 2) and the quotas shared by every gateway (item 7).

The attack: export a finished game, swap its players, chain it again (the chain is
unkeyed: anyone can) and import it again and again. Before the fix an import needed no
credentials and counted like a game played here: 40 imports took alphabeta from 1981 to
1717. Now an import takes a registered bot's key and its quota, the engine marks the game
imported whatever the file says, no competition read model counts it (leaderboards,
tournaments, bot health), and the server's signature tells its exports from forgeries
(`agon verify-export --key/--gateway`).
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

import msgpack
import pytest
import redis.asyncio as aioredis
from aiohttp.test_utils import TestClient
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from engine import game_names
from schemas.codec import event_hash, unpack
from schemas.tokens import admin_token
from services.bus.clients import QueryClient
from services.bus.keys import Keys
from services.bus.quotas import Quota
from services.bus.secret import shared_secret
from services.gamelog.export import export_line, read_jsonl, signature_line
from services.gateway.settings import IMPORT_QUOTA
from services.tournament.store import TournamentStore
from tests.security.attacks import report, scale
from tests.support.gateway import Arena, new_game, play_out, running_arena, until, view

pytestmark = pytest.mark.timeout(300)

TOURNAMENT = {"format": "round-robin", "game": "teeko", "bots": ["greedy", "random"],
              "move_time_ms": 500}  # fmt: skip


# -- the forger's tools ----------------------------------------------------------------------
def forged(exported: str, tournament: str | None = None) -> str:
    """An export edited as a forger would: the two players swapped (and, given one, the game
    placed in `tournament`), then chained again, every line as `services.gamelog.export` writes it.
    The signature line, if any, is dropped: the forger has no key to sign with."""
    events: list[dict[str, Any]] = [unpack(e.data) for e in read_jsonl(exported)]
    first = events[0]
    first["seats"].reverse()
    if tournament is not None:
        first["tournament"] = tournament
    one, two = (e for e in events if e["type"] == "player_seated")
    for field in ("name", "kind"):
        one[field], two[field] = two[field], one[field]
    lines, prev = [], ""
    for event in events:
        event["prev_hash"] = prev
        data = msgpack.packb(event, use_bin_type=True)
        lines.append(export_line(data))
        prev = event_hash(data)
    return "\n".join(lines) + "\n"


async def register(client: TestClient, name: str) -> dict[str, str]:
    """A registered bot's `Authorization` header."""
    resp = await client.post("/api/bots", json={"name": name})
    assert resp.status == 201, await resp.text()
    return {"Authorization": f"Bearer {(await resp.json())['key']}"}


async def projected(redis: aioredis.Redis, keys: Keys, game_ids: list[str]) -> bool:
    """Whether the projector has folded every one of the games to its log's head."""
    for gid in game_ids:
        seen = await redis.hget(keys.projector_seen(keys.partition(gid)), gid)
        if seen is None or int(seen) != await redis.xlen(keys.log(gid)):
            return False
    return True


async def import_many(
    client: TestClient, text: str, headers: dict[str, str], times: int
) -> list[str]:
    ids = []
    for _ in range(times):
        resp = await client.post("/api/games/import", data=text, headers=headers)
        assert resp.status == 201, await resp.text()
        ids.append((await resp.json())["id"])
    return ids


async def leaderboards(client: TestClient) -> dict[str, Any]:
    """Every game's leaderboard, without the deviations (they grow with the clock)."""
    out = {}
    for game in game_names():
        body = await (await client.get(f"/api/leaderboards/{game}")).json()
        out[game] = [
            [(r["name"], r["rating"], r["volatility"], r["games"]) for r in b["rows"]]
            for b in body["boards"]
        ]
    return out


async def standing(client: TestClient, redis: aioredis.Redis, keys: Keys, tid: str) -> Any:
    """What the forgery must not move: a tournament's standings, crosstable, terminations,
    health, ratings and schedule, and each bot's results."""
    rep = await (await client.get(f"/api/tournaments/{tid}")).json()
    kept = ("standings", "crosstable", "terminations", "faults", "health", "schedule")
    query = QueryClient(redis, keys)
    bots = {name: await query.bot_results(name) for name in TOURNAMENT["bots"]}
    ratings = [[(r["name"], r["rating"], r["games"]) for r in b["rows"]] for b in rep["ratings"]]
    return {k: rep[k] for k in kept} | {"ratings": ratings, "bot_results": bots}


async def played_tournament(arena: Arena, client: TestClient) -> tuple[str, list[str]]:
    """A greedy-random round robin, ended and projected: its id and its games."""
    redis, keys = arena.redis, arena.keys
    admin = {"Authorization": f"Bearer {admin_token(await shared_secret(redis, keys))}"}
    made = await client.post("/api/tournaments", json=TOURNAMENT, headers=admin)
    assert made.status == 201, await made.text()
    tid = (await made.json())["id"]
    store = TournamentStore(redis, keys)

    async def over() -> Any:
        t = await store.load(tid)
        return t if t is not None and t.ended is not None else None

    t = await until(over, 120)
    assert t is not None, f"tournament {tid} did not end"
    games = list(t.games)
    assert await until(lambda: projected(redis, keys, games))
    return tid, games


# -- (a) the forgery ---------------------------------------------------------------------------
async def test_forged_imports_leave_every_leaderboard_tournament_and_bot_unchanged(
    redis: aioredis.Redis, namespace: str
) -> None:
    keys = Keys(prefix=namespace)
    times = scale(20, 40)
    async with running_arena(redis, keys, ["greedy", "random"]) as arena:
        # The long form imports more than a bot's default burst: this gateway allows it.
        client = await arena.gateway(import_quota=Quota(per_hour=3600, burst=times))
        tid, games = await played_tournament(arena, client)
        boards, before = await leaderboards(client), await standing(client, redis, keys, tid)
        assert boards["teeko"], "the tournament's games are on the leaderboard"
        exported = await (await client.get(f"/api/games/{games[0]}/export")).text()
        forgery = forged(exported)  # names the tournament still: the original did
        ids = await import_many(client, forgery, await register(client, "forger"), times)
        assert await until(lambda: projected(redis, keys, ids))
        after_boards, after = await leaderboards(client), await standing(client, redis, keys, tid)
        marked = [(await view(client, gid)).get("imported_from") for gid in ids[:3]]
        listed = (await (await client.get("/api/games", params={"limit": 200})).json())["games"]
    rows = {r["id"]: r for r in listed}
    held = after_boards == boards and after == before

    def teeko(board: dict[str, Any]) -> str:
        return ", ".join(f"{r[0]} {r[1]:.0f} ({r[3]} games)" for b in board["teeko"] for r in b)

    report(
        "forged imports",
        held,
        f"{times} imports of a players-swapped re-chained export: teeko {teeko(boards)} -> "
        f"{teeko(after_boards)}; tournament and bot health "
        f"{'unchanged' if after == before else 'CHANGED'}",
    )
    assert after_boards == boards
    assert after == before
    # Still a game anyone can list and replay, marked as the engine's import.
    assert marked == [games[0]] * 3
    assert {rows[gid].get("imported_from") for gid in ids} == {games[0]}
    assert all(rows[gid]["imported_from"] is None for gid in games)


# -- (b) credentials -------------------------------------------------------------------------
async def test_an_import_needs_a_registered_bots_key(client: TestClient) -> None:
    created = await new_game(client)
    await play_out(client, created["id"], created["tokens"][0])
    exported = await (await client.get(f"/api/games/{created['id']}/export")).text()
    answers = []
    for headers in ({}, {"Authorization": "Bearer agon_not-a-key"}, {"Authorization": "Basic x"}):
        resp = await client.post("/api/games/import", data=exported, headers=headers)
        answers.append((resp.status, (await resp.json())["code"]))
    ok = await client.post("/api/games/import", data=exported, headers=await register(client, "b"))
    held = answers == [(401, "bad_key")] * 3 and ok.status == 201
    report("import without a key", held, f"no key, a bad key, Basic: {answers}; a bot's key: "
           f"{ok.status}")  # fmt: skip
    assert answers == [(401, "bad_key")] * 3
    assert ok.status == 201, await ok.text()


# -- (c) quotas --------------------------------------------------------------------------------
async def test_import_and_creation_quotas_are_shared_by_every_gateway(arena: Arena) -> None:
    quotas = {"import_quota": Quota(per_hour=60, burst=3), "create_quota": Quota(60, burst=4)}
    one, two = await arena.gateway(**quotas), await arena.gateway(**quotas)
    created = await new_game(one)
    await play_out(one, created["id"], created["tokens"][0])
    exported = await (await one.get(f"/api/games/{created['id']}/export")).text()
    bot = await register(one, "importer")
    statuses = []
    for i in range(4):  # the burst through both gateways, then one more
        gateway = (one, two)[i % 2]
        resp = await gateway.post("/api/games/import", data=exported, headers=bot)
        statuses.append(resp.status)
    refused = await resp.json()
    retry = resp.headers.get("Retry-After")
    other = await two.post("/api/games/import", data=exported, headers=await register(two, "o"))
    # Creation: per address; one game was made above, so three more fit, then 429.
    made = [
        (await (one, two)[i % 2].post("/api/games", json={"game": "teeko", "seats": [
            {"human": {}}, {"bot": "random"}]})).status
        for i in range(4)
    ]  # fmt: skip
    held = statuses == [201, 201, 201, 429] and made == [201, 201, 201, 429]
    report(
        "quotas",
        held,
        f"imports (burst 3) {statuses}, other bot {other.status}; "
        f"creations (burst 4) {made}; over quota: {refused.get('code')}, Retry-After {retry}",
    )
    assert statuses == [201, 201, 201, 429]
    assert refused["code"] == "quota_exceeded" and retry is not None and int(retry) >= 1
    assert other.status == 201  # a quota is the principal's own
    assert made == [201, 201, 201, 429]
    # One small hash per bucket, in its own hash slot, gone once it would be full again.
    bucket = arena.keys.quota("import", "bot:importer")
    assert "{import:bot:importer}" in bucket
    assert 0 < await arena.redis.pttl(bucket) <= 3 * 60_000 + 1000


async def test_the_default_quotas_let_a_bot_import_its_burst(arena: Arena) -> None:
    client = await arena.gateway()
    created = await new_game(client)
    await play_out(client, created["id"], created["tokens"][0])
    exported = await (await client.get(f"/api/games/{created['id']}/export")).text()
    bot = await register(client, "importer")
    await import_many(client, exported, bot, IMPORT_QUOTA.burst)
    resp = await client.post("/api/games/import", data=exported, headers=bot)
    assert resp.status == 429 and (await resp.json())["code"] == "quota_exceeded"


# -- (d) the server's signature ------------------------------------------------------------
async def verify_export(*args: str) -> tuple[int, str]:
    """`agon verify-export` as its console entry point runs it; exit status and output."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "services.cli", "verify-export", *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    out, _ = await proc.communicate()
    assert proc.returncode is not None
    return proc.returncode, out.decode()


async def test_a_signed_export_verifies_and_a_rechained_one_fails_origin(
    client: TestClient, tmp_path: Any
) -> None:
    created = await new_game(client)
    await play_out(client, created["id"], created["tokens"][0])
    exported = await (await client.get(f"/api/games/{created['id']}/export")).text()
    published = await (await client.get("/.well-known/agon-export-key")).json()
    assert json.loads(exported.splitlines()[-1])["key"] == published["key"]
    good, bad = tmp_path / "good.jsonl", tmp_path / "forged.jsonl"
    good.write_text(exported)
    bad.write_text(forged(exported))
    gateway = str(client.make_url("")).rstrip("/")
    signed = await verify_export(str(good), "--key", published["key"])
    fetched = await verify_export(str(good), "--gateway", gateway)
    forgery = await verify_export(str(bad), "--key", published["key"])
    unkeyed = await verify_export(str(bad))  # the chain alone cannot tell
    held = signed[0] == fetched[0] == 0 and forgery[0] == 1
    report("re-chained export", held, f"signed export: exit {signed[0]}; forged: exit "
           f"{forgery[0]} {forgery[1].strip()!r}")  # fmt: skip
    assert signed[0] == 0 and "origin verified" in signed[1], signed
    assert fetched == signed
    assert forgery[0] == 1 and forgery[1].count("\n") == 1, forgery
    assert forgery[1].startswith("origin: the export is not signed"), forgery
    assert unkeyed[0] == 0  # hash chain and replay hold: that is why exports are signed
    # A forger who signs with a key of their own is told apart too...
    body = forged(exported)
    bad.write_text(body + signature_line(body, Ed25519PrivateKey.generate()))
    own_key = await verify_export(str(bad), "--key", published["key"])
    assert own_key[0] == 1 and own_key[1].startswith("origin: signed by another key"), own_key
    # ...and one who keeps the server's signature line under edited events.
    bad.write_text(body + exported.splitlines(keepends=True)[-1])
    edited = await verify_export(str(bad), "--key", published["key"])
    assert edited[0] == 1 and edited[1].startswith("origin: the signature does not match"), edited
    # ...and one who imports the forgery to have the server sign it: an imported game's
    # export is never signed.
    (gid,) = await import_many(client, body, await register(client, "launderer"), 1)
    bad.write_text(await (await client.get(f"/api/games/{gid}/export")).text())
    laundered = await verify_export(str(bad), "--key", published["key"])
    figure = f"export of an imported forgery: exit {laundered[0]} {laundered[1].strip()!r}"
    report("forgery laundered through an import", laundered[0] == 1, figure)
    assert laundered[0] == 1 and laundered[1].startswith("origin: the export is not signed")


# -- (e) a forged file naming a tournament ----------------------------------------------------
async def test_a_forged_file_naming_a_tournament_does_not_enter_it(
    redis: aioredis.Redis, namespace: str
) -> None:
    keys = Keys(prefix=namespace)
    async with running_arena(redis, keys, ["greedy", "random"]) as arena:
        client = await arena.gateway()
        tid, _ = await played_tournament(arena, client)
        # An ordinary game between the same bots, forged into the tournament.
        made = await client.post(
            "/api/games", json={"game": "teeko", "seats": [{"bot": "greedy"}, {"bot": "random"}]}
        )
        gid = (await made.json())["id"]
        assert (await until(lambda: _ended(client, gid), 60))["status"] == "ended"
        assert await until(lambda: projected(redis, keys, [gid]))
        before = await standing(client, redis, keys, tid)
        exported = await (await client.get(f"/api/games/{gid}/export")).text()
        ids = await import_many(
            client, forged(exported, tournament=tid), await register(client, "forger"), 3
        )
        assert await until(lambda: projected(redis, keys, ids))
        after = await standing(client, redis, keys, tid)
        imported = await QueryClient(redis, keys).view(ids[0])  # the projector's, in full
        assert imported is not None
    held = after == before and "tournament" not in imported
    report("forged tournament game", held, f"3 imports naming tournament {tid}: standings "
           f"{'unchanged' if after == before else 'CHANGED'}, view tournament "
           f"{imported.get('tournament')!r}")  # fmt: skip
    assert after == before
    assert "tournament" not in imported and imported["imported_from"] == gid


async def _ended(client: TestClient, gid: str) -> dict[str, Any] | None:
    v = await view(client, gid)
    return v if v["status"] == "ended" else None
