"""The one contract every game implements: moves, states, outcomes and the registry.

A game is a `Game` (its options and board, immutable) that makes `State`s. A state
offers two paths: the checked one for user input (`legal_moves`, `apply`, with
`Move` values and notation) and the unchecked one for search and playouts
(`legal_actions`, `apply_action`, with small ints). Actions are per-game integer
codes; `Game.move_of` / `Game.action_of` translate between the two, and sorting by
action gives the deterministic order of `legal_moves`.

Players are colours 1 and 2, as in Ludii. Only Hexade's swap makes a seat differ
from a colour; `State.seat_of` says which seat holds a colour.

The registry (`register`, `load_game`, `game_names`) lives here as a plain dict that the
game modules fill with `@register` when they are imported. This module imports no game:
the `engine` package imports `engine.games` at its top, and Python runs the package's
`__init__` before any of its modules, so the built-in games are registered before anyone
can call `load_game`. Nothing here imports anything that imports this module back.
"""

from __future__ import annotations

import enum
import functools
import re
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, Protocol

from engine.boards import Board

SNAPSHOT_VERSION = 1

#: Ludii's global limits (`Game.maxTurns`/`maxMoves` defaults): 1250 turns per player
#: or 10,000 moves, after which the game ends as a draw. The one move limit of every game
#: and of the batched engines: a state whose `ply` reaches it ends by `EndRule.MOVE_LIMIT`.
MAX_PLIES = 2500

MoveKind = Literal["place", "remove", "step", "sow", "pass", "swap"]
SOW_DIRECTIONS = ("N", "NE", "E", "SE", "S", "SW", "W", "NW")


class InvalidMoveError(ValueError):
    """The text is not a move of this game at all (bad notation, unknown cell)."""


class IllegalMoveError(ValueError):
    """The move is well-formed but the position does not allow it."""


_CELL = r"[A-Za-z]{1,2}[0-9]{1,3}"
_MOVE_RE = re.compile(
    rf"^(?:(?P<remove>[xX])(?P<rcell>{_CELL})"
    rf"|(?P<from>{_CELL})-(?P<to>{_CELL})"
    rf"|(?P<sfrom>{_CELL})>(?P<dir>[A-Za-z]{{1,2}})"
    rf"|(?P<place>{_CELL}))$"
)


@dataclass(frozen=True, slots=True, order=True)
class Move:
    """One move in Agon notation (RULES.md §9): `C4`, `xC4`, `C4-D5`, `C4>NE`, `pass`, `swap`.

    Cells are Ludii labels; a `Move` knows nothing of boards, the game resolves it.
    """

    kind: MoveKind
    cell: str = ""
    to: str = ""
    direction: str = ""

    @staticmethod
    def parse(text: str) -> Move:
        """Parse notation case-insensitively; raise `InvalidMoveError` if it is none."""
        return _parse_move(text)

    def __str__(self) -> str:
        if self.kind in ("pass", "swap"):
            return self.kind
        if self.kind == "remove":
            return f"x{self.cell}"
        if self.kind == "step":
            return f"{self.cell}-{self.to}"
        if self.kind == "sow":
            return f"{self.cell}>{self.direction}"
        return self.cell

    def __repr__(self) -> str:
        return f"Move.parse({str(self)!r})"


# Moves are immutable and a game has few distinct texts, while the engine service parses
# every command's move: known texts skip the regular expression.
@functools.lru_cache(maxsize=4096)
def _parse_move(text: str) -> Move:
    t = text.strip()
    low = t.lower()
    if low in ("pass", "swap"):
        return Move(low)  # type: ignore[arg-type]
    m = _MOVE_RE.match(t)
    if m is None:
        raise InvalidMoveError(f"not a move: {text!r}")
    if m["remove"]:
        return Move("remove", m["rcell"].upper())
    if m["from"]:
        return Move("step", m["from"].upper(), m["to"].upper())
    if m["sfrom"]:
        d = m["dir"].upper()
        if d not in SOW_DIRECTIONS:
            raise InvalidMoveError(f"not a move: {text!r} (unknown direction {d})")
        return Move("sow", m["sfrom"].upper(), direction=d)
    return Move("place", m["place"].upper())


class EndRule(enum.StrEnum):
    """The rule that ended a game (`Outcome.reason`, `State.reason`): one member per end.

    A `StrEnum`, so a member equals, formats and serialises (JSON, msgpack) as its text:
    logs, events and golden files read exactly as they did when reasons were strings.
    """

    #: Supply Chains: the player who just moved was stalemated (a forced pass)
    NO_MOVES = "no-moves"
    #: Supply Chains (Passing variant), Supplier Sabotage: each player's last turn was a pass
    ALL_PASSED = "all-passed"
    #: Overflow: a house has no occupied square left
    HOUSE_EMPTIED = "house-emptied"
    #: Teeko: 4 markers in a line; Hexade: 6 stones in a row
    LINE = "line"
    #: Teeko: a 2x2 square of markers
    SQUARE = "square"
    #: Hexade: the ring of 6 stones around a centre cell
    RING = "ring"
    #: Hexade: the perimeter of a side-3 triangle (6 stones)
    TRIANGLE = "triangle"
    #: every game: `MAX_PLIES` plies were played (a draw)
    MOVE_LIMIT = "move-limit"

    @classmethod
    def from_text(cls, text: object) -> EndRule | None:
        """A snapshot's `reason`: "" (the game goes on) is None; an unknown text raises."""
        value = str(text)
        return cls(value) if value else None


def reason_text(reason: EndRule | None) -> str:
    """A state's `reason` as plain text for snapshots: the rule's text, "" while it goes on."""
    return str(reason) if reason is not None else ""


@dataclass(frozen=True, slots=True, repr=False)
class Outcome:
    """How a game ended: `winner` is a colour (1, 2) or 0 for a draw.

    `reason` is the `EndRule` that ended it; a plain text naming a rule is converted, any
    other text raises `ValueError`.
    """

    winner: int
    scores: tuple[int, int] | None
    reason: EndRule

    def __post_init__(self) -> None:
        object.__setattr__(self, "reason", EndRule(self.reason))

    def to_dict(self) -> dict[str, Any]:
        return {
            "winner": self.winner,
            "scores": list(self.scores) if self.scores is not None else None,
            "reason": str(self.reason),
        }

    def __repr__(self) -> str:
        # As the dataclass wrote it when `reason` was a str: golden files and logs keep it.
        return (
            f"Outcome(winner={self.winner!r}, scores={self.scores!r}, reason={str(self.reason)!r})"
        )


class Display(Protocol):
    """What a game draws beyond the pieces (the chains games' surplus display).

    Read models store `to_dict()`: JSON-able, cells named by their labels.
    """

    def to_dict(self) -> dict[str, Any]: ...


class State(ABC):
    """A position. Mutable: `apply` changes it in place; `clone` copies it."""

    game: Game
    ply: int
    #: the colour (1 or 2) to move
    mover: int
    #: the rule that ended the game (`Outcome.reason`), None while it goes on
    reason: EndRule | None

    # -- the unchecked path: ints, no validation ---------------------------------
    @abstractmethod
    def legal_actions(self) -> list[int]:
        """Legal action codes, ascending; empty when terminal."""

    @abstractmethod
    def apply_action(self, action: int) -> None:
        """Play a legal action without checking it."""

    def is_legal(self, action: int) -> bool:
        """Whether `action` is among `legal_actions()`; games answer it without listing them.

        The checked path asks this once per move, where only one action matters: a game
        whose legal list is costly overrides it with an exactly equivalent single check.
        """
        return action in self.legal_actions()

    @abstractmethod
    def clone(self) -> State: ...

    # -- game facts ----------------------------------------------------------------
    @property
    def current_player(self) -> int:
        """The colour (1 or 2) to move."""
        return self.mover

    @property
    def is_terminal(self) -> bool:
        return self.reason is not None

    @abstractmethod
    def outcome(self) -> Outcome | None:
        """The result, or None while the game goes on."""

    @abstractmethod
    def scores(self) -> tuple[int, int] | None:
        """Ludii's scores for colours 1 and 2, or None for games without scores."""

    @abstractmethod
    def board_string(self) -> str:
        """The board as the conformance data writes it: one char per site, or Overflow heights."""

    @abstractmethod
    def to_dict(self) -> dict[str, Any]:
        """A compact JSON-able snapshot; `Game.state_from_dict` reads it back."""

    def display(self) -> Display | None:
        """What the game shows beyond the pieces, or None for a game that shows nothing more.

        Supply Chains and Supplier Sabotage return their surplus display (chains, their
        warehouses, the suppliers around them, deficit warehouses and the value on each
        piece); the other games return None. Callers store `display().to_dict()`.
        """
        return None

    def snapshot_header(self) -> dict[str, Any]:
        """The fields every snapshot starts with; `Game.check_snapshot` checks them."""
        return {
            "version": SNAPSHOT_VERSION,
            "game": self.game.name,
            "options": dict(self.game.options),
            "ply": self.ply,
        }

    def seat_of(self, colour: int) -> int:
        """The seat (1 or 2) holding `colour`; only Hexade's swap exchanges them."""
        return colour

    @property
    def seat_to_move(self) -> int:
        """The seat (1 or 2) to move, or 0 once the game is over."""
        return 0 if self.is_terminal else self.seat_of(self.current_player)

    def seat_colours(self) -> list[int]:
        """The colour each seat holds, seat 1 first: `[1, 2]`, or `[2, 1]` after a swap."""
        return [1, 2] if self.seat_of(1) == 1 else [2, 1]

    # -- the checked path: Move values and notation --------------------------------
    def legal_moves(self) -> list[Move]:
        move_of = self.game.move_of
        return [move_of(a) for a in self.legal_actions()]

    def apply(self, move: Move | str) -> None:
        """Play a move given as `Move` or text; raise if it is invalid or illegal here."""
        m = Move.parse(move) if isinstance(move, str) else move
        self.apply_legal(self.game.action_of(m), m)

    def apply_legal(self, action: int, move: Move | str | None = None) -> None:
        """Play an action code if it is legal here, else `IllegalMoveError` naming `move`."""
        if not self.is_legal(action):
            raise IllegalMoveError(
                f"illegal move {move or self.game.move_of(action)} at ply {self.ply}"
                f" for player {self.current_player} in {self.game.name}"
                f" position {self.board_string()!r}"
            )
        self.apply_action(action)

    def render(self) -> str:
        """The board as text rows, top row first, for terminals and golden files."""
        text = self.board_string()
        return self.game.board.render(text.split(",") if "," in text else list(text))


class Game(ABC):
    """A game with fixed options. Subclasses set `name` and `OPTIONS` and build the board."""

    name: ClassVar[str]
    #: option name -> accepted values, default first (RULES.md §8)
    OPTIONS: ClassVar[Mapping[str, tuple[str, ...]]] = {}

    board: Board
    options: dict[str, str]

    def __init__(self, **options: object) -> None:
        self.options = resolve_options(self.name, self.OPTIONS, options)

    @abstractmethod
    def new_initial_state(self) -> State: ...

    @abstractmethod
    def move_of(self, action: int) -> Move:
        """The Move for an action code of this game."""

    @abstractmethod
    def action_of(self, move: Move) -> int:
        """The action code for a Move; `InvalidMoveError` if the game has no such move."""

    @abstractmethod
    def state_from_dict(self, data: Mapping[str, Any]) -> State: ...

    def check_snapshot(self, data: Mapping[str, Any]) -> None:
        """Refuse a snapshot of another game, version or option set, naming what it holds."""
        if data.get("version") != SNAPSHOT_VERSION or data.get("game") != self.name:
            raise ValueError(
                f"not a {self.name} snapshot of version {SNAPSHOT_VERSION}:"
                f" game={data.get('game')!r} version={data.get('version')!r}"
            )
        if dict(data.get("options", {})) != self.options:
            raise ValueError(f"snapshot options {data.get('options')} differ from {self.options}")

    def snapshot_board(self, data: Mapping[str, Any]) -> str:
        """Check a snapshot's header and its board (`.`, `1`, `2` per site); return the board."""
        self.check_snapshot(data)
        text = str(data["board"])
        if len(text) != self.board.num_sites or set(text) - set(".12"):
            raise ValueError(f"snapshot board {text!r} does not fit {self.board.name}")
        return text

    def site(self, label: str) -> int:
        """The site index of a cell label, or `InvalidMoveError`."""
        try:
            return self.board.site(label)
        except KeyError:
            raise InvalidMoveError(f"{label} is not a cell of {self.board.name}") from None

    def spec(self) -> dict[str, Any]:
        return {"game": self.name, "options": dict(self.options)}

    def __repr__(self) -> str:
        opts = ", ".join(f"{k}={v!r}" for k, v in self.options.items())
        return f"load_game({self.name!r}{', ' if opts else ''}{opts})"


def resolve_options(
    game: str, accepted: Mapping[str, tuple[str, ...]], given: Mapping[str, object]
) -> dict[str, str]:
    """Fill defaults and check names and values; the error lists what is accepted."""
    for key in given:
        if key not in accepted:
            names = ", ".join(accepted) or "none"
            raise ValueError(f"{game} has no option {key!r}; accepted: {names}")
    out: dict[str, str] = {}
    for key, values in accepted.items():
        value = str(given.get(key, values[0]))
        if value not in values:
            raise ValueError(f"{game} option {key}={value!r} is not one of {', '.join(values)}")
        out[key] = value
    return out


_REGISTRY: dict[str, Callable[..., Game]] = {}


def register(cls: type[Game]) -> type[Game]:
    """Class decorator adding a game to the registry under its `name`."""
    _REGISTRY[cls.name] = cls
    return cls


def game_names() -> list[str]:
    """The registered games' names, sorted (the `engine` package registers the built-ins)."""
    return sorted(_REGISTRY)


def load_game(name: str, **options: object) -> Game:
    """The one registry: `load_game("supply-chains", board="square-8")`."""
    try:
        factory = _REGISTRY[name]
    except KeyError:
        raise ValueError(
            f"unknown game {name!r}; accepted: {', '.join(sorted(_REGISTRY))}"
        ) from None
    return factory(**options)
