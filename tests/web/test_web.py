"""The web page in a real headless Chromium, against a real gateway and the whole pipeline.

Each test serves a gateway of the arena on a TCP port (`tests/support/browser.py`) and uses the
page as a person does: the lobby's form, clicks on the board's cells, the replay slider
and keys. What the page shows is checked against the log (the move list) and against the
engine itself (every board, every ply's surplus numbers and deficit warehouses), never
against the page's own data source alone. Screenshots of every board shape are written to
`artifacts/screenshots/` (ignored by git).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import random
import re
from typing import Any

import pytest
from aiohttp.test_utils import TestClient
from playwright.async_api import Page

from bots.base import bot_names
from engine import game_names, load_game
from engine.boards import load_board
from services.gateway.pages import game_boards
from tests.support.browser import (
    SCREENSHOTS,
    Site,
    board_cells,
    hold_seats,
    keep_tokens,
    log_moves,
    open_game,
    page_display,
    page_moves,
    position,
    serving,
    shown_ply,
    slow_bot,
    surplus_display,
)
from tests.support.gateway import Arena, ended, new_game, until, view

pytestmark = pytest.mark.timeout(240)

BOTS = [{"bot": "random"}, {"bot": "random"}]
HUMANS = [{"human": {}}, {"human": {}}]


async def play(client: TestClient, game_id: str, token: str, move: str) -> None:
    seq = (await view(client, game_id))["seq"]
    resp = await client.post(
        f"/api/games/{game_id}/moves", json={"move": move, "seq": seq, "token": token}
    )
    assert resp.status == 200, await resp.text()


async def page_status(page: Page) -> str:
    return await page.inner_text("#status")


# -- the lobby -----------------------------------------------------------------------------
async def test_the_lobby_lists_games_filters_them_and_offers_every_game_and_option(
    site: Site, page: Page, client: TestClient
) -> None:
    finished = await new_game(client, "teeko", seats=BOTS)
    waiting = await new_game(client, "supply-chains")  # the person's turn: it stays going
    await ended(client, finished["id"])
    assert (await client.post("/api/bots", json={"name": "outsider"})).status == 201

    await page.goto(f"{site.url}/")
    for game in (finished, waiting):
        await page.wait_for_selector(f'#games a[data-id="{game["id"]}"]')
    row = await page.inner_text(f'#games a[data-id="{finished["id"]}"]')
    assert "Teeko" in row and "ended" in row.lower() and "wins" in row

    # Every game of the engine, each option with its values, the default first and chosen.
    names = await page.eval_on_selector_all("#new-game-game option", "os => os.map(o => o.value)")
    assert names == game_names()
    for name in names:
        await page.select_option("#new-game-game", name)
        shown = await page.evaluate(
            """() => Object.fromEntries(Array.from(
                document.querySelectorAll("#new-game-options select"),
                (s) => [s.dataset.option, [Array.from(s.options, (o) => o.value), s.value]]))"""
        )
        options = type(load_game(name)).OPTIONS
        assert shown == {k: [list(v), v[0]] for k, v in options.items()}, name
    seats = await page.eval_on_selector_all("#seat2 option", "os => os.map(o => o.value)")
    assert seats == ["", *bot_names(), "outsider"]  # "you", the built-in bots, a registered one

    # Filters, kept in the address.
    await page.select_option("#filter-status", "ended")
    await page.wait_for_selector(f'#games a[data-id="{waiting["id"]}"]', state="detached")
    assert await page.is_visible(f'#games a[data-id="{finished["id"]}"]')
    assert "status=ended" in page.url
    await page.select_option("#filter-status", "")
    await page.select_option("#filter-game", "supply-chains")
    await page.wait_for_selector(f'#games a[data-id="{finished["id"]}"]', state="detached")
    assert await page.is_visible(f'#games a[data-id="{waiting["id"]}"]')

    # A phone-width window, dark: screenshot kept for people to look at.
    await page.set_viewport_size({"width": 390, "height": 844})
    await page.emulate_media(color_scheme="dark")
    await page.wait_for_function("document.documentElement.dataset.theme === 'dark'")
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    await page.screenshot(path=SCREENSHOTS / "lobby-phone-dark.png", full_page=True)

    # The theme toggle, and a row opening its game without reloading the page.
    await page.click("#theme")
    assert await page.evaluate("document.documentElement.dataset.theme") == "light"
    await page.evaluate("window.notReloaded = true")
    await page.click(f'#games a[data-id="{waiting["id"]}"]')
    await page.wait_for_url(f"**/games/{waiting['id']}")
    await page.wait_for_selector("[data-cell]")
    assert await page.evaluate("window.notReloaded === true")


# -- playing by clicking ------------------------------------------------------------------
async def test_a_person_plays_teeko_to_the_end_against_the_random_bot_by_clicking(
    site: Site, page: Page, client: TestClient
) -> None:
    await page.goto(f"{site.url}/")
    await page.wait_for_selector("#new-game-game option[value=teeko]", state="attached")
    await page.select_option("#new-game-game", "teeko")
    await page.select_option("#seat1", "")  # you
    await page.select_option("#seat2", "random")
    await page.fill("#move-time", "90")
    await page.click("#start")
    await page.wait_for_url(re.compile(r"/games/[0-9a-f]+$"))
    game_id = page.url.rsplit("/", 1)[1]
    held = await page.evaluate("JSON.parse(localStorage.getItem('agon.tokens'))")
    token = held[game_id]["1"]
    assert set(held[game_id]) == {"1"}  # the bot's seat has no token
    # The clock of the seat to move counts down from the move time.
    clock = page.locator('.player[data-seat="1"] .clock')
    first_reading = await clock.inner_text()
    assert re.fullmatch(r"1:[0-3]\d", first_reading), first_reading
    await page.wait_for_function(
        "t => document.querySelector('.clock')?.textContent !== t", arg=first_reading
    )

    # An attempt the server refuses shows its message: here, a token of no seat.
    await keep_tokens(page, game_id, {1: "x" * 32})
    first = page.locator('[data-cell][data-mark="place"]').first
    await first.click()
    await page.wait_for_function("document.querySelector('#message').textContent.length > 0")
    assert "bad_token" in await page.inner_text("#message")
    assert await log_moves(client, game_id) == []
    await keep_tokens(page, game_id, {1: token})

    rng = random.Random(8)
    for _ in range(200):
        now = await page.wait_for_function(
            """() => {
                const s = document.querySelector("section.game");
                if (s?.dataset.status === "ended") return "ended";
                return document.querySelector("[data-cell][data-mark]") ? s.dataset.seq : null;
            }"""
        )
        seq = await now.json_value()
        if seq == "ended":
            break
        v = await view(client, game_id)
        if str(v["seq"]) != seq:
            continue  # the page is about to show the newer position
        move = winning_or_random(v, rng)
        await click_move(page, move)
        played = len(v["moves"])
        await until(lambda n=played: _moves_beyond(client, game_id, n))
    final = await view(client, game_id)
    assert final["status"] == "ended"
    await page.wait_for_function("document.querySelector('#status').dataset.status === 'ended'")
    assert re.search(r"(Blue|Orange) wins|Draw", await page_status(page))
    assert await page_moves(page) == final["moves"] == await log_moves(client, game_id)
    last = final["moves"][-1].split("-")[-1]
    classes = (await page.get_attribute(f'[data-cell="{last}"]', "class") or "").split()
    assert classes[:2] == ["cell", "last"]  # and "win" when the game ended on a shape


def winning_or_random(v: dict[str, Any], rng: random.Random) -> str:
    """A move that wins at once if there is one (the engine says), else a random legal one."""
    state = position(v["game"], v["options"], v["moves"])
    for move in v["legal_moves"]:
        after = state.clone()
        after.apply(move)
        if after.is_terminal:
            return str(move)
    return str(rng.choice(v["legal_moves"]))


async def click_move(page: Page, move: str) -> None:
    """Play a move as a person does: one click, or two (the piece, then where it goes)."""
    if "-" in move or ">" in move:
        source = re.split(r"[->]", move)[0]
        await page.click(f'[data-cell="{source}"][data-mark="source"]')
        await page.wait_for_selector(f'[data-cell="{source}"][data-mark="selected"]')
        await page.click(f'[data-cell="{target_of(move)}"][data-mark="dest"]')
    else:
        await page.click(f'[data-cell="{move.lstrip("x")}"]')


DIRECTIONS = {"N": (1, 0), "NE": (1, 1), "E": (0, 1), "SE": (-1, 1),
              "S": (-1, 0), "SW": (-1, -1), "W": (0, -1), "NW": (1, -1)}  # fmt: skip


def target_of(move: str) -> str:
    """Where the second click of a step (`C4-D5`) or a sowing (`C4>NE`) goes."""
    if "-" in move:
        return move.split("-")[1]
    cell, direction = move.split(">")
    col = ord(cell[0]) - ord("A") + DIRECTIONS[direction][1]
    row = int(cell[1:]) + DIRECTIONS[direction][0]
    return f"{chr(ord('A') + col)}{row}"


async def _moves_beyond(client: TestClient, game_id: str, n: int) -> bool:
    return len(await log_moves(client, game_id)) > n


async def test_two_click_moves_teeko_steps_and_overflow_sowing(
    site: Site, page: Page, client: TestClient
) -> None:
    # Hot seat: this browser holds both seats, so the test decides every move.
    teeko = await new_game(client, "teeko", options={"markers": "4"}, seats=HUMANS)
    one, two = teeko["tokens"]
    # Placements that make no line and no square, so the movement phase comes.
    for move, token in zip(
        ["A1", "E1", "C1", "A5", "A3", "E5", "C5", "E3"], itertools.cycle([one, two])
    ):
        await play(client, teeko["id"], token, move)
    await hold_seats(page, teeko["id"], {1: one, 2: two})
    await open_game(page, site, teeko["id"])
    marks = await page.eval_on_selector_all(
        '[data-mark="source"]', "gs => gs.map(g => g.dataset.cell)"
    )
    assert sorted(marks) == ["A1", "A3", "C1", "C5"]  # blue's markers, each able to step
    await click_move(page, "A1-B2")
    await until(lambda: _moves_beyond(client, teeko["id"], 8))
    assert (await log_moves(client, teeko["id"]))[-1] == "A1-B2"
    # A click on the selected piece again, or Escape, takes the selection back.
    await page.wait_for_selector('[data-cell="E1"][data-mark="source"]')
    await page.click('[data-cell="E1"]')
    await page.wait_for_selector('[data-cell="E1"][data-mark="selected"]')
    await page.keyboard.press("Escape")
    await page.wait_for_selector('[data-cell="E1"][data-mark="source"]')

    overflow = await new_game(client, "overflow", options={"size": "4"}, seats=HUMANS)
    await hold_seats(page, overflow["id"], dict(enumerate(overflow["tokens"], start=1)))
    await open_game(page, site, overflow["id"])
    heights = {c["label"]: c["height"] for c in await board_cells(page)}
    assert heights == {c.label: "1" for c in load_board("square-4").cells}
    legal = (await view(client, overflow["id"]))["legal_moves"]
    # From the keyboard: Enter on the stack, then Enter on its first target (focused).
    await page.focus(f'[data-cell="{legal[0].split(">")[0]}"]')
    await page.keyboard.press("Enter")
    focused = await page.evaluate("document.activeElement.dataset.cell")
    assert focused == target_of(legal[0])
    await page.keyboard.press("Enter")
    await until(lambda: _moves_beyond(client, overflow["id"], 0))
    assert await log_moves(client, overflow["id"]) == [legal[0]]
    after = position("overflow", {"size": "4"}, [legal[0]]).board_string().split(",")
    await page.wait_for_function("document.querySelectorAll('#moves button').length === 1")
    await page.wait_for_selector(f'[data-cell="{target_of(legal[0])}"].last')
    assert [c["height"] for c in await board_cells(page)] == after


async def test_hexade_swap_and_resignation_by_buttons(
    site: Site, page: Page, client: TestClient
) -> None:
    created = await new_game(client, "hexade", seats=[{"bot": "random"}, {"human": {}}])
    token = created["tokens"][1]
    await until(lambda: _moves_beyond(client, created["id"], 0))
    await hold_seats(page, created["id"], {2: token})
    await open_game(page, site, created["id"])
    assert await page.is_visible("#pass") is False
    await page.click("#swap")
    await page.wait_for_selector('.player[data-seat="2"][data-colour="1"]')
    assert "swapped" in await page.inner_text('.player[data-seat="2"]')
    assert await page.get_attribute('.player[data-seat="1"]', "data-colour") == "2"
    assert (await log_moves(client, created["id"]))[1] == "swap"
    await page.wait_for_selector('[data-cell][data-mark="place"]')  # after the bot's reply
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    await page.screenshot(path=SCREENSHOTS / "hexade-after-swap.png")
    await page.click("#resign")
    await page.click("#resign")  # confirm
    await page.wait_for_function("document.querySelector('#status').dataset.status === 'ended'")
    assert "resignation" in await page_status(page)
    assert (await view(client, created["id"]))["result"]["reason"] == "resignation"


# -- watching live, and coming back after a dropped connection ---------------------------
async def test_a_bot_game_watched_live_ends_with_the_moves_of_the_log(
    arena: Arena, site: Site, page: Page, client: TestClient
) -> None:
    bots_url = str(client.make_url("")).rstrip("/")
    async with slow_bot(bots_url, "slowpoke", think_s=0.08):
        created = await new_game(
            client, "supply-chains", seats=[{"bot": "random"}, {"bot": "slowpoke"}]
        )
        await open_game(page, site, created["id"])
        seen: set[int] = set()
        while await page.get_attribute("#status", "data-status") != "ended":
            seen.add(len(await page_moves(page)))
            await asyncio.sleep(0.05)
        final = await ended(client, created["id"])
    assert len(seen) >= 5, f"the page showed only {sorted(seen)} moves while the game went on"
    await page.wait_for_function(
        "n => document.querySelectorAll('#moves button').length >= n", arg=final["ply"]
    )
    assert await page_moves(page) == final["moves"] == await log_moves(client, created["id"])
    assert await page.get_attribute("#live", "data-connects") == "1"
    announced = await page.inner_text("#announce")
    assert "wins" in announced or "Draw" in announced


@pytest.mark.parametrize("snapshot_gap", [200, 2], ids=["missed-events", "snapshot"])
async def test_a_dropped_socket_resumes_with_no_move_missing_or_doubled(
    arena: Arena, page: Page, client: TestClient, snapshot_gap: int
) -> None:
    """The page comes back by itself; the gateway sends what it missed as events, or (too
    far behind) as a snapshot, after which the page reads the missed moves from the log."""
    kinds: list[str] = []
    page.on(
        "websocket",
        lambda ws: ws.on("framereceived", lambda f: kinds.append(json.loads(f)["type"])),
    )
    bots_url = str(client.make_url("")).rstrip("/")  # another gateway: play goes on there
    async with (
        serving(arena, snapshot_gap=snapshot_gap) as site,
        slow_bot(bots_url, "steady", think_s=0.08),
    ):
        created = await new_game(
            client, "supply-chains", seats=[{"bot": "random"}, {"bot": "steady"}]
        )
        await open_game(page, site, created["id"])
        await page.wait_for_function("document.querySelectorAll('#moves button').length >= 4")
        await site.drop()
        await page.wait_for_selector('#live:not([data-state="open"])')
        shown = len(await page_moves(page))
        await until(lambda: _moves_beyond(client, created["id"], shown + 3))
        assert len(await page_moves(page)) < len(await log_moves(client, created["id"]))
        await site.restore()
        # (attached: a game that ended meanwhile is no longer shown as live)
        await page.wait_for_selector('#live[data-state="open"]', state="attached", timeout=15_000)
        final = await ended(client, created["id"])
    await page.wait_for_function(
        "n => document.querySelectorAll('#moves button').length >= n", arg=final["ply"]
    )
    assert await page_moves(page) == final["moves"] == await log_moves(client, created["id"])
    assert int(await page.get_attribute("#live", "data-connects") or 0) >= 2
    plies = await page.eval_on_selector_all(
        "#moves button", "bs => bs.map(b => Number(b.dataset.ply))"
    )
    assert plies == list(range(1, final["ply"] + 1))
    assert ("snapshot" in kinds) == (snapshot_gap == 2)


# -- replay ----------------------------------------------------------------------------------
async def test_a_finished_supply_chains_game_replays_ply_by_ply_as_the_engine_shows_it(
    site: Site, page: Page, client: TestClient
) -> None:
    # A game with deficit warehouses at some plies (they are rare on hex boards), played
    # through the API by two seats, both ours.
    options = {"board": "square-8"}
    playout = game_with_deficits("supply-chains", options)
    created = await new_game(client, "supply-chains", options=options, seats=HUMANS)
    for move in playout:
        v = await view(client, created["id"])
        token = created["tokens"][v["to_move"] - 1]
        body = {"move": move, "seq": v["seq"], "token": token}
        assert (await client.post(f"/api/games/{created['id']}/moves", json=body)).status == 200
    final = await ended(client, created["id"])
    moves, total = final["moves"], final["ply"]
    assert moves == playout
    asked: list[str] = []
    page.on("request", lambda r: asked.append(r.url) if "ply=" in r.url else None)
    await open_game(page, site, created["id"], "?ply=0")
    assert await shown_ply(page) == 0
    # Every ply's view is fetched once, in the background; then stepping asks nothing.
    await page.wait_for_function(
        f"document.querySelector('#replay').dataset.cached === '{total + 1}'"
    )
    fetched = len(asked)
    assert fetched <= total + 1
    await page.focus("#next")
    for ply in range(total + 1):
        expected = surplus_display(position("supply-chains", options, moves[:ply]))
        await page.wait_for_function(f"document.querySelector('#ply').value === '{ply}'")
        shown = page_display(await board_cells(page))
        assert shown == expected, f"ply {ply}"
        assert ply == total or f"ply={ply}" in page.url
        if ply < total:
            await page.keyboard.press("ArrowRight")
    assert len(asked) == fetched, "stepping through the game asked the server again"
    # Home, End, a click on the move list, and the address opening at a ply.
    await page.keyboard.press("Home")
    assert await shown_ply(page) == 0
    await page.keyboard.press("End")
    assert await shown_ply(page) == total
    middle = total // 2
    await page.click(f'#moves button[data-ply="{middle}"]')
    assert await shown_ply(page) == middle
    assert await page.get_attribute(f'#moves button[data-ply="{middle}"]', "aria-current") == "step"
    await open_game(page, site, created["id"], f"?ply={middle}")
    await page.wait_for_function(f"document.querySelector('#ply').value === '{middle}'")
    expected = surplus_display(position("supply-chains", options, moves[:middle]))
    await page.wait_for_function(
        "n => document.querySelectorAll('[data-surplus]').length === n", arg=len(expected[0])
    )
    assert page_display(await board_cells(page)) == expected
    # Cells say what they hold, as a screen reader reads them.
    for cell in await board_cells(page):
        assert cell["aria"].startswith(f"{cell['label']}, ")
        if cell["warehouse"] == "deficit":
            assert "deficit warehouse" in cell["aria"]
        if cell["surplus"] is not None:
            assert f"surplus {cell['surplus']}" in cell["aria"]
        if not cell["piece"]:
            assert cell["aria"].startswith(f"{cell['label']}, empty")


def game_with_deficits(game: str, options: dict[str, str]) -> list[str]:
    """The moves of the first seeded random game with deficit warehouses at 2+ plies."""
    for seed in itertools.count():
        rng = random.Random(seed)
        state = load_game(game, **options).new_initial_state()
        moves: list[str] = []
        deficits = 0
        while not state.is_terminal:
            deficits += bool(surplus_display(state)[1])
            move = str(rng.choice(state.legal_moves()))
            state.apply(move)
            moves.append(move)
        if deficits >= 2:
            return moves
    raise AssertionError("unreachable")


# -- every board shape --------------------------------------------------------------------
def every_game_board() -> dict[tuple[str, str], dict[str, str]]:
    """(game, board) -> the first options (in RULES.md §8 order) that play it there."""
    found: dict[tuple[str, str], dict[str, str]] = {}
    for name in game_names():
        options = type(load_game(name)).OPTIONS
        for values in itertools.product(*options.values()):
            chosen = dict(zip(options, values, strict=True))
            found.setdefault((name, load_game(name, **chosen).board.name), chosen)
    return found


async def test_every_board_shape_draws_every_cell_with_what_it_holds(
    site: Site, page: Page, client: TestClient
) -> None:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    games = every_game_board()
    assert {board for _, board in games} == game_boards()  # every board the gateway serves
    rng = random.Random(3)
    for (game, board), options in sorted(games.items()):
        created = await new_game(client, game, options=options)
        token = created["tokens"][0]
        for _ in range(min(8, load_board(board).num_sites // 4)):  # a position with pieces
            v = await until(lambda gid=created["id"]: _my_turn_or_end(client, gid))
            if v["status"] == "ended":
                break
            await play(client, created["id"], token, rng.choice(v["legal_moves"]))
        v = await until(lambda gid=created["id"]: _my_turn_or_end(client, gid))
        await hold_seats(page, created["id"], {1: token})
        await open_game(page, site, created["id"])
        await page.wait_for_function(
            f"document.querySelector('section.game').dataset.seq === '{v['seq']}'"
        )
        cells = await board_cells(page)
        geometry = load_board(board)
        assert len(cells) == geometry.num_sites, board
        assert [c["label"] for c in cells] == list(geometry.labels), board
        for shown, cell in zip(cells, v["board"]["cells"], strict=True):
            held = cell.get("height", cell.get("piece")) or ""
            assert shown["piece"] == str(held), (board, shown)
        if game == "overflow":
            assert {c["house"] for c in cells} == {"1", "2"}
            assert all(c["height"] is not None for c in cells)
        if game in ("supply-chains", "supplier-sabotage"):
            state = position(game, options, v["moves"])
            assert page_display(cells) == surplus_display(state), board
        if game == "teeko":
            hands = await page.eval_on_selector_all(
                ".hand", "hs => hs.map(h => Number(h.dataset.hand))"
            )
            assert hands == v["board"]["hands"]
        if v["status"] == "playing":  # the person's turn: the legal targets are marked
            marked = {c["label"] for c in cells if c["mark"]}
            assert marked and marked <= {
                re.split(r"[->]", m)[0].lstrip("x") for m in v["legal_moves"]
            }
        await page.screenshot(path=SCREENSHOTS / f"{board}-{game}.png")
    # A phone-width window draws the last board whole.
    await page.set_viewport_size({"width": 390, "height": 844})
    await page.screenshot(path=SCREENSHOTS / "phone-width.png", full_page=True)
    box = await page.locator("svg.board").bounding_box()
    assert box is not None and box["width"] <= 390


async def _my_turn_or_end(client: TestClient, game_id: str) -> dict[str, Any] | None:
    v = await view(client, game_id)
    return v if v["status"] == "ended" or v["to_move"] == 1 else None


# -- what the page reads besides the game API ---------------------------------------------
async def test_the_page_and_its_files_are_served_and_nothing_else(client: TestClient) -> None:
    for path in ("/", "/games/anything", "/games/x?ply=3"):
        resp = await client.get(path)
        assert resp.status == 200 and resp.content_type == "text/html", path
        assert '<script type="module" src="/web/app.js">' in await resp.text()
    kinds = {"app.js": "text/javascript", "style.css": "text/css", "game.js": "text/javascript"}
    for name, kind in kinds.items():
        resp = await client.get(f"/web/{name}")
        assert resp.status == 200 and resp.content_type == kind, name
    for name in ("nope.js", "..%2Fpages.py", ".hidden.js", "pages.py"):
        resp = await client.get(f"/web/{name}")
        assert resp.status == 404 and (await resp.json())["code"] == "not_found", name


async def test_board_geometry_is_the_engines_cells_with_outlines_and_edge_coordinates(
    client: TestClient,
) -> None:
    sides = {"square": 4, "hex": 6}
    for name in sorted(game_boards()):
        resp = await client.get(f"/api/boards/{name}")
        assert resp.status == 200, name
        body = await resp.json()
        board = load_board(name)
        assert body["name"] == name and body["kind"] == board.kind
        assert [c["label"] for c in body["cells"]] == list(board.labels)
        for drawn, cell in zip(body["cells"], board.cells, strict=True):
            assert (drawn["x"], drawn["y"]) == (cell.x, -cell.y + 0.0)  # y drawn downward
            corners = [tuple(map(float, p.split(","))) for p in drawn["points"].split()]
            assert len(corners) == sides[board.kind]
            centre = (
                sum(x for x, _ in corners) / len(corners),
                sum(y for _, y in corners) / len(corners),
            )
            assert centre == pytest.approx((drawn["x"], drawn["y"]), abs=1e-3)
        rows = {c.row for c in board.cells}
        cols = {c.label.rstrip("0123456789") for c in board.cells}
        texts = [c["text"] for c in body["coordinates"]]
        assert sorted(texts) == sorted([str(r + 1) for r in rows] + list(cols)), name
        x, y, w, h = body["view_box"]
        for c in body["cells"] + body["coordinates"]:
            assert x < c["x"] < x + w and y < c["y"] < y + h
    resp = await client.get("/api/boards/tri-4")  # a board no game is played on
    assert resp.status == 404 and "hex-3-5" in (await resp.json())["message"]


async def test_the_catalogue_has_every_game_option_and_bot(client: TestClient) -> None:
    assert (await client.post("/api/bots", json={"name": "outsider"})).status == 201
    body = await (await client.get("/api/catalogue")).json()
    assert [g["name"] for g in body["games"]] == game_names()
    for g in body["games"]:
        options = type(load_game(g["name"])).OPTIONS
        assert g["options"] == {k: list(v) for k, v in options.items()}
    built_in = [{"name": name, "kind": "built-in"} for name in bot_names()]
    assert body["bots"] == [*built_in, {"name": "outsider", "kind": "registered"}]
