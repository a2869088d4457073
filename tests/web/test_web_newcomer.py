"""A newcomer's first hour on the page (issue 25), in a real headless Chromium.

A click that plays nothing says why under the board; a malformed or too high `?ply=` shows
the page at the last ply with a note; people play under a name, rated apart from the bots
(anonymous seats are not rated); the move list never runs ahead of the board; "live" only
while a game is being played; the shape that won is lit; the numbers on a player's card
are labelled; the replay controls fit a 1280 by 900 window; results are worded as the
command line words them; a stale move says what was sent and what was expected.
Screenshots in light, dark and at phone width go to `artifacts/screenshots/`.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Callable
from typing import Any

import pytest
from aiohttp.test_utils import TestClient
from playwright.async_api import Browser, Page

from engine import State, load_game
from engine.winning import winning_cells
from schemas.wording import REASONS, RULES, ending
from tests.support.browser import (
    SCREENSHOTS,
    Site,
    fresh_page,
    hold_seats,
    open_game,
    page_moves,
    shown_ply,
    slow_bot,
)
from tests.support.gateway import ended, new_game, until, view
from tests.web.conftest import DESKTOP, PHONE

pytestmark = pytest.mark.timeout(240)

BOTS = [{"bot": "random"}, {"bot": "random"}]
HUMANS = [{"human": {}}, {"human": {}}]
#: any error the page logs fails the test (tests/web/conftest.py)
CONSOLE_ERRORS = True


async def shots(page: Page, name: str) -> None:
    """Light and dark at desktop width, and dark at phone width."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    size = page.viewport_size
    for scheme in ("light", "dark"):
        await page.emulate_media(color_scheme=scheme)
        await page.wait_for_function(f"document.documentElement.dataset.theme === '{scheme}'")
        await page.wait_for_timeout(300)  # the cells' colours fade over .15 s
        await page.screenshot(path=SCREENSHOTS / f"{name}-{scheme}.png")
    await page.set_viewport_size({"width": PHONE["width"], "height": PHONE["height"]})
    await page.screenshot(path=SCREENSHOTS / f"{name}-phone.png", full_page=True)
    await page.emulate_media(color_scheme="light")
    assert size is not None
    await page.set_viewport_size(size)


async def play_all(client: TestClient, game_id: str, tokens: list[str], moves: list[str]) -> None:
    """Play `moves` in a hot-seat game, each for the seat to move."""
    for move in moves:
        v = await view(client, game_id)
        token = tokens[v["to_move"] - 1]
        body = {"move": move, "seq": v["seq"], "token": token}
        resp = await client.post(f"/api/games/{game_id}/moves", json=body)
        assert resp.status == 200, await resp.text()


def moves_until(game: str, want: Callable[[State], bool], seed: int = 1) -> list[str]:
    """Random legal moves from the start until the position is one `want` asks for."""
    rng = random.Random(seed)
    for _ in range(500):
        state = load_game(game).new_initial_state()
        moves: list[str] = []
        while not state.is_terminal and len(moves) < 150:
            if want(state):
                return moves
            move = rng.choice(state.legal_moves())
            state.apply(move)
            moves.append(str(move))
    raise AssertionError(f"no {game} position found")


def refused_empty_cells(state: State) -> list[str]:
    """The empty cells the mover may not place on, in a placement turn (no removal due)."""
    legal = [str(m) for m in state.legal_moves()]
    if any(m.startswith("x") for m in legal):
        return []
    cells = state.game.board.cells
    return [c.label for c, ch in zip(cells, state.board_string(), strict=True) if ch == "."
            and c.label not in legal]  # fmt: skip


def removing(state: State) -> bool:
    legal = [str(m) for m in state.legal_moves()]
    return bool(legal) and all(m.startswith("x") for m in legal)


async def note(page: Page) -> str:
    await page.wait_for_function("document.querySelector('#board-note').textContent.length > 0")
    return await page.inner_text("#board-note")


async def click_note(page: Page, cell: str) -> str:
    await page.evaluate("document.querySelector('#board-note').textContent = ''")
    await page.click(f'[data-cell="{cell}"]')
    return await note(page)


# -- item 3: a click that plays nothing says why ----------------------------------------------
async def test_a_click_that_plays_nothing_says_why(
    site: Site, page: Page, client: TestClient, browser: Browser
) -> None:
    # Supply Chains, hot seat: a placement that would leave its chain in deficit.
    moves = moves_until("supply-chains", lambda s: bool(refused_empty_cells(s)))
    state = load_game("supply-chains").new_initial_state()
    for m in moves:
        state.apply(m)
    game = await new_game(client, "supply-chains", seats=HUMANS)
    await play_all(client, game["id"], game["tokens"], moves)
    await hold_seats(page, game["id"], dict(enumerate(game["tokens"], start=1)))
    await open_game(page, site, game["id"], "")
    assert await page.get_attribute("#board-note", "role") == "status"  # announced
    refused = refused_empty_cells(state)[0]
    assert await click_note(page, refused) == f"{refused}: would leave your chain in deficit"
    occupied = next(
        c.label for c, ch in zip(state.game.board.cells, state.board_string(), strict=True)
        if ch != "."
    )  # fmt: skip
    assert await click_note(page, occupied) == f"{occupied}: occupied"
    await shots(page, "why-deficit")

    # A removal comes first.
    moves = moves_until("supply-chains", removing, seed=2)
    game = await new_game(client, "supply-chains", seats=HUMANS)
    await play_all(client, game["id"], game["tokens"], moves)
    await hold_seats(page, game["id"], dict(enumerate(game["tokens"], start=1)))
    await open_game(page, site, game["id"])
    empty = await page.get_attribute('[data-cell][data-piece=""]', "data-cell")
    assert empty is not None
    assert "deficit warehouse must be removed first" in await click_note(page, empty)

    # Hexade against a bot that thinks for a while: not your turn, and who is thinking.
    bots_url = str(client.make_url("")).rstrip("/")
    async with slow_bot(bots_url, "ponderer", think_s=2.5):
        game = await new_game(client, "hexade", seats=[{"human": {}}, {"bot": "ponderer"}])
        await hold_seats(page, game["id"], {1: game["tokens"][0]})
        await open_game(page, site, game["id"])
        await page.click('[data-cell="E5"]')
        await page.wait_for_function("document.querySelectorAll('#moves li').length === 1")
        said = await click_note(page, "E6")
        assert said == "E6: not your turn: ponderer is thinking"
        await shots(page, "why-not-your-turn")
        await page.wait_for_selector('[data-cell][data-mark="place"]')  # its move came
        # A watcher, in a browser of its own, holds no seat.
        async with fresh_page(browser, DESKTOP, console_errors=True) as watcher:
            await open_game(watcher, site, game["id"])
            assert await click_note(watcher, "E5") == "E5: you are watching: you hold no seat here"


# -- item 5: a bad ?ply= ----------------------------------------------------------------------
async def test_a_bad_ply_shows_the_last_ply_with_a_note(
    site: Site, page: Page, client: TestClient
) -> None:
    game = await new_game(client, "teeko", seats=BOTS)
    final = await ended(client, game["id"])
    total = final["ply"]
    for query in ("?ply=-1", "?ply=", "?ply=abc", "?ply=9999", "?ply=1e3"):
        resp = await client.get(f"/games/{game['id']}{query}")
        assert resp.status == 200 and resp.content_type == "text/html", query
        await open_game(page, site, game["id"], query)
        said = await note(page)
        if query == "?ply=9999":
            assert said == f"There is no move 9999: showing the last position (move {total})."
        else:
            assert "is not a move number: showing the last position" in said, said
        assert await shown_ply(page) == total
        assert page.url.endswith(f"?ply={total}"), page.url  # corrected in the address
    await shots(page, "bad-ply")
    # A crafted link cannot make the page say what it likes: the text is cut short.
    await open_game(
        page, site, game["id"], "?ply=Your%20seat%20was%20revoked%2C%20log%20in%20at%20evil"
    )
    said = await note(page)
    assert "revoked" not in said and "…” is not a move number" in said, said
    # A good one stays as it is.
    await open_game(page, site, game["id"], "?ply=2")
    assert await shown_ply(page) == 2 and page.url.endswith("?ply=2")
    assert await page.inner_text("#board-note") == ""


# -- item 6: people have a name ---------------------------------------------------------------
async def test_people_play_under_a_name_rated_apart_and_anonymous_seats_unrated(
    site: Site, page: Page, client: TestClient
) -> None:
    await page.goto(f"{site.url}/")
    await page.wait_for_selector("#your-name")
    assert await page.get_attribute("#your-name", "placeholder") == "anonymous"
    # A bot's name is refused.
    await page.fill("#your-name", "random")
    await page.select_option("#new-game-game", "teeko")
    await page.click("#start")
    await page.wait_for_function("document.querySelector('#new-game .message').textContent")
    assert "a bot's name" in await page.inner_text("#new-game .message")
    assert (await client.get("/api/games")).status == 200  # none was created
    assert not (await (await client.get("/api/games")).json())["games"]
    # Under a name: the seat has it, the name is remembered.
    await page.fill("#your-name", "ada")
    await page.click("#start")
    await page.wait_for_url(re.compile(r"/games/[0-9a-f]+$"))
    game_id = page.url.rsplit("/", 1)[1]
    v = await view(client, game_id)
    assert [(s["kind"], s["name"]) for s in v["seats"]] == [("human", "ada"), ("bot", "random")]
    await page.wait_for_selector('.player[data-seat="1"]')
    assert "ada — you" in await page.inner_text('.player[data-seat="1"]')
    await page.goto(f"{site.url}/")
    await page.wait_for_selector("#your-name")
    assert await page.input_value("#your-name") == "ada"
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    await page.screenshot(path=SCREENSHOTS / "lobby-name-light.png")
    token = json.loads(await page.evaluate("localStorage.getItem('agon.tokens')"))[game_id]["1"]
    resp = await client.post(f"/api/games/{game_id}/resign", json={"token": token})
    assert resp.status == 200, await resp.text()
    # Anonymous: no name on the seat, no rating.
    anonymous = await new_game(client, "teeko")
    assert (await view(client, anonymous["id"]))["seats"][0]["name"] == ""
    resp = await client.post(
        f"/api/games/{anonymous['id']}/resign", json={"token": anonymous["tokens"][0]}
    )
    assert resp.status == 200, await resp.text()
    await ended(client, anonymous["id"])

    async def rated() -> dict[str, bool] | None:
        resp = await client.get("/api/leaderboards/teeko")
        boards = (await resp.json())["boards"]
        rows = {r["name"]: r["person"] for b in boards for r in b["rows"]}
        return rows if "ada" in rows else None

    assert await until(rated, timeout_s=30) == {"ada": True, "random": False}
    await page.goto(f"{site.url}/leaderboards?game=teeko")
    await page.wait_for_selector("table#leaderboard-people tr[data-bot]")
    bots = await page.eval_on_selector_all(
        "table#leaderboard tr[data-bot]", "rs => rs.map(r => r.dataset.bot)"
    )
    people = await page.eval_on_selector_all(
        "table#leaderboard-people tr[data-bot]", "rs => rs.map(r => r.dataset.bot)"
    )
    assert bots == ["random"] and people == ["ada"]
    assert "Person" in (await page.text_content("table#leaderboard-people thead") or "")
    await shots(page, "leaderboard-people")


# -- item 7: the board, the move list, the cards, the controls ---------------------------------
async def test_the_move_list_never_runs_ahead_of_the_board_and_live_only_while_playing(
    site: Site, page: Page, client: TestClient
) -> None:
    bots_url = str(client.make_url("")).rstrip("/")
    async with slow_bot(bots_url, "plodder", think_s=0.15):
        game = await new_game(client, "teeko", seats=[{"bot": "random"}, {"bot": "plodder"}])
        gid = game["id"]

        async def slow_view(route: Any) -> None:  # the view comes well after the event
            await page.wait_for_timeout(300)
            await route.continue_()

        await page.route(re.compile(rf"/api/games/{gid}$"), slow_view)
        await open_game(page, site, gid)
        await page.evaluate(
            """() => {
                window.ahead = [];
                const check = () => {
                    const s = document.querySelector("section.game");
                    const listed = document.querySelectorAll("#moves li").length;
                    if (listed > Number(s.dataset.ply)) window.ahead.push([listed, s.dataset.ply]);
                };
                new MutationObserver(check).observe(document.querySelector("section.game"),
                    { subtree: true, childList: true, attributes: true });
            }"""
        )
        await page.wait_for_selector("#live", state="visible")  # (once its view came)
        final = await ended(client, gid)
    await page.wait_for_function(
        "n => document.querySelectorAll('#moves li').length === n", arg=final["ply"]
    )
    assert await page.evaluate("window.ahead") == []
    assert await page_moves(page) == final["moves"]
    await page.wait_for_selector("#live", state="hidden")  # finished: not live
    await page.unroute(re.compile(rf"/api/games/{gid}$"))

    playing = await new_game(client, "teeko", seats=HUMANS)  # nobody moves: it stays going
    await play_all(client, playing["id"], playing["tokens"], ["A1", "A5"])
    await open_game(page, site, playing["id"])
    await page.wait_for_selector("#live", state="visible")
    await page.keyboard.press("Home")  # replay: not live
    await page.wait_for_selector("#live", state="hidden")


async def test_the_winning_shape_is_lit_and_the_cards_numbers_labelled(
    site: Site, page: Page, client: TestClient
) -> None:
    teeko = await new_game(client, "teeko", seats=HUMANS)
    await play_all(client, teeko["id"], teeko["tokens"], ["A1", "A5", "B1", "B5", "C1", "C5", "D1"])
    final = await view(client, teeko["id"])
    assert final["board"]["winning"] == ["A1", "B1", "C1", "D1"]
    await open_game(page, site, teeko["id"])
    lit = await page.eval_on_selector_all(".cell.win", "gs => gs.map(g => g.dataset.cell)")
    assert lit == ["A1", "B1", "C1", "D1"]
    assert "winning shape" in (await page.get_attribute('[data-cell="A1"]', "aria-label") or "")
    assert await page.inner_text("#status") == f"Blue wins — {RULES['line']}"
    await shots(page, "teeko-win")

    # Hexade's line of six, from the engine's own tables.
    hexade = load_game("hexade")
    state = hexade.new_initial_state()
    line = hexade.lines[0][0]  # type: ignore[attr-defined]
    sites = [s for s in range(hexade.n) if line >> s & 1]  # type: ignore[attr-defined]
    labels = hexade.board.labels  # type: ignore[attr-defined]
    far = iter(s for s in range(hexade.n - 1, 0, -2) if not hexade.all_near[s] & line)  # type: ignore[attr-defined]
    moves = []
    for s in sites:
        moves.append(labels[s])
        state.apply(labels[s])
        if not state.is_terminal:
            moves.append(labels[next(far)])
            state.apply(moves[-1])
    game = await new_game(client, "hexade", seats=HUMANS)
    await play_all(client, game["id"], game["tokens"], moves)
    await open_game(page, site, game["id"])
    lit = await page.eval_on_selector_all(".cell.win", "gs => gs.map(g => g.dataset.cell)")
    assert sorted(lit) == sorted(winning_cells(state)) == sorted(labels[s] for s in sites)
    await shots(page, "hexade-win")

    # The numbers on a player's card say what they are.
    chains = await new_game(client, "supply-chains", move_time=90)
    await hold_seats(page, chains["id"], {1: chains["tokens"][0]})
    await open_game(page, site, chains["id"])
    card = page.locator('.player[data-seat="1"]')
    assert (await card.locator(".score .label").text_content()) == "score"
    assert (await card.locator(".clock-box .label").text_content()) == "time left"
    await shots(page, "player-cards")


@pytest.mark.parametrize(
    ("game", "options"),
    [
        ("hexade", {}),
        ("supply-chains", {"board": "square-8"}),
        ("overflow", {"size": "8"}),
        ("teeko", {}),
    ],
)
async def test_the_replay_controls_fit_a_1280_by_900_window(
    site: Site, page: Page, client: TestClient, game: str, options: dict[str, str]
) -> None:
    await page.set_viewport_size({"width": 1280, "height": 900})
    created = await new_game(client, game, options=options)
    await open_game(page, site, created["id"])
    bottom = await page.evaluate(
        "() => Math.max(...['#replay', '#last', '#board-note'].map("
        "(s) => document.querySelector(s).getBoundingClientRect().bottom))"
    )
    assert bottom <= 900, f"{game}: the replay controls end at {bottom} px"
    await page.screenshot(path=SCREENSHOTS / f"replay-fits-{game}.png")


# -- the words and the refusals the page shows -------------------------------------------------
async def test_results_are_worded_by_one_table_the_page_and_the_cli_share(
    client: TestClient,
) -> None:
    resp = await client.get("/web/words.js")
    assert resp.status == 200 and resp.content_type == "text/javascript"
    text = await resp.text()
    tables = {
        m[1]: json.loads(m[2]) for m in re.finditer(r"export const (\w+) = (.*);$", text, re.M)
    }
    assert tables["REASONS"] == REASONS and tables["RULES"] == RULES
    assert ending("natural", "no-moves") == "no placement left"
    assert ending("time_forfeit", "") == "on time"


async def test_a_stale_move_says_what_was_sent_and_what_was_expected(client: TestClient) -> None:
    game = await new_game(client, "teeko", seats=HUMANS)
    await play_all(client, game["id"], game["tokens"], ["A1"])
    head = (await view(client, game["id"]))["seq"]
    body = {"move": "B1", "seq": head - 1, "token": game["tokens"][1]}
    resp = await client.post(f"/api/games/{game['id']}/moves", json=body)
    got = await resp.json()
    assert got["code"] == "stale_seq"
    assert f"sent for seq {head - 1}" in got["message"]
    assert f"expected seq {head}" in got["message"]
