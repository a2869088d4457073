"""Issue 22, attack 7 (the bots' part): keys that cannot be taken back, bots seated without
their consent, names that pass for the platform's, registrations without end.

Each test is one attack on gateways over real HTTP and Redis: a leaked key keeps working
after rotation (on this gateway and, past its key cache, on another) or after the operator
revokes it (`agon bots revoke`); anyone seats a registered bot in a game it never agreed
to; `RANDOM`, `timeout` or `unserved` register as bot names, or a name differing only in
case from another; one address registers bots without end, spreading its requests over
gateways.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from schemas.tokens import admin_token
from services.bus.secret import shared_secret
from services.cli import main as agon
from services.gateway.bots import KEY_CACHE_S
from services.gateway.settings import REGISTER_QUOTA
from tests.security.attacks import report
from tests.support.gateway import Arena, until

pytestmark = pytest.mark.timeout(120)


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def register(client: TestClient, name: str, **body: Any) -> dict[str, Any]:
    resp = await client.post("/api/bots", json={"name": name, **body})
    answer: dict[str, Any] = await resp.json()
    answer["status"] = resp.status
    return answer


async def key_works(client: TestClient, key: str) -> bool:
    """Whether the gateway takes `key`: a move for no game is then refused as such (404),
    not for the key (401)."""
    body = {"move": "A1", "seq": 1}
    resp = await client.post("/api/bot/games/no-such-game/moves", json=body, headers=auth(key))
    return resp.status != 401


async def create(client: TestClient, bot: str, key: str | None = None) -> tuple[int, str]:
    body = {"game": "teeko", "seats": [{"bot": bot}, {"bot": "random"}]}
    resp = await client.post("/api/games", json=body, headers=auth(key) if key else {})
    return resp.status, str((await resp.json()).get("code", ""))


async def test_a_rotated_key_stops_working_here_at_once_and_elsewhere_within_the_cache(
    arena: Arena, client: TestClient
) -> None:
    other = await arena.gateway()
    old = (await register(client, "rotator"))["key"]
    assert await key_works(other, old)  # the other gateway has it in its cache now
    stream = await other.get("/api/bot/stream", headers=auth(old))  # a stream on it stays open
    resp = await client.post("/api/bots/rotator/key", headers=auth(old))
    rotated = resp.status == 201
    new = (await resp.json()).get("key", "") if rotated else ""
    here = rotated and not await key_works(client, old) and await key_works(client, new)
    started = time.monotonic()
    gone = rotated and await until(
        lambda: _refused(other, old), timeout_s=KEY_CACHE_S + 2
    )  # fmt: skip
    elsewhere_s = time.monotonic() - started
    ended = rotated and await _stream_ends_with_bad_key(stream, KEY_CACHE_S + 7)
    stranger = await client.post("/api/bots/rotator/key", headers=auth("agon_not-a-key"))
    figure = (
        f"rotation answered {resp.status}; old key refused here at once: {here}, on another "
        f"gateway after {elsewhere_s:.1f} s (bound {KEY_CACHE_S:.0f} s): {bool(gone)}; its open "
        f"stream told and ended: {ended}; a stranger's rotation: {stranger.status}"
    )
    held = here and bool(gone) and ended and stranger.status == 401
    report("a leaked bot key cannot be rotated away", held, figure)
    assert held, figure


async def _refused(client: TestClient, key: str) -> bool:
    return not await key_works(client, key)


async def _stream_ends_with_bad_key(stream: Any, within_s: float) -> bool:
    """Whether the NDJSON stream says `bad_key` and ends within `within_s`."""
    told = False
    try:
        async with asyncio.timeout(within_s):
            async for line in stream.content:
                told = told or b'"bad_key"' in line
    except TimeoutError:
        return False
    return told


async def test_the_operator_revokes_a_key_with_agon_bots_revoke(
    arena: Arena, client: TestClient, redis_url: str, namespace: str
) -> None:
    key = (await register(client, "leaky"))["key"]
    assert await key_works(client, key)
    argv = ["bots", "revoke", "leaky", "--redis-url", redis_url, "--prefix", namespace]
    status = await asyncio.to_thread(_agon_status, argv)
    gone = await until(lambda: _refused(client, key), timeout_s=KEY_CACHE_S + 2)
    unknown = await asyncio.to_thread(_agon_status, [*argv[:2], "nobody", *argv[3:]])
    figure = f"agon bots revoke exit {status}; key refused within the cache: {bool(gone)}"
    held = status == 0 and bool(gone) and unknown == 2
    report("a bot key the operator cannot revoke", held, figure)
    assert held, figure


async def test_the_operator_revokes_a_key_through_the_api(arena: Arena, client: TestClient) -> None:
    key = (await register(client, "leaky2"))["key"]
    assert await key_works(client, key)
    bot_itself = await client.delete("/api/bots/leaky2/key", headers=auth(key))
    secret = await shared_secret(arena.redis, arena.keys)
    admin = await client.delete("/api/bots/leaky2/key", headers=auth(admin_token(secret)))
    body = await admin.json()
    refused_now = not await key_works(client, key)
    held = bot_itself.status == 401 and admin.status == 200 and refused_now
    figure = (
        f"DELETE /api/bots/NAME/key: with the bot's own key {bot_itself.status}, with the"
        f" admin token {admin.status} {body}; key refused at once: {refused_now}"
    )
    report("a bot key the operator cannot revoke (API)", held, figure)
    assert held, figure


def _agon_status(argv: list[str]) -> int:
    try:
        return agon(argv)
    except SystemExit as exc:  # argparse refusing an unknown command or argument
        return int(exc.code or 0)


async def test_a_bot_is_seated_only_with_its_consent(client: TestClient) -> None:
    key = (await register(client, "shy"))["key"]
    stranger = await create(client, "shy")
    forged = await create(client, "shy", "agon_forged-key")
    other_key = (await register(client, "other-bot"))["key"]
    borrowed = await create(client, "shy", other_key)  # another bot's key is no consent
    owner = await create(client, "shy", key)
    patch = await client.patch(
        "/api/bots/shy", json={"accept_challenges": True}, headers=auth(other_key)
    )
    await client.patch("/api/bots/shy", json={"accept_challenges": True}, headers=auth(key))
    accepted = await create(client, "shy")
    await register(client, "willing", accept_challenges=True)
    anyone = await create(client, "willing")
    built_in = await create(client, "random")
    figure = (
        f"seating shy without consent: {stranger[0]} {stranger[1]}, with a forged key "
        f"{forged[0]}, with another bot's key {borrowed[0]}; with its own key {owner[0]}; "
        f"another bot's PATCH {patch.status}; after it accepts challenges {accepted[0]}; "
        f"a bot registered willing {anyone[0]}; a built-in {built_in[0]}"
    )
    held = (
        stranger == (403, "bot_consent_required")
        and forged[0] == borrowed[0] == 403
        and owner[0] == accepted[0] == anyone[0] == built_in[0] == 201
        and patch.status == 403
    )
    report("anyone seats a registered bot without its consent", held, figure)
    assert held, figure


async def test_system_and_built_in_names_are_reserved_in_any_case(client: TestClient) -> None:
    reserved = ["RANDOM", "random", "Greedy.2", "timeout", "Unserved", "cancel", "ADMIN",
                "system", "engine", "dispatcher", "gateway", "tour", "selfplay"]  # fmt: skip
    answers = {name: await register(client, name) for name in reserved}
    taken = [n for n, a in answers.items() if a["status"] == 201]
    first = await register(client, "Alpha")
    twin = await register(client, "ALPHA")
    figure = (
        f"{len(taken)} of {len(reserved)} reserved names registered ({', '.join(taken) or 'none'});"
        f" 'ALPHA' after 'Alpha': {twin['status']} {twin.get('code')}"
    )
    held = (
        not taken
        and all(a["code"] == "name_reserved" for a in answers.values())
        and first["status"] == 201
        and (twin["status"], twin.get("code")) == (409, "name_taken")
    )
    report("system and built-in names register as bots", held, figure)
    assert held, figure


async def test_one_address_cannot_register_bots_without_end(arena: Arena) -> None:
    """Registrations spread over two gateways draw on one quota (the address's)."""
    gateways = [await arena.gateway(), await arena.gateway()]
    tries = REGISTER_QUOTA.burst * 3
    answers = [
        await register(gateways[i % 2], f"spam-{i}") for i in range(tries)
    ]  # fmt: skip
    made = sum(1 for a in answers if a["status"] == 201)
    refused = [a for a in answers if a["status"] == 429]
    figure = (
        f"{made} of {tries} registrations from one address over two gateways accepted "
        f"(quota: {REGISTER_QUOTA.burst} at once, {REGISTER_QUOTA.per_hour:g} an hour)"
    )
    held = made == REGISTER_QUOTA.burst and all(a["code"] == "quota_exceeded" for a in refused)
    report("one address registers bots without end", held, figure)
    assert held, figure


async def test_a_person_cannot_play_under_a_bots_name(client: TestClient) -> None:
    """Results are kept by name: a person seated as "alphabeta" who resigns would cost the
    bot its rating, with no import and no key."""
    await register(client, "outsider")
    statuses = []
    for name in ("alphabeta", "AlphaBeta", "random.fast", "outsider", "OUTSIDER", "timeout"):
        body = {"game": "teeko", "seats": [{"human": {"name": name}}, {"bot": "random"}]}
        resp = await client.post("/api/games", json=body)
        statuses.append((resp.status, (await resp.json()).get("code")))
    person = await client.post(
        "/api/games",
        json={"game": "teeko", "seats": [{"human": {"name": "ada"}}, {"bot": "random"}]},
    )
    held = statuses == [(409, "name_taken")] * 6 and person.status == 201
    report(
        "a person seated under a bot's name",
        held,
        f"6 bot and system names as a person's: {sorted(set(statuses))}; 'ada': {person.status}",
    )
    assert held, statuses


async def test_a_bot_registered_before_names_were_folded_keeps_its_name_in_every_case(
    arena: Arena,
) -> None:
    """Bots registered before names were case-folded have no folded claim: a gateway makes
    it when it starts, so "ALPHA" cannot join an older "Alpha"."""
    await arena.redis.hset(arena.keys.registered_bots(), "Oldtimer", '{"registered": 1}')
    client = await arena.gateway()
    resp = await client.post("/api/bots", json={"name": "OLDTIMER"})
    answer = await resp.json()
    held = (resp.status, answer.get("code")) == (409, "name_taken")
    figure = f"'OLDTIMER' after an older 'Oldtimer': {resp.status} {answer.get('code')}"
    report("a case twin of a bot older than folded names", held, figure)
    assert held, answer
