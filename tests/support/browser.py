"""A real headless Chromium on a real gateway: what the web page's tests share.

`serving(arena)` serves a gateway of the arena on a free port of the loopback with
aiohttp's `AppRunner`/`TCPSite`, as `agon gateway` does, and can drop every connection and
stop listening (`Site.drop`), then listen again on the same port (`Site.restore`): a real
outage, from which the page must come back by itself. `chromium()` is Debian's `chromium`
(`/usr/bin/chromium`, or `$AGON_CHROMIUM`) driven by Playwright; nothing is downloaded.
The rest reads the page as a person or a screen reader would: cells by their
`data-cell`, what they hold, the numbers on them, the move list.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient
from playwright.async_api import Browser, Page, ViewportSize, async_playwright

from bots.sdk.client import register_bot, run_bot
from engine import Move, State, load_game
from services.bus.embedded import free_port
from services.gateway import GatewaySettings, init_app
from services.gateway.appkeys import SOCKETS
from tests.support.gateway import Arena

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = Path(os.environ.get("AGON_CHROMIUM", "/usr/bin/chromium"))
#: Screenshots of every board shape: test artefacts, ignored by git.
SCREENSHOTS = ROOT / "artifacts" / "screenshots"


@dataclass
class Site:
    """A gateway served on a TCP port of the loopback, as a browser reaches it."""

    app: web.Application
    runner: web.AppRunner
    port: int
    site: web.TCPSite | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def listen(self) -> None:
        self.site = web.TCPSite(self.runner, "127.0.0.1", self.port)
        await self.site.start()

    async def drop(self) -> None:
        """Stop listening and close every open socket: the page is cut off."""
        assert self.site is not None
        await self.site.stop()
        self.site = None
        for ws in list(self.app[SOCKETS]):
            await ws.close(code=1001, message=b"dropped by the test")
        await self.runner.server.shutdown(2.0)  # and the browser's keep-alive connections

    async def restore(self) -> None:
        await self.listen()


@contextlib.asynccontextmanager
async def serving(arena: Arena, **settings: Any) -> AsyncIterator[Site]:
    app = init_app(GatewaySettings(keys=arena.keys, **settings), redis=arena.redis)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = Site(app, runner, free_port())
    try:
        await site.listen()
        yield site
    finally:
        if site.site is not None:
            await site.drop()  # a page still open would hold the shutdown for a while
        await runner.cleanup()


@contextlib.asynccontextmanager
async def chromium() -> AsyncIterator[Browser]:
    if not CHROMIUM.exists():  # a system package, outside the project: .ci/run installs it
        pytest.skip(f"no Chromium at {CHROMIUM} (apt-get install chromium)")
    async with async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=str(CHROMIUM), headless=True)
        try:
            yield browser
        finally:
            await browser.close()


@contextlib.asynccontextmanager
async def fresh_page(
    browser: Browser, viewport: ViewportSize, *, console_errors: bool = False, csp: bool = False
) -> AsyncIterator[Page]:
    """A page in a fresh browser profile; any uncaught error of the page's scripts (and,
    with `console_errors`, any error it logs) fails the test. Playwright's
    `wait_for_function` evals its predicate in the page, which the page's policy refuses
    (no 'unsafe-eval'), so the policy is bypassed unless `csp`: the security suite runs the
    page under it (tests/security/test_http.py)."""
    context = await browser.new_context(viewport=viewport, bypass_csp=not csp)
    opened = await context.new_page()
    errors: list[str] = []
    opened.on("pageerror", lambda exc: errors.append(str(exc)))
    if console_errors:
        opened.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    yield opened
    await context.close()
    assert not errors, f"the page's scripts failed: {errors}"


async def hold_seats(page: Page, game_id: str, tokens: dict[int, str]) -> None:
    """Give the page seat tokens, as the lobby keeps them, before any of its scripts runs."""
    gid, held = json.dumps(game_id), json.dumps({str(seat): t for seat, t in tokens.items()})
    await page.context.add_init_script(
        script=f"""{{
            const all = JSON.parse(localStorage.getItem("agon.tokens") || "{{}}");
            all[{gid}] = {{ ...(all[{gid}] || {{}}), ...{held} }};
            localStorage.setItem("agon.tokens", JSON.stringify(all));
        }}"""
    )


async def keep_tokens(page: Page, game_id: str, tokens: dict[int, str]) -> None:
    """Replace the seat tokens the open page keeps for a game (no reload needed)."""
    await page.evaluate(
        """([id, held]) => {
            const all = JSON.parse(localStorage.getItem("agon.tokens") || "{}");
            all[id] = held;
            localStorage.setItem("agon.tokens", JSON.stringify(all));
        }""",
        [game_id, {str(seat): t for seat, t in tokens.items()}],
    )


async def open_game(page: Page, site: Site, game_id: str, query: str = "") -> None:
    await page.goto(f"{site.url}/games/{game_id}{query}")
    await page.wait_for_selector("#moves", state="attached")
    await page.wait_for_selector("[data-cell]")


# -- what the page shows -------------------------------------------------------------------
CELLS_JS = """() => Array.from(document.querySelectorAll("[data-cell]"), (g) => ({
    label: g.dataset.cell,
    piece: g.dataset.piece,
    height: g.dataset.height ?? null,
    house: g.dataset.house ?? null,
    warehouse: g.dataset.warehouse ?? null,
    mark: g.dataset.mark ?? null,
    surplus: g.querySelector("[data-surplus]")?.dataset.surplus ?? null,
    aria: g.getAttribute("aria-label"),
}))"""


async def board_cells(page: Page) -> list[dict[str, Any]]:
    cells: list[dict[str, Any]] = await page.evaluate(CELLS_JS)
    return cells


async def page_moves(page: Page) -> list[str]:
    moves: list[str] = await page.eval_on_selector_all(
        "#moves button[data-move]", "bs => bs.map(b => b.dataset.move)"
    )
    return moves


async def shown_ply(page: Page) -> int:
    return int(await page.input_value("#ply"))


async def log_moves(client: TestClient, game_id: str) -> list[str]:
    resp = await client.get(f"/api/games/{game_id}/events")
    assert resp.status == 200
    return [e["move"] for e in await resp.json() if e["type"] == "move_played"]


def position(game: str, options: dict[str, str], moves: list[str]) -> State:
    """The engine's position after `moves`: what every ply of the page is checked against."""
    state = load_game(game, **options).new_initial_state()
    for move in moves:
        state.apply(move)
    return state


def surplus_display(state: State) -> tuple[dict[str, int], set[str], set[str]]:
    """The engine's display: the number on each piece, deficit warehouses, other warehouses."""
    display = state.display()
    assert display is not None
    shown = display.to_dict()
    deficit = {c for cells in shown["deficit_warehouses"].values() for c in cells}
    warehouses = {c for chain in shown["chains"] for c in chain["warehouses"]} - deficit
    return dict(shown["surplus_values"]), deficit, warehouses


def page_display(cells: list[dict[str, Any]]) -> tuple[dict[str, int], set[str], set[str]]:
    surplus = {c["label"]: int(c["surplus"]) for c in cells if c["surplus"] is not None}
    deficit = {c["label"] for c in cells if c["warehouse"] == "deficit"}
    warehouses = {c["label"] for c in cells if c["warehouse"] == "yes"}
    return surplus, deficit, warehouses


# -- a bot of the test's own, slow enough to watch -----------------------------------------
@contextlib.asynccontextmanager
async def slow_bot(url: str, name: str, think_s: float) -> AsyncIterator[None]:
    """A registered outside bot (the SDK) playing random legal moves, `think_s` per move."""
    key = await register_bot(url, name, accept_challenges=True)  # a person seats it
    rng = random.Random(name)

    def choose(state: State, seconds_left: float | None) -> Move:
        time.sleep(think_s)  # the SDK thinks in a thread: the stream is read meanwhile
        return rng.choice(state.legal_moves())

    stop = asyncio.Event()
    connected = asyncio.Event()
    task = asyncio.create_task(
        run_bot(url, key, choose, stop=stop, on_connect=connected.set, reconnect_max_s=1.0)
    )
    try:
        await asyncio.wait_for(connected.wait(), 10)
        yield
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)


__all__ = [
    "SCREENSHOTS",
    "Site",
    "board_cells",
    "chromium",
    "hold_seats",
    "keep_tokens",
    "log_moves",
    "open_game",
    "page_display",
    "page_moves",
    "position",
    "serving",
    "shown_ply",
    "slow_bot",
    "surplus_display",
]
