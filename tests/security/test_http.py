"""Issue 22, lows (9): what a browser elsewhere, a vanishing client and a scraper can do.

- A page on another site posts a form (`application/x-www-form-urlencoded`, the type
  `curl -d` sends too) or `text/plain` to the JSON routes: refused with 415, nothing made.
- Every answer (API, pages, static files, errors) carries the browser policy, and the page
  runs under it in a real Chromium with no violation (no inline script or style left).
- A client that goes away mid-stream or mid-body leaves one debug line, no traceback.
- `/metrics` with a token refuses a scrape without it; on a port of its own it is absent
  from the gateway's.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import struct
from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp.test_utils import TestClient

from schemas.tournaments import TournamentSpec, new_tournament_id
from services.bus.embedded import free_port
from services.bus.text import now_ms
from services.gateway import GatewaySettings
from services.gateway.guard import SECURITY_HEADERS
from services.gateway.serve import serving
from services.tournament.store import TournamentStore
from tests.security.attacks import report
from tests.support.browser import SCREENSHOTS, chromium, fresh_page, hold_seats, open_game
from tests.support.browser import serving as browser_site
from tests.support.gateway import Arena, new_game, until, view

HUMANS: list[dict[str, dict[str, str]]] = [{"human": {}}, {"human": {}}]


# -- cross-site forms ------------------------------------------------------------------
async def listed(client: TestClient) -> list[str]:
    """The ids the game list shows: a projection, so a new game shows up a moment later."""
    return [g["id"] for g in (await (await client.get("/api/games?limit=100")).json())["games"]]


async def _has(client: TestClient, gid: str) -> list[str]:
    ids = await listed(client)
    return ids if gid in ids else []


async def test_a_form_from_another_site_creates_no_game_and_plays_no_move(
    client: TestClient,
) -> None:
    created = await new_game(client)
    gid, token = created["id"], created["tokens"][0]
    # Count only once the list shows the new game, or it may show up between the counts.
    before = len(await until(lambda: _has(client, gid)))
    seq = (await view(client, gid))["seq"]
    new = json.dumps({"game": "teeko", "seats": HUMANS})
    move = json.dumps({"move": "C3", "seq": seq, "token": token})
    attempts = [  # what `curl -d` and a cross-site <form> send, and a type-less body
        ("/api/games", new, "application/x-www-form-urlencoded"),
        ("/api/games", new, "text/plain"),
        ("/api/games", new, "multipart/form-data; boundary=x"),
        ("/api/games", new, None),
        (f"/api/games/{gid}/moves", move, "application/x-www-form-urlencoded"),
        (f"/api/games/{gid}/moves", move, "text/plain"),
        (f"/api/games/{gid}/resign", json.dumps({"token": token}), "text/plain"),
    ]
    answers, messages = [], []
    for path, body, kind in attempts:
        headers = {"Content-Type": kind} if kind else {}
        skip = () if kind else ("Content-Type",)  # else aiohttp names one for bytes
        resp = await client.post(path, data=body.encode(), headers=headers, skip_auto_headers=skip)
        answer = await resp.json()
        answers.append((resp.status, answer.get("code", "")))
        messages.append(answer.get("message", ""))
    after, now = len(await listed(client)), (await view(client, gid))["seq"]
    refused = sum(a == (415, "unsupported_media_type") for a in answers)
    held = refused == len(attempts) and after == before and now == seq
    report(
        "cross-site form bodies",
        held,
        f"{refused}/{len(attempts)} form, text and type-less bodies refused with 415;"
        f" games {before}->{after}, seq {seq}->{now}",
    )
    assert answers == [(415, "unsupported_media_type")] * len(attempts)
    assert all("application/json" in m and "\n" not in m for m in messages), messages
    assert (after, now) == (before, seq)
    # JSON (and msgpack) still go through, with or without a charset.
    resp = await client.post(
        "/api/games", data=new.encode(), headers={"Content-Type": "application/json; charset=utf-8"}
    )
    assert resp.status == 201, await resp.text()


# -- the browser policy ----------------------------------------------------------------
async def test_every_answer_carries_the_browser_policy(client: TestClient) -> None:
    gid = (await new_game(client))["id"]
    paths = ["/", f"/games/{gid}", "/tournaments", "/web/app.js", "/web/style.css",
             "/api/games", f"/api/games/{gid}", "/health", "/openapi.json", "/nope",
             "/api/games/nope"]  # fmt: skip
    missing = []
    for path in paths:
        resp = await client.get(path)
        await resp.read()
        missing += [f"{path}: {name}" for name in SECURITY_HEADERS if name not in resp.headers]
    policy = SECURITY_HEADERS["Content-Security-Policy"]
    report(
        "framing, sniffing, inline script",
        not missing,
        f"{len(paths) - len({m.split(':')[0] for m in missing})}/{len(paths)} answers carry"
        " CSP (script-src 'self', frame-ancestors 'none'), nosniff, Referrer-Policy",
    )
    assert not missing, missing
    assert "script-src 'self'" in policy and "frame-ancestors 'none'" in policy
    assert "unsafe-inline" not in policy and "unsafe-eval" not in policy


CSP_WATCH = """
window.__violations = [];
document.addEventListener("securitypolicyviolation",
  (e) => window.__violations.push(`${e.violatedDirective} ${e.blockedURI}`));
"""


@pytest.mark.timeout(120)
async def test_the_page_runs_under_its_policy_with_no_violation(
    arena: Arena, client: TestClient
) -> None:
    created = await new_game(client, seats=[{"human": {}}, {"bot": "random"}])
    tid = new_tournament_id()
    spec = TournamentSpec(format="round-robin", game="teeko", bots=["random", "greedy"])
    await TournamentStore(arena.redis, arena.keys).create(tid, spec, now_ms())
    violations: list[str] = []
    async with (
        browser_site(arena) as site,
        chromium() as browser,
        fresh_page(browser, {"width": 1280, "height": 860}, csp=True) as page,
    ):
        page.on(
            "console",
            lambda m: violations.append(m.text) if "Security Policy" in m.text else None,
        )
        await page.context.add_init_script(script=CSP_WATCH)
        await hold_seats(page, created["id"], {0: created["tokens"][0]})
        resp = await page.goto(f"{site.url}/")
        assert resp is not None
        headers = await resp.all_headers()
        await page.wait_for_selector(f'#games a[data-id="{created["id"]}"]')
        theme = await page.evaluate("document.documentElement.dataset.theme")
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        await page.screenshot(path=SCREENSHOTS / "csp-lobby.png", full_page=True)
        violations += await page.evaluate("window.__violations")
        await open_game(page, site, created["id"])
        await page.wait_for_selector("#moves", state="attached")
        await page.screenshot(path=SCREENSHOTS / "csp-game.png", full_page=True)
        violations += await page.evaluate("window.__violations")
        await page.goto(f"{site.url}/tournaments/{tid}")
        await page.wait_for_selector("#progress .bar", state="attached")
        width = await page.eval_on_selector("#progress .bar", "b => b.style.width")
        violations += await page.evaluate("window.__violations")
    under_policy = "content-security-policy" in headers
    held = under_policy and not violations and theme in ("light", "dark") and bool(width)
    report(
        "the page under its CSP",
        held,
        f"lobby, game and tournament pages in Chromium: {len(violations)} CSP violations"
        f" (policy sent: {under_policy}); theme script ran: {theme}",
    )
    assert under_policy, headers
    assert not violations, violations
    assert theme in ("light", "dark") and width


# -- clients that go away --------------------------------------------------------------
def reset(sock: socket.socket) -> None:
    """Close with a reset (SO_LINGER 0), as a client killed mid-request does."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


async def raw(port: int, request: bytes) -> socket.socket:
    loop = asyncio.get_running_loop()
    sock = socket.socket()
    sock.setblocking(False)
    await loop.sock_connect(sock, ("127.0.0.1", port))
    await loop.sock_sendall(sock, request)
    return sock


@pytest.fixture
async def gateway(arena: Arena) -> AsyncIterator[str]:
    """A gateway served as `agon gateway` serves it (serve.serving), its URL."""
    async with serving(GatewaySettings(keys=arena.keys), "127.0.0.1", free_port(),
                       redis=arena.redis) as url:  # fmt: skip
        yield url


async def test_a_client_that_goes_away_leaves_one_debug_line_and_no_traceback(
    arena: Arena, gateway: str, caplog: pytest.LogCaptureFixture
) -> None:
    port = int(gateway.rsplit(":", 1)[1])
    async with (
        aiohttp.ClientSession() as http,
        http.post(f"{gateway}/api/games", json={"game": "teeko", "seats": HUMANS}) as r,
    ):
        created = await r.json()
    gid, token = created["id"], created["tokens"][0]
    caplog.set_level(logging.DEBUG)
    caplog.clear()
    # Mid-stream: a live NDJSON feed whose reader vanishes; the next event finds it gone.
    stream = await raw(port, (f"GET /api/games/{gid}/events HTTP/1.1\r\nHost: agon\r\n"
                              "Accept: application/x-ndjson\r\n\r\n").encode())  # fmt: skip
    await asyncio.sleep(0.3)
    reset(stream)
    async with aiohttp.ClientSession() as http:
        for move in ("C3", "B2"):  # two events: the first may still fit the socket's buffer
            seq = (await (await http.get(f"{gateway}/api/games/{gid}")).json())["seq"]
            body = {"move": move, "seq": seq, "token": created["tokens"][0 if move == "C3" else 1]}
            await http.post(f"{gateway}/api/games/{gid}/moves", json=body)
    # Mid-body: a move whose body never arrives whole.
    cut = await raw(port, (f"POST /api/games/{gid}/moves HTTP/1.1\r\nHost: agon\r\n"
                           "Content-Type: application/json\r\nContent-Length: 500\r\n\r\n"
                           f'{{"token": "{token}", ').encode())  # fmt: skip
    await asyncio.sleep(0.3)
    reset(cut)

    def went_away() -> list[logging.LogRecord]:
        return [r for r in caplog.records if "went away" in r.getMessage()]

    async def both_seen() -> bool:
        return len(went_away()) >= 2

    await until(both_seen, timeout_s=10)
    loud = [r for r in caplog.records if r.exc_info or r.levelno >= logging.WARNING]
    lines = went_away()
    held = len(lines) == 2 and not loud and all(r.levelno == logging.DEBUG for r in lines)
    report(
        "clients that go away",
        held,
        f"a stream and a body cut by reset: {len(lines)} debug lines, {len(loud)} warnings or"
        " tracebacks",
    )
    assert not loud, [(r.name, r.getMessage(), r.exc_info) for r in loud]
    assert [r.levelno for r in lines] == [logging.DEBUG] * 2, [r.getMessage() for r in lines]


# -- metrics -------------------------------------------------------------------------------
async def test_metrics_ask_for_their_token_or_live_on_a_port_of_their_own(
    arena: Arena, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    token = "metrics-" + "s3cr3t" * 4
    statuses: dict[str, int] = {}
    settings = GatewaySettings(keys=arena.keys, metrics_token=token)
    async with (
        serving(settings, "127.0.0.1", free_port(), redis=arena.redis) as url,
        aiohttp.ClientSession() as http,
    ):
        for name, auth in (("none", None), ("wrong", "Bearer nope"),
                           ("token", f"Bearer {token}")):  # fmt: skip
            headers = {"Authorization": auth} if auth else {}
            async with http.get(f"{url}/metrics", headers=headers) as resp:
                statuses[name] = resp.status
                text = await resp.text()
        assert "agon_commands" in text
    apart = free_port()
    settings = GatewaySettings(keys=arena.keys, metrics_port=apart)
    async with (
        serving(settings, "127.0.0.1", free_port(), redis=arena.redis) as url,
        aiohttp.ClientSession() as http,
    ):
        async with http.get(f"{url}/metrics") as resp:
            statuses["main site"] = resp.status
        async with http.get(f"http://127.0.0.1:{apart}/metrics") as resp:
            statuses["own port"] = resp.status
            assert "agon_open_streams" in await resp.text()
    leaked = (
        token in caplog.text
        or token in repr(settings)
        or token in repr(GatewaySettings(metrics_token=token))
    )
    expected = {"none": 401, "wrong": 401, "token": 200, "main site": 404, "own port": 200}
    report(
        "public metrics",
        statuses == expected and not leaked,
        f"/metrics: {statuses}; token in logs or repr: {leaked}",
    )
    assert statuses == expected
    assert not leaked
