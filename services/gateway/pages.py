"""The web page: its HTML shell, its static files, and the data only the page needs.

The page is plain ES modules, CSS and SVG in `web/` beside this module, served as they
are (no build step). `/` (the lobby) and `/games/{id}` (a board) are the same HTML shell;
the page routes itself. Besides the game API it reads two things of its own:

- `GET /api/boards/{name}`: a board's geometry for drawing, from the engine's cells:
  each cell's outline as an SVG polygon (unit squares, pointy-top hexagons of radius 1,
  unit triangles), the coordinates written on the edge, and the view box. Drawing
  coordinates have y downward (the engine's y, which grows upward, negated). Only the
  boards some game plays on are served: each is built once and kept.
- `GET /api/catalogue`: every game with its options (default first) and every bot a
  seat can take, built in or registered, for the new-game form.
"""

from __future__ import annotations

import functools
import itertools
import math
from pathlib import Path

from aiohttp import web

from bots.base import bot_names
from engine import game_names, load_game
from engine.boards import Board, Cell, load_board
from schemas.api import (
    BoardBody,
    BoardCellBody,
    BoardLabelBody,
    BotBody,
    CatalogueBody,
    GameRulesBody,
)
from schemas.tournaments import TOURNAMENT_ID_RE
from schemas.wording import words_module
from services.gateway import appkeys
from services.gateway.http import ApiError, respond

WEB = Path(__file__).resolve().parent / "web"
#: What the page is made of, by file extension.
CONTENT_TYPES = {".html": "text/html", ".js": "text/javascript", ".css": "text/css"}
#: The module of result wordings, written from `schemas.wording`.
WORDS = "words.js"
_NO_CACHE = {"Cache-Control": "no-cache"}
#: Registered bots offered to a seat, at most (the form is no directory).
MAX_REGISTERED = 200

_SQRT3 = math.sqrt(3.0)
_TRI_H = _SQRT3 / 2
#: How far beyond the edge cells, in steps of the lattice, the coordinates are written.
_LABEL_STEP = 0.78


# -- the page ------------------------------------------------------------------------------
def _shell() -> web.FileResponse:
    return web.FileResponse(WEB / "index.html", headers={"Content-Type": "text/html", **_NO_CACHE})


async def lobby_page(request: web.Request) -> web.FileResponse:
    return _shell()


async def game_page(request: web.Request) -> web.FileResponse:
    """A board at any `?ply=`: the page shows a malformed or too high one as the last ply,
    with a note, and reads the game itself (saying so if there is none)."""
    return _shell()


async def tournaments_page(request: web.Request) -> web.FileResponse:
    """The tournament list, one tournament (`/tournaments/{id}`), or the leaderboards
    (`/leaderboards`): the same shell, routed in the page."""
    tid = request.match_info.get("id")
    if tid is not None and not TOURNAMENT_ID_RE.fullmatch(tid):
        raise ApiError("not_found", f"{tid!r} is no tournament id")
    return _shell()


async def asset(request: web.Request) -> web.StreamResponse:
    """One file of `web/`; nothing outside it, nothing but the page's own kinds of file.
    `words.js` is written from `schemas.wording`, the words the command line uses too."""
    name = request.match_info["name"]
    if name == WORDS:
        return web.Response(text=words_module(), content_type="text/javascript", headers=_NO_CACHE)
    path = WEB / name
    kind = CONTENT_TYPES.get(path.suffix)
    if kind is None or "/" in name or name.startswith(".") or not path.is_file():
        raise ApiError("not_found", f"the page has no file {name!r}")
    return web.FileResponse(path, headers={"Content-Type": kind, **_NO_CACHE})


# -- boards --------------------------------------------------------------------------------
@functools.cache
def game_boards() -> frozenset[str]:
    """Every board some game plays on, over every combination of its options."""
    names: set[str] = set()
    for name in game_names():
        options = type(load_game(name)).OPTIONS
        for values in itertools.product(*options.values()):
            names.add(load_game(name, **dict(zip(options, values, strict=True))).board.name)
    return frozenset(names)


async def board(request: web.Request) -> web.Response:
    name = request.match_info["name"]
    if name not in game_boards():
        known = ", ".join(sorted(game_boards()))
        raise ApiError("not_found", f"no game is played on a board {name!r}; boards: {known}")
    return respond(request, board_geometry(name).model_dump())


@functools.cache
def board_geometry(name: str) -> BoardBody:
    """The drawing of a board: cells, coordinates on the edge, and the box holding both."""
    b = load_board(name)
    cells = [
        BoardCellBody(
            index=c.index, label=c.label, row=c.row, col=c.col, phase=c.phase,
            x=c.x, y=_flip(c.y), points=_points(_outline(b, c)),
        )
        for c in b.cells
    ]  # fmt: skip
    labels = _coordinates(b)
    xs = [x for c in b.cells for x, _ in _outline(b, c)] + [lab.x for lab in labels]
    ys = [y for c in b.cells for _, y in _outline(b, c)] + [lab.y for lab in labels]
    margin = 0.45
    box = (
        _round(min(xs) - margin),
        _round(min(ys) - margin),
        _round(max(xs) - min(xs) + 2 * margin),
        _round(max(ys) - min(ys) + 2 * margin),
    )
    return BoardBody(name=b.name, kind=b.kind, cells=cells, coordinates=labels, view_box=box)


def _round(v: float) -> float:
    return round(v, 4) + 0.0  # + 0.0: no -0.0


def _flip(y: float) -> float:
    return _round(-y)


def _points(corners: list[tuple[float, float]]) -> str:
    return " ".join(f"{x:g},{y:g}" for x, y in corners)


def _outline(b: Board, c: Cell) -> list[tuple[float, float]]:
    """The cell's corners in drawing coordinates (y downward)."""
    if b.kind == "square":
        offsets = [(-0.5, -0.5), (0.5, -0.5), (0.5, 0.5), (-0.5, 0.5)]
    elif b.kind == "hex":  # pointy top, radius 1: neighbours sqrt(3) apart in a row
        offsets = [
            (math.cos(math.radians(a)), math.sin(math.radians(a))) for a in range(-90, 270, 60)
        ]
    else:  # a unit triangle: phase 0 points up, phase 1 down (in the engine's y)
        up = 1 if c.phase == 0 else -1
        offsets = [(-0.5, up * _TRI_H / 3), (0.5, up * _TRI_H / 3), (0.0, -up * 2 * _TRI_H / 3)]
    return [(_round(c.x + dx), _round(-c.y + dy)) for dx, dy in offsets]


def _coordinates(b: Board) -> list[BoardLabelBody]:
    """Column letters below each column's lowest cell and row numbers left of each row's
    first cell, one lattice step on (on a hex board columns run up and to the left, so
    their letters follow the lower and lower-right edges). A triangular tiling has no
    lattice steps: its letters go under the board and its numbers to the left."""
    by_rc = {(c.row, c.col): c for c in b.cells}
    first_in_row: dict[int, Cell] = {}
    lowest_in_col: dict[int, Cell] = {}
    for c in b.cells:  # in (row, col) order: the first seen is the lowest, the leftmost
        first_in_row.setdefault(c.row, c)
        lowest_in_col.setdefault(c.col, c)
    down = _lattice_step(by_rc, -1, 0)
    left = _lattice_step(by_rc, 0, -1)
    if b.kind == "tri" or down is None or left is None:
        bottom = min(c.y for c in b.cells) - 0.9
        down_at = {col: (c.x, bottom) for col, c in lowest_in_col.items()}
        left_at = {row: (c.x - 1.0, c.y) for row, c in first_in_row.items()}
    else:
        down_at = {
            col: (c.x + _LABEL_STEP * down[0], c.y + _LABEL_STEP * down[1])
            for col, c in lowest_in_col.items()
        }
        left_at = {
            row: (c.x + _LABEL_STEP * left[0], c.y + _LABEL_STEP * left[1])
            for row, c in first_in_row.items()
        }
    letters = [
        BoardLabelBody(text=_column_of(lowest_in_col[col]), x=_round(x), y=_flip(y))
        for col, (x, y) in sorted(down_at.items())
    ]
    numbers = [
        BoardLabelBody(text=str(row + 1), x=_round(x), y=_flip(y))
        for row, (x, y) in sorted(left_at.items())
    ]
    return letters + numbers


def _column_of(c: Cell) -> str:
    return c.label.rstrip("0123456789")


def _lattice_step(
    by_rc: dict[tuple[int, int], Cell], drow: int, dcol: int
) -> tuple[float, float] | None:
    """The engine's (dx, dy) from a cell to its lattice neighbour (row+drow, col+dcol)."""
    for (row, col), c in by_rc.items():
        other = by_rc.get((row + drow, col + dcol))
        if other is not None:
            return other.x - c.x, other.y - c.y
    return None


# -- what a new game can be ----------------------------------------------------------------
@functools.cache
def game_rules() -> list[GameRulesBody]:
    out = []
    for name in game_names():
        options = type(load_game(name)).OPTIONS
        title = name.replace("-", " ").title()
        out.append(
            GameRulesBody(name=name, title=title, options={k: list(v) for k, v in options.items()})
        )
    return out


async def catalogue(request: web.Request) -> web.Response:
    built_in = bot_names()
    registered = await request.app[appkeys.BOT_REGISTRY].names(MAX_REGISTERED, skip=built_in)
    bots = [BotBody(name=n, kind="built-in") for n in built_in] + [
        BotBody(name=n, kind="registered") for n in sorted(registered)
    ]
    body = CatalogueBody(games=game_rules(), bots=bots)
    return respond(request, body.model_dump())
