"""What the API shows of a game: the projector's view, plus the board cell by cell.

The gateway folds a game's log itself (`GameStates`, an LRU of folds advanced from the
log's tail on each read), so a view read right after a move was accepted already shows
that move: the projector's read models serve the game list, where lag is harmless. A
view at an earlier ply (`?ply=N`, replay) is a fresh fold of the log up to that ply.

The board is listed cell by cell from the engine's geometry: each cell's label and
contents (the colour of its piece; Overflow's stack height and the house it belongs to),
and per game what Ludii shows beside the board: Teeko's hands, and for Supply Chains and
Supplier Sabotage every chain with its cells, surplus and warehouses, the deficit
warehouses, and the number printed on each piece. A game won by a shape (Teeko's line or
square, Hexade's line, ring or triangle) names its cells once it has ended (`winning`).
"""

from __future__ import annotations

from engine.winning import winning_cells
from schemas.codec import unpack_event
from schemas.events import NO_RESULT_REASONS
from schemas.views import BoardView, CellView, GameView
from services.bus.cache import LRU
from services.bus.clients import LogEntry, QueryClient
from services.gamelog.fold import GameFold, by_ply

#: Overflow's houses: the odd-phase squares are seat colour 1's, the others colour 2's.
OVERFLOW = "overflow"
TEEKO = "teeko"


class GameStates:
    """Folds of recently read games, each at its log's head when returned."""

    def __init__(self, query: QueryClient, size: int = 2_000) -> None:
        self.query = query
        self._folds: LRU[str, GameFold] = LRU(size)

    async def current(self, game_id: str) -> GameFold | None:
        """The game folded up to its log's head, or None if it has no log."""
        cached = self._folds.get(game_id)
        entries = await self.query.log(game_id, cached.seq + 1 if cached else 1)
        if cached is None:
            if not entries:
                return None
            cached = self._folds.get(game_id)  # another request may have folded it meanwhile
            if cached is None:
                folded = start(entries)
                self._folds.put(game_id, folded)
                return folded
        # Another request may have advanced it while this one read: fold only what is new.
        cached.extend(unpack_event(e.data) for e in entries if e.seq > cached.seq)
        return cached

    async def known(self, game_id: str) -> GameFold | None:
        """The game as last folded, without asking Redis for news: for what does not change
        once a game is under way (its seats, their token hashes)."""
        return self._folds.get(game_id) or await self.current(game_id)

    async def at_ply(self, game_id: str, ply: int) -> GameFold | None:
        """The game as it stood after `ply` moves (the whole game if it had fewer)."""
        entries = await self.query.log(game_id)
        return fold_at(entries, ply) if entries else None

    async def views_between(self, game_id: str, first: int, last: int) -> list[GameView] | None:
        """The views after plies `first` to `last` (those the game has), from one fold of
        its log: a replay's views in one pass rather than one fold per ply."""
        entries = await self.query.log(game_id)
        return views_of(entries, first, last) if entries else None

    def forget(self, game_id: str) -> None:
        self._folds.pop(game_id)


def fold_at(entries: list[LogEntry], ply: int) -> GameFold:
    """A log (not empty) folded as far as the position after `ply` moves (the whole game if
    it had fewer)."""
    for moves, game in by_ply(unpack_event(e.data) for e in entries):
        if moves == ply:
            return game
    return game  # the whole game, which had fewer plies (by_ply yields at least once)


def views_of(entries: list[LogEntry], first: int, last: int) -> list[GameView]:
    """The views after plies `first` to `last` (those the game has) of a log, in one pass."""
    out = []
    for moves, game in by_ply(unpack_event(e.data) for e in entries):
        if moves >= first:
            out.append(api_view(game))
        if moves >= last:
            break
    return out


def start(entries: list[LogEntry]) -> GameFold:
    events = [unpack_event(e.data) for e in entries]
    folded = GameFold.start(events[0], keep_moves=True)
    folded.extend(events[1:])
    return folded


def api_view(game: GameFold, *, archived: bool = False) -> GameView:
    """The game as `GET /api/games/{id}` shows it."""
    state = game.state
    created = game.created
    result = game.result
    return GameView(
        id=game.game_id,
        game=created["game"],
        options=created["options"],
        status=game.status,
        seq=game.seq,
        ply=game.ply,
        to_move=game.to_move or None,
        legal_moves=[str(m) for m in state.legal_moves()]
        if state is not None and game.status == "playing"
        else [],
        seats=game.seats,
        scores=game.scores,
        last_move=game.last_move,
        moves=list(game.moves),
        result=None
        if result is None
        else {
            "winner": result["winner"] or None,
            "draw": not result["winner"] and result["reason"] not in NO_RESULT_REASONS,
            "reason": result["reason"],
            "detail": result["detail"],
            "scores": result["scores"],
        },
        move_time=created["move_time_ms"] / 1000 if created["move_time_ms"] else None,
        deadline=game.deadline or None,
        created=created["time"],
        updated=game.updated,
        # The engine's mark of an imported game: replayable here, never rated.
        imported_from=created.get("imported_from"),
        board=board(game),
        error=game.error or None,
        archived=archived,
    )


def board(game: GameFold) -> BoardView:
    """The board cell by cell, with what the game shows beside it."""
    rules, state = game.game, game.state
    if rules is None or state is None:
        return {"name": "", "cells": []}
    cells = rules.board.cells
    text = state.board_string()
    if rules.name == OVERFLOW:
        heights = [int(h) for h in text.split(",")]
        stacks: list[CellView] = [
            {"label": c.label, "height": h, "house": 1 if c.phase == 1 else 2}
            for c, h in zip(cells, heights, strict=True)
        ]
        return {"name": rules.board.name, "cells": stacks}
    out: BoardView = {
        "name": rules.board.name,
        "cells": [
            {"label": c.label, "piece": None if ch == "." else int(ch)}
            for c, ch in zip(cells, text, strict=True)
        ],
    }
    if rules.name == TEEKO:
        markers = int(rules.options["markers"])
        out["hands"] = [markers - text.count(str(colour)) for colour in (1, 2)]
    if state.is_terminal and (won := winning_cells(state)):
        out["winning"] = won
    display = state.display()
    if display is not None:
        shown = display.to_dict()
        values = shown.get("surplus_values", {})
        for cell in out["cells"]:
            if cell["label"] in values:
                cell["surplus"] = values[cell["label"]]
        out["chains"] = [
            {
                "owner": c["owner"],
                "cells": c["cells"],
                "surplus": c["surplus"],
                "warehouses": c["warehouses"],
                "deficit": c["surplus"] < 0,
            }
            for c in shown["chains"]
        ]
        out["deficit_warehouses"] = shown["deficit_warehouses"]
    return out
