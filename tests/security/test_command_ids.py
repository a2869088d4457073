"""Attacks on command ids: a client with no valid token names another principal's ids.

Issue 22's first finding, replayed through real HTTP against every service: a refusal for a
wrong token was remembered under the command id the client chose, so the bot's real move and
the dispatcher's timeout claim, arriving later with that id, got the refusal back and the
game stayed `playing` for good (or the bot lost on time). Now a reply is remembered only for
an accepted command, under the principal its credentials proved: nothing a client sends can
name, pre-empt or poison another principal's id, a refused move can be corrected under the
same id, and another request under a used id is refused, not answered with a stranger's reply.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from tests.security.attacks import report
from tests.support.gateway import Arena, new_game, until, view

pytestmark = pytest.mark.timeout(120)


async def post_move(client: TestClient, gid: str, **body: Any) -> tuple[int, dict[str, Any]]:
    resp = await client.post(f"/api/games/{gid}/moves", json=body)
    answer: dict[str, Any] = await resp.json()
    return resp.status, answer


async def memory_keys(arena: Arena, gid: str) -> list[str]:
    fields = await arena.redis.hkeys(arena.keys.replies_memory(gid))
    return sorted(f.decode() for f in fields)


async def test_a_tokenless_client_cannot_poison_the_bots_move_or_the_timeout_claim(
    arena: Arena, client: TestClient
) -> None:
    created = await new_game(client, move_time=5)
    gid, token = created["id"], created["tokens"][0]
    seq = (await view(client, gid))["seq"]
    for forged in (f"random:{gid}:{seq + 1}", f"timeout:{gid}:{seq + 1}"):
        status, answer = await post_move(
            client, gid, move="A1", seq=seq + 1, token="x", command_id=forged
        )
        assert (status, answer["code"]) == (403, "bad_token")
    v = await view(client, gid)
    status, _ = await post_move(client, gid, move=v["legal_moves"][0], seq=seq, token=token)
    assert status == 200
    # The bot's reply (seq + 1 -> + 2) must land: with the poisoned memory it never did.
    after = await until(lambda: _at_least(client, gid, seq + 2), timeout_s=10)
    held = after is not None
    remembered = await memory_keys(arena, gid)
    report(
        "command-id poisoning (bot's move, timeout claim)",
        held,
        f"bot moved {'at once' if held else 'never'} after 2 forged refusals; "
        f"{len(remembered)} replies remembered",
    )
    assert held, "the bot's move never landed: its command id was poisoned"
    assert all(k.split(" ", 1)[0] in ("create", "join", "seat1", "seat2") for k in remembered)


async def _at_least(client: TestClient, gid: str, seq: int) -> dict[str, Any] | None:
    v = await view(client, gid)
    return v if v["seq"] >= seq else None


async def test_a_poisoned_timeout_claim_still_ends_the_game_on_time(
    arena: Arena, client: TestClient
) -> None:
    created = await new_game(client, seats=[{"human": {}}, {"human": {}}], move_time=1)
    gid = created["id"]
    seq = (await view(client, gid))["seq"]
    status, _ = await post_move(
        client, gid, move="A1", seq=seq, token="x", command_id=f"timeout:{gid}:{seq}"
    )
    assert status == 403
    started = time.monotonic()
    ended = await until(lambda: _ended(client, gid), timeout_s=15)
    waited = time.monotonic() - started
    report(
        "command-id poisoning (dispatcher's timeout claim)",
        ended is not None,
        f"game ended by {ended['result']['reason'] if ended else 'nothing'} "
        f"{waited:.1f} s after a 1 s clock",
    )
    assert ended is not None and ended["result"]["reason"] == "time_forfeit"


async def _ended(client: TestClient, gid: str) -> dict[str, Any] | None:
    v = await view(client, gid)
    return v if v["status"] == "ended" else None


async def test_a_refused_move_can_be_corrected_under_the_same_id(
    arena: Arena, client: TestClient
) -> None:
    created = await new_game(client)
    gid, token = created["id"], created["tokens"][0]
    v = await view(client, gid)
    occupied_later = v["legal_moves"][0]
    status, refused = await post_move(
        client, gid, move="Z99", seq=v["seq"], token=token, command_id="mine"
    )
    assert status == 422, refused
    status, answer = await post_move(
        client, gid, move=occupied_later, seq=v["seq"], token=token, command_id="mine"
    )
    report(
        "a refusal locks the seq",
        status == 200,
        f"corrected move under the refused id: HTTP {status} {answer.get('code', '')}",
    )
    assert status == 200, answer
    # A retry of the accepted request gets its reply again; another request under the
    # same id is refused, never answered with the first request's reply.
    again = await post_move(
        client, gid, move=occupied_later, seq=v["seq"], token=token, command_id="mine"
    )
    assert again == (200, answer)
    status, other = await post_move(
        client, gid, move=v["legal_moves"][1], seq=v["seq"], token=token, command_id="mine"
    )
    assert (status, other["code"]) == (409, "reused_command_id")


async def test_another_seat_cannot_name_a_seats_command_id(
    arena: Arena, client: TestClient
) -> None:
    created = await new_game(client, seats=[{"human": {}}, {"human": {}}])
    gid, first, second = created["id"], *created["tokens"]
    v = await view(client, gid)
    # Seat 2, authenticated, takes the id seat 1 is about to use: refused, not remembered.
    status, _ = await post_move(
        client, gid, move=v["legal_moves"][0], seq=v["seq"], token=second, command_id="c1"
    )
    assert status == 409
    status, answer = await post_move(
        client, gid, move=v["legal_moves"][0], seq=v["seq"], token=first, command_id="c1"
    )
    assert status == 200, answer


async def test_no_seat_token_is_kept_in_any_store(arena: Arena, client: TestClient) -> None:
    created = await new_game(client, seats=[{"human": {}}, {"human": {}}])
    tokens = created["tokens"]
    redis, found = arena.redis, []
    async for key in redis.scan_iter(f"{arena.keys.prefix}*"):
        name = key.decode()
        if name.startswith(arena.keys.reply_stream("")):
            continue  # replies in transit to the gateway: see `CommandClient`
        kind = (await redis.type(key)).decode()
        if kind == "hash":
            dump = repr(await redis.hgetall(key))
        elif kind == "stream":
            dump = repr(await redis.xrange(key))
        elif kind == "string":
            dump = repr(await redis.get(key))
        else:
            dump = repr(await redis.dump(key))
        found += [name for t in tokens if t in dump]
    report("seat tokens at rest", not found, f"{len(found)} keys hold a seat token")
    assert not found
