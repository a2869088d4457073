"""Board topologies with Ludii's site numbering: cells, neighbours and steps per direction.

Every game sees its board as a graph whose sites are numbered exactly as Ludii numbers the
cells of `(board (...) use:Cell)`: lexicographic (row, col) with row 0 at the bottom, labels
`<column letter><row+1>` (RULES.md §0). The boards are generated here from their Ludii shape
name (`square-8`, `hex-3-5`, `hex-8`, `hex-triangle-5`, `tri-4`, `tri-hexagon-3`), never read
from files, and every table is a precomputed tuple so games can index it in hot loops. The
conformance dumps in `../shared/conformance/boards/` pin every field generated here.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Literal

BoardKind = Literal["square", "hex", "tri"]
Relation = Literal["orthogonal", "diagonal", "adjacent"]
RELATIONS: tuple[Relation, ...] = ("orthogonal", "diagonal", "adjacent")

#: Ludii's 16-point compass, clockwise from N; the Pattern walk turns on it (RULES.md §6).
COMPASS16 = (
    "N", "NNE", "NE", "ENE", "E", "ESE", "SE", "SSE",
    "S", "SSW", "SW", "WSW", "W", "WNW", "NW", "NNW",
)  # fmt: skip

_SQRT3 = math.sqrt(3.0)


@dataclass(frozen=True, slots=True)
class Cell:
    """One site: Ludii's index, label, (row, col), colour phase and centre (x, y)."""

    index: int
    label: str
    row: int
    col: int
    phase: int
    x: float
    y: float


#: per relation: (strict table, non-strict table), each direction -> neighbour per site or -1
_StepTables = dict[Relation, tuple[dict[str, tuple[int, ...]], dict[str, tuple[int, ...]]]]


class Board:
    """An immutable board graph; build one with `load_board(name)`."""

    name: str
    kind: BoardKind
    num_sites: int
    cells: tuple[Cell, ...]
    labels: tuple[str, ...]

    def __init__(
        self,
        name: str,
        kind: BoardKind,
        cells: Sequence[Cell],
        directions: Mapping[Relation, tuple[str, ...]],
        steps: _StepTables,
        neighbours: Mapping[Relation, tuple[tuple[int, ...], ...]],
    ) -> None:
        self.name = name
        self.kind = kind
        self.cells = tuple(cells)
        self.num_sites = len(self.cells)
        self.labels = tuple(c.label for c in self.cells)
        self._site_of = {label: i for i, label in enumerate(self.labels)}
        self._directions = dict(directions)
        self._steps = steps
        self._neighbours = dict(neighbours)

    def site(self, label: str) -> int:
        """The site index of a label such as `C4` (case-insensitive); `KeyError` if unknown."""
        try:
            return self._site_of[label.upper()]
        except KeyError:
            raise KeyError(f"{label!r} is not a cell of {self.name}") from None

    def directions(self, relation: Relation) -> tuple[str, ...]:
        """The board's supported directions for a relation, in Ludii's order."""
        return self._directions[relation]

    def neighbours(self, relation: Relation) -> tuple[tuple[int, ...], ...]:
        """Per site, its neighbours under `relation`, ascending."""
        return self._neighbours[relation]

    def step(self, relation: Relation, direction: str, strict: bool = False) -> tuple[int, ...]:
        """Per site, the neighbour in `direction` or -1.

        Non-strict is Ludii's `steps()` by absolute direction, which on triangular tilings can
        land on a corner neighbour (RULES.md §6); strict keeps only steps the cell supports.
        """
        strict_table, loose_table = self._steps[relation]
        table = strict_table if strict else loose_table
        try:
            return table[direction]
        except KeyError:
            raise KeyError(
                f"{direction!r} is not a {relation} direction of {self.name};"
                f" supported: {', '.join(self._directions[relation])}"
            ) from None

    def ray(self, relation: Relation, direction: str, site: int) -> tuple[int, ...]:
        """Ludii's radial: the sites straight on from `site` in one direction, to the edge.

        On every board here a (non-strict) step in a direction continues the same straight
        line, so Ludii's "smallest bend" choice is simply the next step; like Ludii's cycle
        guard, the ray stops before it would revisit a site.
        """
        table = self.step(relation, direction)
        ray: list[int] = []
        cur = table[site]
        while cur >= 0 and cur != site and cur not in ray:
            ray.append(cur)
            cur = table[cur]
        return tuple(ray)

    def render(self, values: Sequence[str]) -> str:
        """Draw one token per site as text, top row first, cells placed by their x centre.

        Hex rows sit half a cell apart so the picture looks hexagonal; a triangular tiling is
        drawn one strip per line, up and down triangles alternating.
        """
        if len(values) != self.num_sites:
            raise ValueError(f"{self.name} has {self.num_sites} sites, got {len(values)} values")
        width = max((len(v) for v in values), default=1)
        pitch = width + 1 + (width + 1) % 2  # even, so a half-cell offset is whole characters
        unit = {"square": 1.0, "hex": _SQRT3 / 2, "tri": 0.5}[self.kind]
        per_unit = pitch // 2 if self.kind == "hex" else pitch
        min_x = min(c.x for c in self.cells)
        lines: dict[int, list[tuple[int, str]]] = {}
        for cell, value in zip(self.cells, values, strict=True):
            pos = round((cell.x - min_x) / unit) * per_unit
            line = math.floor(cell.y / _TRI_H) if self.kind == "tri" else cell.row
            lines.setdefault(line, []).append((pos, value.rjust(width)))
        out = []
        for line in sorted(lines, reverse=True):
            text = ""
            for pos, token in sorted(lines[line]):
                text = text.ljust(pos) + token
            out.append(text.rstrip())
        return "\n".join(out)

    def __repr__(self) -> str:
        return f"load_board({self.name!r})"


# -- labels ---------------------------------------------------------------------------------


def column_letters(col: int) -> str:
    """A, B, ..., Z, AA, AB, ...: the column part of a label."""
    text = ""
    col += 1
    while col > 0:
        col, rem = divmod(col - 1, 26)
        text = chr(ord("A") + rem) + text
    return text


def _label(row: int, col: int) -> str:
    return f"{column_letters(col)}{row + 1}"


def _coord(v: float) -> float:
    # Ludii's dumps carry 4 decimals; adding 0.0 turns -0.0 into 0.0.
    return round(v, 4) + 0.0


# -- assembling a board from its links ------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Link:
    """A step from one cell to another: its compass direction and the relations it belongs to."""

    to: int
    direction: str
    relations: frozenset[Relation]


_ORTHO: frozenset[Relation] = frozenset({"orthogonal", "adjacent"})
_DIAG: frozenset[Relation] = frozenset({"diagonal", "adjacent"})
_OFF_DIAG: frozenset[Relation] = frozenset({"adjacent"})
#: hex diagonals are two cells away, so Ludii does not count them as adjacent
_FAR_DIAG: frozenset[Relation] = frozenset({"diagonal"})


def _assemble(
    name: str, kind: BoardKind, cells: Sequence[Cell], links: Sequence[list[_Link]]
) -> Board:
    """Derive every table from the links, the way Ludii's `Trajectories` does.

    A relation's supported directions are those any of its links uses, in compass order. The
    strict step keeps links of that relation; the non-strict one takes any cell link in the
    direction, as `steps(type, site, dirn)` does, which is what the Pattern walk sees.
    """
    n = len(cells)
    directions: dict[Relation, tuple[str, ...]] = {}
    steps: _StepTables = {}
    neighbours: dict[Relation, tuple[tuple[int, ...], ...]] = {}
    for relation in RELATIONS:
        used = {lk.direction for site in links for lk in site if relation in lk.relations}
        dirs = tuple(d for d in COMPASS16 if d in used)
        strict = {d: [-1] * n for d in dirs}
        loose = {d: [-1] * n for d in dirs}
        for s, site in enumerate(links):
            for lk in site:
                if lk.direction in loose:
                    loose[lk.direction][s] = lk.to
                    if relation in lk.relations:
                        strict[lk.direction][s] = lk.to
        directions[relation] = dirs
        steps[relation] = (
            {d: tuple(t) for d, t in strict.items()},
            {d: tuple(t) for d, t in loose.items()},
        )
        neighbours[relation] = tuple(
            tuple(sorted(lk.to for lk in site if relation in lk.relations)) for site in links
        )
    return Board(name, kind, cells, directions, steps, neighbours)


# -- square and hex lattices: directions are fixed (drow, dcol) offsets -------------------

_SQUARE_STEPS: tuple[tuple[str, tuple[int, int], frozenset[Relation]], ...] = (
    ("N", (1, 0), _ORTHO),
    ("E", (0, 1), _ORTHO),
    ("S", (-1, 0), _ORTHO),
    ("W", (0, -1), _ORTHO),
    ("NE", (1, 1), _DIAG),
    ("SE", (-1, 1), _DIAG),
    ("SW", (-1, -1), _DIAG),
    ("NW", (1, -1), _DIAG),
)

_HEX_STEPS: tuple[tuple[str, tuple[int, int], frozenset[Relation]], ...] = (
    ("NNE", (1, 1), _ORTHO),
    ("E", (0, 1), _ORTHO),
    ("SSE", (-1, 0), _ORTHO),
    ("SSW", (-1, -1), _ORTHO),
    ("W", (0, -1), _ORTHO),
    ("NNW", (1, 0), _ORTHO),
    # a hex "diagonal" is the cell beyond the edge between two neighbours (RULES.md §0)
    ("N", (2, 1), _FAR_DIAG),
    ("ENE", (1, 2), _FAR_DIAG),
    ("ESE", (-1, 1), _FAR_DIAG),
    ("S", (-2, -1), _FAR_DIAG),
    ("WSW", (-1, -2), _FAR_DIAG),
    ("WNW", (1, -1), _FAR_DIAG),
)


def _lattice_board(
    name: str,
    kind: BoardKind,
    coords: Iterable[tuple[int, int]],
    place: Callable[[int, int], tuple[float, float, int]],
) -> Board:
    """Number the cells lexicographically by (row, col) and link them by fixed offsets."""
    ordered = sorted(set(coords))
    index = {rc: i for i, rc in enumerate(ordered)}
    cells = []
    for i, (row, col) in enumerate(ordered):
        x, y, phase = place(row, col)
        cells.append(Cell(i, _label(row, col), row, col, phase, _coord(x), _coord(y)))
    offsets = _SQUARE_STEPS if kind == "square" else _HEX_STEPS
    links = [
        [
            _Link(index[(r + dr, c + dc)], d, rels)
            for d, (dr, dc), rels in offsets
            if (r + dr, c + dc) in index
        ]
        for r, c in ordered
    ]
    return _assemble(name, kind, cells, links)


# -- square and hex shapes ------------------------------------------------------------------


def square_board(n: int) -> Board:
    """`(square n)`: index = row*n + col, unit cells centred on half-integers."""
    coords = ((r, c) for r in range(n) for c in range(n))
    return _lattice_board(
        f"square-{n}", "square", coords, lambda r, c: (c + 0.5, r + 0.5, (r + c) % 2)
    )


def hex_board(a: int, b: int | None = None) -> Board:
    """`(hex n)` or `(hex a b)`: pointy-top hexagons in axial (row, col) (RULES.md §0).

    Ludii builds the regular hexagon around (0, 0) of A1 and the unequal one with its top row
    at y = 0 and a mirrored phase order; both are reproduced as dumped.
    """
    if b is None or b == a:
        n = a
        size = 2 * n - 1
        coords = [(r, c) for r in range(size) for c in range(size) if -(n - 1) <= c - r <= n - 1]
        return _lattice_board(
            f"hex-{n}", "hex", coords, lambda r, c: (_SQRT3 * (c - r / 2), 1.5 * r, (r + c) % 3)
        )
    top = a + b - 2
    coords = [(r, c) for r in range(top + 1) for c in range(top + 1) if -(a - 1) <= c - r <= b - 1]

    def place(r: int, c: int) -> tuple[float, float, int]:
        return _SQRT3 * (c - r / 2 - (b - a) / 2), 1.5 * (r - top), -(r + c) % 3

    return _lattice_board(f"hex-{a}-{b}", "hex", coords, place)


def hex_triangle_board(n: int) -> Board:
    """`(hex Triangle n)`: hexagons with 0 <= row <= col <= n-1, row lengths n, n-1, ..., 1."""
    coords = [(r, c) for r in range(n) for c in range(r, n)]
    return _lattice_board(
        f"hex-triangle-{n}",
        "hex",
        coords,
        lambda r, c: (_SQRT3 * (c - r / 2), 1.5 * r, -(r + c) % 3),
    )


# -- triangular tilings: faces linked by Ludii's `Face.stepsTo` rules ----------------------

_TRI_H = _SQRT3 / 2  # height of a unit triangle

#: a lattice point (k, j) of the triangular grid, at (j + k/2, k*h)
_Point = tuple[int, int]


def _tri_xy(p: _Point) -> tuple[float, float]:
    return p[1] + p[0] / 2, p[0] * _TRI_H


def _distance_to_line(
    p: tuple[float, float], a: tuple[float, float], b: tuple[float, float]
) -> float:
    (px, py), (ax, ay), (bx, by) = p, a, b
    return abs((bx - ax) * (py - ay) - (by - ay) * (px - ax)) / math.hypot(bx - ax, by - ay)


def _compass(a: tuple[float, float], b: tuple[float, float]) -> str:
    """The 16-point compass direction from a to b, as Ludii's `mapAngleToAbsoluteDirection`."""
    sector = round(math.degrees(math.atan2(b[1] - a[1], b[0] - a[0])) / 22.5)
    return COMPASS16[(4 - sector) % 16]


def _tri_board(name: str, size: int, inside: Callable[[float, float], bool]) -> Board:
    """The unit triangles whose centres lie inside a shape, numbered and linked as Ludii does."""
    found: list[tuple[tuple[_Point, _Point, _Point], int]] = []
    for k in range(-2 * size, 2 * size + 1):
        for i in range(-2 * size, 2 * size + 1):
            up = ((k, i), (k, i + 1), (k + 1, i))
            down = ((k + 1, i), (k + 1, i + 1), (k, i + 1))
            found.extend(
                (tri, phase) for phase, tri in enumerate((up, down)) if inside(*_centre(tri))
            )
    # Ludii's rows and columns are the ranks of the distinct centre heights and abscissae.
    ys = sorted({round(_centre(tri)[1], 6) for tri, _ in found})
    xs = sorted({round(_centre(tri)[0], 6) for tri, _ in found})

    def row_col(tri: tuple[_Point, _Point, _Point]) -> tuple[int, int]:
        x, y = _centre(tri)
        return ys.index(round(y, 6)), xs.index(round(x, 6))

    found.sort(key=lambda item: row_col(item[0]))
    faces = [tri for tri, _ in found]
    cells = []
    for i, (tri, phase) in enumerate(found):
        (r, c), (x, y) = row_col(tri), _centre(tri)
        cells.append(Cell(i, _label(r, c), r, c, phase, _coord(x), _coord(y)))
    return _assemble(name, "tri", cells, _face_links(faces))


def _centre(tri: tuple[_Point, _Point, _Point]) -> tuple[float, float]:
    points = [_tri_xy(p) for p in tri]
    return sum(x for x, _ in points) / 3, sum(y for _, y in points) / 3


def _face_links(faces: Sequence[tuple[_Point, _Point, _Point]]) -> list[list[_Link]]:
    """Ludii's `Face.stepsTo`, in its order: edge neighbours are orthogonal; through each corner
    the face whose centre line passes closest to the corner is diagonal (the opposite one, or
    the nearest substitute on the rim); the other corner neighbours are "off-diagonal", adjacent
    only; then the hex-style diagonals through trivalent corners. Triangle tilings never tie
    for the closest centre line, so the order Ludii lists a corner's faces in does not matter.
    """
    centres = [_centre(tri) for tri in faces]
    edge_faces: dict[frozenset[_Point], list[int]] = {}
    vertex_faces: dict[_Point, list[int]] = {}
    vertex_edges: dict[_Point, set[_Point]] = {}
    for f, tri in enumerate(faces):
        for a, b in ((tri[0], tri[1]), (tri[1], tri[2]), (tri[2], tri[0])):
            edge_faces.setdefault(frozenset((a, b)), []).append(f)
            vertex_edges.setdefault(a, set()).add(b)
            vertex_edges.setdefault(b, set()).add(a)
        for p in tri:
            vertex_faces.setdefault(p, []).append(f)
    links: list[list[_Link]] = []
    for f, tri in enumerate(faces):
        here = centres[f]
        used = {f}
        out: list[tuple[int, frozenset[Relation]]] = []
        for a, b in ((tri[0], tri[1]), (tri[1], tri[2]), (tri[2], tri[0])):
            for g in edge_faces[frozenset((a, b))]:
                if g not in used:
                    used.add(g)
                    out.append((g, _ORTHO))
        for p in tri:
            candidates = [g for g in vertex_faces[p] if g not in used]
            if candidates:
                best = min(
                    candidates, key=lambda g: _distance_to_line(_tri_xy(p), here, centres[g])
                )
                used.add(best)
                out.append((best, _DIAG))
        for p in tri:
            for g in vertex_faces[p]:
                if g not in used:
                    used.add(g)
                    out.append((g, _OFF_DIAG))
        out.extend(_far_diagonals(tri, here, centres, vertex_faces, vertex_edges, used))
        links.append([_Link(g, _compass(here, centres[g]), rels) for g, rels in out])
    return links


def _far_diagonals(
    tri: tuple[_Point, _Point, _Point],
    here: tuple[float, float],
    centres: Sequence[tuple[float, float]],
    vertex_faces: Mapping[_Point, list[int]],
    vertex_edges: Mapping[_Point, set[_Point]],
    used: set[int],
) -> list[tuple[int, frozenset[Relation]]]:
    """Ludii's hex-style diagonals through a trivalent corner: faces beyond the edge leading
    away from this triangle, kept when that edge lies along the line between the centres."""
    out: list[tuple[int, frozenset[Relation]]] = []
    for p in tri:
        if len(vertex_edges[p]) != 3:
            continue
        away = [q for q in vertex_edges[p] if q not in tri]
        if not away:
            continue
        q = away[0]
        for g in vertex_faces[q]:
            if g in used:
                continue
            there = centres[g]
            error = (
                _distance_to_line(_tri_xy(p), here, there)
                + _distance_to_line(_tri_xy(q), here, there)
            ) / math.dist(here, there)
            if error <= 0.1:
                used.add(g)
                out.append((g, _FAR_DIAG))
    return out


def tri_board(n: int) -> Board:
    """`(tri n)`: a triangle of side n cut into n*n unit triangles, apex up."""

    def inside(x: float, y: float) -> bool:
        return y > 0 and y < _SQRT3 * x and y < _SQRT3 * (n - x)

    return _tri_board(f"tri-{n}", n, inside)


def tri_hexagon_board(n: int) -> Board:
    """`(tri Hexagon n)`: a hexagon of side n cut into 6*n*n unit triangles, bottom edge [0, n]."""
    cx, cy = n / 2, n * _TRI_H

    def inside(x: float, y: float) -> bool:
        return abs(y - cy) < n * _TRI_H and _SQRT3 * abs(x - cx) + abs(y - cy) < _SQRT3 * n

    return _tri_board(f"tri-hexagon-{n}", n, inside)


# -- the registry of shapes -----------------------------------------------------------------

_SHAPES: tuple[tuple[re.Pattern[str], Callable[..., Board]], ...] = (
    (re.compile(r"square-(\d+)"), square_board),
    (re.compile(r"hex-triangle-(\d+)"), hex_triangle_board),
    (re.compile(r"hex-(\d+)-(\d+)"), hex_board),
    (re.compile(r"hex-(\d+)"), hex_board),
    (re.compile(r"tri-hexagon-(\d+)"), tri_hexagon_board),
    (re.compile(r"tri-(\d+)"), tri_board),
)

BOARD_SHAPES = ("square-N", "hex-A-B", "hex-N", "hex-triangle-N", "tri-N", "tri-hexagon-N")


@cache
def load_board(name: str) -> Board:
    """The board for a shape name, built once: `square-8`, `hex-3-5`, `hex-8`, ..."""
    for pattern, build in _SHAPES:
        m = pattern.fullmatch(name)
        if m:
            sizes = [int(g) for g in m.groups()]
            if min(sizes) < 1 or max(sizes) > 60:
                break
            if build is hex_board and len(sizes) == 2 and sizes[0] == sizes[1]:
                return load_board(f"hex-{sizes[0]}")  # (hex n n) is (hex n)
            return build(*sizes)
    raise ValueError(f"unknown board {name!r}; accepted shapes: {', '.join(BOARD_SHAPES)}")
