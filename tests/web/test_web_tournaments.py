"""The tournament pages in a real headless Chromium, against a real gateway and director.

An arena whose bot workers serve `random`, `random.2` (the random bot under another name)
and `greedy` plays a round robin and a match (a tournament director runs in the arena);
the pages (`/tournaments`, `/tournaments/{id}`, `/leaderboards`) are then read as a
person or a screen reader would and checked against the API's report: the standings in
order, every crosstable cell, every game's replay link (followed to the game's board), the
match's LLR trajectory and bounds, the leaderboard. Screenshots in both themes and at
phone width go to `artifacts/screenshots/` (ignored by git).
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp.test_utils import TestClient
from playwright.async_api import Page

from schemas.tournaments import SprtSpec, TournamentSpec, new_tournament_id
from services.bus.keys import Keys
from services.bus.text import now_ms
from services.tournament.director import cancel
from services.tournament.store import TournamentStore
from tests.support.browser import SCREENSHOTS, Site
from tests.support.gateway import Arena, running_arena, until
from tests.web.conftest import DESKTOP, PHONE

pytestmark = pytest.mark.timeout(180)

BOTS = ["random", "random.2", "greedy"]
#: any error the page logs fails the test (tests/web/conftest.py)
CONSOLE_ERRORS = True


@pytest.fixture
async def arena(redis: Any, namespace: str) -> AsyncIterator[Arena]:
    """Every service, the tournament director among them, with workers for `BOTS`."""
    async with running_arena(redis, Keys(prefix=namespace), BOTS) as running:
        yield running


async def create(arena: Arena, spec: TournamentSpec) -> str:
    tid = new_tournament_id()
    await TournamentStore(arena.redis, arena.keys).create(tid, spec, now_ms())
    return tid


def match(bots: list[str], **spec: Any) -> TournamentSpec:
    """A Teeko match of `bots`, SPRT of Elo 0 against 200."""
    return TournamentSpec(
        format="match", game="teeko", bots=bots, sprt=SprtSpec(elo0=0, elo1=200), **spec
    )


async def report(client: TestClient, tid: str) -> dict[str, Any]:
    resp = await client.get(f"/api/tournaments/{tid}")
    assert resp.status == 200, await resp.text()
    got: dict[str, Any] = await resp.json()
    return got


async def finished(client: TestClient, tid: str) -> dict[str, Any]:
    async def ended() -> dict[str, Any] | None:
        rep = await report(client, tid)
        return rep if rep["status"] == "ended" else None

    final: dict[str, Any] = await until(ended, timeout_s=120)
    assert final, f"tournament {tid} did not end"
    return final


async def shots(page: Page, name: str, ready: str) -> None:
    """Light and dark at desktop width, and light at phone width (full page)."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    for scheme in ("light", "dark"):
        await page.emulate_media(color_scheme=scheme)
        await page.wait_for_function(f"document.documentElement.dataset.theme === '{scheme}'")
        await page.screenshot(path=SCREENSHOTS / f"{name}-{scheme}.png", full_page=True)
    await page.emulate_media(color_scheme="light")
    await page.set_viewport_size(PHONE)
    await page.wait_for_selector(ready)
    await page.screenshot(path=SCREENSHOTS / f"{name}-phone.png", full_page=True)
    # Nothing but the tables' own boxes scrolls sideways at phone width.
    wide = await page.evaluate("document.documentElement.scrollWidth")
    assert wide <= PHONE["width"], f"{name}: the page is {wide} px wide on a phone"
    # A box that scrolls says so (a shadow, and its caption), and keeps its row headings.
    await page.wait_for_timeout(100)  # the boxes are measured after a layout
    scrolling = await page.eval_on_selector_all(
        ".table-wrap",
        """ws => ws.filter(w => w.scrollWidth > w.clientWidth + 1).map(w => ({
            marked: "scrolls" in w.dataset,
            shadow: getComputedStyle(w).backgroundImage.includes("gradient"),
            caption: getComputedStyle(w.querySelector("caption"), "::after").content,
            sticky: [...w.querySelectorAll("tbody th[scope=row]")].every(
                th => getComputedStyle(th).position === "sticky"),
        }))""",
    )
    for box in scrolling:
        assert box["marked"] and box["shadow"] and box["sticky"], (name, box)
        assert "scroll sideways" in box["caption"], (name, box)
    if scrolling:
        first = page.locator(".table-wrap[data-scrolls]").first
        await first.screenshot(path=SCREENSHOTS / f"{name}-phone-table.png")
        await first.evaluate("w => { w.scrollLeft = w.scrollWidth; }")
        await first.screenshot(path=SCREENSHOTS / f"{name}-phone-table-scrolled.png")
    await page.set_viewport_size(DESKTOP)


async def test_a_round_robin_page_shows_the_reports_standings_crosstable_and_every_game(
    arena: Arena, site: Site, client: TestClient, page: Page
) -> None:
    spec = TournamentSpec(
        format="round-robin", game="teeko", bots=BOTS, move_time_ms=200, concurrency=6
    )
    tid = await create(arena, spec)
    rep = await finished(client, tid)
    assert rep["games"]["finished"] == rep["games"]["scheduled"] == 6

    # The list, from the lobby's header: the tournament links to its page.
    await page.goto(f"{site.url}/")
    await page.click('.top nav a[href="/tournaments"]')
    link = page.locator(f'#tournaments a[data-id="{tid}"]')
    await link.wait_for()
    assert await link.get_attribute("href") == f"/tournaments/{tid}"
    row = await page.inner_text(f'#tournaments tr[data-id="{tid}"]')
    assert "Round robin" in row and "Teeko" in row and "6/6" in row and "ended" in row.lower()
    assert await page.get_attribute('.top nav a[href="/tournaments"]', "aria-current") == "page"
    await link.click()
    await page.wait_for_url(f"**/tournaments/{tid}")
    await page.wait_for_selector("table#standings tr[data-bot]")
    await page.wait_for_selector('#tour-status[data-status="ended"]')

    # The standings: the report's names and points, in its order.
    shown = await page.eval_on_selector_all(
        "table#standings tr[data-bot]",
        "rs => rs.map(r => [r.dataset.bot, r.querySelector('.points').textContent])",
    )
    assert [(n, float(p)) for n, p in shown] == [(s["name"], s["points"]) for s in rep["standings"]]

    # The crosstable: every pair's W-L-D as the report has it, the per-seat split on hover.
    cells = await page.eval_on_selector_all(
        "table#crosstable td[data-row][data-col]",
        "ts => ts.map(t => [t.dataset.row, t.dataset.col, t.querySelector('.wld-text').textContent,"
        " t.title])",
    )
    want = {(a, b): c for a, row in rep["crosstable"].items() for b, c in row.items() if a != b}
    assert {(a, b) for a, b, _, _ in cells} == set(want)
    for a, b, text, title in cells:
        c = want[a, b]
        assert text == f"{c['wins']}-{c['losses']}-{c['draws']}"
        first, second = c["as_first"], c["as_second"]
        assert f"as first {first['wins']}-{first['losses']}-{first['draws']}" in title
        assert f"as second {second['wins']}-{second['losses']}-{second['draws']}" in title

    # Pairs, health and ratings: one row each.
    pairs = await page.eval_on_selector_all("table#pairs tr[data-pair]", "rs => rs.length")
    assert pairs == len(rep["pairs"]) == 3
    health = await page.eval_on_selector_all(
        "table#health tr[data-bot]", "rs => rs.map(r => r.dataset.bot)"
    )
    assert sorted(health) == sorted(BOTS)
    rated = await page.eval_on_selector_all(
        "table#ratings tr[data-bot]", "rs => rs.map(r => r.dataset.bot)"
    )
    assert rated == [r["name"] for r in rep["ratings"][0]["rows"]]
    csv = await page.get_attribute("#csv", "href")
    assert csv == f"/api/tournaments/{tid}/standings.csv"
    assert (await client.get(csv)).status == 200
    progress = await page.get_attribute("#progress", "aria-valuenow")
    assert progress == str(rep["games"]["finished"])

    # Every game has a link to its replay, none is still "playing".
    links = await page.eval_on_selector_all(
        "table#schedule a[data-game]", "as => as.map(a => [a.dataset.game, a.getAttribute('href')])"
    )
    ids = [g["game_id"] for g in rep["schedule"]]
    assert sorted(g for g, _ in links) == sorted(ids)
    assert all(href == f"/games/{g}" for g, href in links)
    assert not await page.query_selector("table#schedule .badge.playing")

    await shots(page, "tournament", "table#standings")

    # Every table has its caption.
    assert await page.eval_on_selector_all("table:not(:has(> caption))", "ts => ts.length") == 0

    # Following a link from the keyboard opens the game's page and its board, without
    # reloading the page.
    await page.evaluate("window.notReloaded = true")
    first = ids[0]
    await page.focus(f'table#schedule a[data-game="{first}"]')
    await page.keyboard.press("Enter")
    await page.wait_for_url(f"**/games/{first}")
    await page.wait_for_selector(".board-wrap svg [data-cell]")
    assert await page.evaluate("window.notReloaded === true")
    await page.go_back()
    await page.wait_for_selector("table#standings tr[data-bot]")


async def test_a_game_not_created_yet_shows_as_waiting_without_a_link(
    arena: Arena, site: Site, client: TestClient, page: Page
) -> None:
    # Bots nobody serves and one game at a time: the first game stays playing (for the
    # unserved watch's 5 minutes), the second waits for it.
    spec = TournamentSpec(
        format="round-robin", game="teeko", bots=["idle", "idle.2"], concurrency=1
    )
    tid = await create(arena, spec)

    async def one_playing() -> dict[str, Any] | None:
        rep = await report(client, tid)
        return rep if [g["status"] for g in rep["schedule"]] == ["playing", "waiting"] else None

    rep = await until(one_playing, timeout_s=30)
    assert rep, "the director did not create the first game"
    playing, waiting = (g["game_id"] for g in rep["schedule"])
    await page.goto(f"{site.url}/tournaments/{tid}")
    await page.wait_for_selector(f'table#schedule tr[data-game="{waiting}"][data-status="waiting"]')
    assert await page.inner_text(f'tr[data-game="{waiting}"] .badge') == "WAITING"
    assert not await page.query_selector(f'tr[data-game="{waiting}"] a')
    assert await page.get_attribute(f'tr[data-game="{playing}"] a', "href") == f"/games/{playing}"
    assert await page.inner_text(f'tr[data-game="{playing}"] .badge') == "PLAYING"
    await shots(page, "tournament-waiting", "table#schedule")


async def test_a_match_that_ends_with_its_pairs_unchanged_says_so(
    arena: Arena, site: Site, client: TestClient, page: Page
) -> None:
    # Bots nobody serves: no pair ever completes, so the SPRT the page drew while the
    # match ran is the SPRT of its end; only the status changes. (The page once kept its
    # "so far" then, when the last pair's results came before the director's end.)
    tid = await create(arena, match(["idle", "idle.2"], concurrency=1, max_pairs=2))
    await page.goto(f"{site.url}/tournaments/{tid}")
    verdict = page.locator("#verdict")
    await verdict.filter(has_text="Undecided so far: 0 pairs played.").wait_for()
    await cancel(TournamentStore(arena.redis, arena.keys), tid)
    await page.wait_for_selector('#tour-status[data-status="ended"]', timeout=10_000)
    assert (await report(client, tid))["sprt"]["trajectory"] == []
    await verdict.filter(has_text="Undecided after 0 pairs.").wait_for(timeout=10_000)


async def test_a_match_draws_its_llr_and_bounds_and_the_leaderboard_rates_the_bots(
    arena: Arena, site: Site, client: TestClient, page: Page
) -> None:
    spec = match(["greedy", "random"], move_time_ms=200, concurrency=6, max_pairs=6)
    tid = await create(arena, spec)
    # Opened while it plays: the page follows it to its end by itself.
    await page.goto(f"{site.url}/tournaments/{tid}")
    await page.wait_for_selector("#tour-status")
    rep = await finished(client, tid)
    await page.wait_for_selector('#tour-status[data-status="ended"]', timeout=10_000)
    await page.wait_for_function(
        "n => document.querySelector('svg#llr')?.dataset.points === String(n)",
        arg=len(rep["sprt"]["trajectory"]),
        timeout=10_000,
    )
    sprt = rep["sprt"]
    assert sprt["trajectory"], "the match played no complete pair"

    # The trajectory: one point per complete pair, rising where the LLR rises; the bounds.
    points = await page.eval_on_selector(
        "svg#llr polyline",
        "p => p.getAttribute('points').trim().split(/\\s+/).map(xy => xy.split(',').map(Number))",
    )
    assert len(points) == len(sprt["trajectory"])
    xs = [x for x, _ in points]
    assert xs == sorted(xs) and len(set(xs)) == len(xs)
    llr = sprt["trajectory"]
    for i in range(1, len(llr)):
        if llr[i] != llr[i - 1]:  # y grows downward
            assert (points[i][1] < points[i - 1][1]) == (llr[i] > llr[i - 1])
    bounds = await page.eval_on_selector_all(
        "svg#llr line.bound",
        "ls => ls.map(l => [l.classList.contains('upper'), Number(l.getAttribute('y1'))])",
    )
    assert len(bounds) == 2
    upper = next(y for up, y in bounds if up)
    lower = next(y for up, y in bounds if not up)
    assert upper < lower
    verdict = page.locator("#verdict")
    assert await verdict.get_attribute("data-verdict") == sprt["verdict"]
    if rep["ended"]["reason"] == "max-pairs":
        assert "Undecided after 6 pairs." in await verdict.inner_text()
    pair = await page.inner_text("table#pairs tr[data-pair]")
    p = rep["pairs"][0]
    assert f"{p['wins']}-{p['losses']}-{p['draws']}" in pair
    assert " · ".join(map(str, p["penta"])) in pair

    await shots(page, "match", "svg#llr")

    # The list links to the match; the leaderboard of teeko rates both bots.
    await page.click('.top nav a[href="/tournaments"]')
    await page.wait_for_selector(f'#tournaments a[data-id="{tid}"][href="/tournaments/{tid}"]')
    await page.click('.top nav a[href="/leaderboards"]')
    await page.wait_for_selector("#lb-game option[value=teeko]", state="attached")
    await page.select_option("#lb-game", "teeko")
    await page.wait_for_url("**/leaderboards?game=teeko")
    await page.goto(f"{site.url}/leaderboards?game=teeko")
    await page.wait_for_selector("table#leaderboard tr[data-bot]")
    assert await page.input_value("#lb-game") == "teeko"
    resp = await client.get("/api/leaderboards/teeko")
    boards = (await resp.json())["boards"]
    shown = await page.eval_on_selector_all(
        "table#leaderboard tr[data-bot]",
        "rs => rs.map(r => [r.dataset.bot, r.querySelector('.rating strong').textContent])",
    )
    assert [n for n, _ in shown] == [r["name"] for r in boards[0]["rows"]]
    assert {n for n, _ in shown} == {"greedy", "random"}
    assert [int(r) for _, r in shown] == [math.floor(r["rating"] + 0.5) for r in boards[0]["rows"]]
    await shots(page, "leaderboard", "table#leaderboard")
