"""The one fold of a game's events: position and facts of its log, from event maps.

`GameFold` folds the events of one game, in seq order, into the engine position and the
facts the read models, the dispatcher and verify need: seats, status, seat to move, ply,
scores, last move, result and the moves so far. Events come as msgpack maps typed by
`schemas.events.EventMap` (decoding full models costs more than the fold itself): the
engine checked every event on its way into the log, and `verify` checks the models again.

Replaying a move goes through the engine's unchecked action path, with the notation of
each (rules, options) memoised: parsing is a good part of replaying.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from engine import Game, Move, State, load_game
from schemas.events import EventMap, GameCreatedMap, MovePlayedMap
from schemas.views import LastMoveView, LoggedResult, SeatView, Status, StoredView

#: Version of the view JSON layout; bump when fields change (then `agon rebuild`).
VIEW_VERSION = 1


def dumps(obj: Any) -> bytes:
    """Canonical JSON: sorted keys, no spaces, so equal views are equal bytes."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


@dataclass
class GameFold:
    """One game folded from its events: the engine position plus the facts of the log."""

    game_id: str
    created: GameCreatedMap
    game: Game | None
    state: State | None
    error: str = ""
    seq: int = 0
    status: Status = "waiting"
    seats: list[SeatView] = field(default_factory=list)
    to_move: int = 0
    ply: int = 0
    scores: list[int] | None = None
    last_move: LastMoveView | None = None
    result: LoggedResult | None = None
    updated: int = 0
    #: every move so far, in notation (kept only when asked: `start(keep_moves=True)`)
    moves: list[str] = field(default_factory=list)
    keep_moves: bool = False
    #: per taken seat, the sha256 of its token (what the engine checks tokens against)
    token_hashes: dict[int, str] = field(default_factory=dict)
    #: move text -> action code, shared by every game with the same rules and options
    actions: dict[str, int] = field(default_factory=dict)
    #: what is left of each seat's time bank (ms); empty when the game has none
    banks: list[int] = field(default_factory=list)
    #: per seat, the think time of each of its moves (ms), as the moves recorded it
    think: tuple[list[int], list[int]] = field(default_factory=lambda: ([], []))
    #: per seat, the platform's lag before each of its turns reached it (ms; bots only)
    lag: tuple[list[int], list[int]] = field(default_factory=lambda: ([], []))

    @classmethod
    def start(cls, ev: EventMap, *, replay: bool = True, keep_moves: bool = False) -> GameFold:
        """A fold from a `GameCreated` map; an unknown game becomes an error view.

        Without `replay` the engine position is not kept (readers that need only the facts
        of the log); with `keep_moves` the moves so far are (the dispatcher sends them).
        """
        if ev["type"] != "game_created":
            raise ValueError(f"game {ev['game_id']}: log starts with {ev['type']!r}")
        game: Game | None = None
        state: State | None = None
        actions: dict[str, int] = {}
        error = ""
        try:
            if replay:
                game, actions = _rules(ev["game"], tuple(sorted(ev["options"].items())))
                state = game.new_initial_state()
        except ValueError as exc:
            error = str(exc)
        seats: list[SeatView] = [
            {"seat": i, "kind": s["kind"], "name": s["name"], "colour": i, "seated": False}
            for i, s in enumerate(ev["seats"], start=1)
        ]
        proj = cls(
            ev["game_id"], ev, game, state, error, seats=seats, actions=actions,
            keep_moves=keep_moves,
        )  # fmt: skip
        if state is not None:
            scores = state.scores()
            proj.scores = None if scores is None else list(scores)
        bank = ev.get("time_bank_ms", 0)
        if bank and ev["move_time_ms"]:
            proj.banks = [bank] * len(seats)
        proj.seq = ev["seq"]
        proj.updated = ev["time"]
        return proj

    def apply(self, ev: EventMap) -> None:
        """Fold the next event (seq must follow on)."""
        self.extend((ev,))

    def extend(self, events: Iterable[EventMap]) -> None:
        """Fold the next events, in seq order (each seq must follow on).

        Replaying moves is the bulk of a fold (and of `rebuild`), so a move only goes to the
        engine, through the unchecked action path: the engine checked it before logging it,
        and `verify` checks it again. The facts a move event carries (ply, seat to move,
        scores, colours, last move) are each the newest one's, so only the move before
        another kind of event, or the last one, sets them. A fold that raises midway leaves
        the projection half-updated: callers drop it.
        """
        state = self.state
        actions = self.actions
        moves = self.moves if self.keep_moves else None
        banked = bool(self.banks)
        think = self.think
        seq = self.seq
        last_move: MovePlayedMap | None = None
        ev: EventMap | None = None
        for ev in events:
            seq += 1
            if ev["seq"] != seq:
                raise ValueError(f"game {self.game_id}: event seq {ev['seq']} after {seq - 1}")
            if ev["type"] == "move_played":
                if state is not None:
                    text = ev["move"]
                    action = actions.get(text)
                    if action is None:
                        action = actions[text] = state.game.action_of(Move.parse(text))
                    state.apply_action(action)
                if moves is not None:
                    moves.append(ev["move"])
                think[ev["seat"] - 1].append(ev.get("think_ms", 0))
                self.lag[ev["seat"] - 1].append(ev.get("lag_ms", 0))
                if banked:
                    self._draw(ev)
                last_move = ev
                continue
            if last_move is not None:
                self._moved(last_move)
                last_move = None
            self._other(ev)
        if last_move is not None:
            self._moved(last_move)
        if ev is not None:
            self.seq = seq
            self.updated = ev["time"]

    def _other(self, ev: EventMap) -> None:
        if ev["type"] == "player_seated":
            seat = self.seats[ev["seat"] - 1]
            seat["name"], seat["kind"], seat["seated"] = ev["name"], ev["kind"], True
            self.token_hashes[ev["seat"]] = ev["token_hash"]
        elif ev["type"] == "game_started":
            self.status = "playing"
            self.to_move = ev["to_move"]
            self._colours(ev["colours"])
        elif ev["type"] == "game_ended":
            self.status = "ended"
            self.to_move = 0
            self.result = {
                "winner": ev["result"],
                "reason": ev["reason"],
                "detail": ev.get("detail", ""),
                "scores": ev["scores"],
            }
            for lean in ("fault", "overrun_ms"):  # only when set: other views keep bytes
                if ev.get(lean):
                    self.result[lean] = ev[lean]
            if ev["scores"] is not None:
                self.scores = list(ev["scores"])
        else:
            raise ValueError(f"game {self.game_id}: unexpected {ev['type']!r} at seq {ev['seq']}")

    def _moved(self, ev: MovePlayedMap) -> None:
        """The facts of a move event, once its move (and every one before) is replayed."""
        self.ply = ev["ply"] + 1
        self.to_move = ev["to_move"]
        self.scores = ev["scores_after"]
        self._colours(ev["colours"])
        self.last_move = {"ply": ev["ply"], "seat": ev["seat"], "move": ev["move"]}

    def played(self, ev: MovePlayedMap) -> None:
        """Fold in a move the caller has already applied to `state` (the engine deciding)."""
        if ev["seq"] != self.seq + 1:
            raise ValueError(f"game {self.game_id}: event seq {ev['seq']} after {self.seq}")
        if self.keep_moves:
            self.moves.append(ev["move"])
        self.think[ev["seat"] - 1].append(ev.get("think_ms", 0))
        self.lag[ev["seat"] - 1].append(ev.get("lag_ms", 0))
        if self.banks:
            self._draw(ev)
        self._moved(ev)
        self.seq = ev["seq"]
        self.updated = ev["time"]

    def _draw(self, ev: MovePlayedMap) -> None:
        """A move that took longer than the per-move limit draws the rest from its bank."""
        over = ev.get("think_ms", 0) - self.created["move_time_ms"]
        if over > 0:
            seat = ev["seat"] - 1
            self.banks[seat] = max(0, self.banks[seat] - over)

    @property
    def deadline(self) -> int:
        """When the seat to move must have moved (ms; 0: no clock, or nobody to move): the
        time of the head event + the per-move limit + what is left of the seat's bank."""
        limit = self.created["move_time_ms"]
        if not limit or self.status != "playing":
            return 0
        bank = self.banks[self.to_move - 1] if self.banks and self.to_move else 0
        return self.updated + limit + bank

    def colour_of(self, seat: int) -> int:
        colour: int = self.seats[seat - 1]["colour"]
        return colour

    def _colours(self, colours: Sequence[int]) -> None:
        seats = self.seats
        if seats[0]["colour"] != colours[0] or seats[1]["colour"] != colours[1]:
            for seat, colour in zip(seats, colours, strict=True):
                seat["colour"] = colour

    def view(self) -> StoredView:
        c = self.created
        move_time = c["move_time_ms"]
        view: StoredView = {
            "v": VIEW_VERSION,
            "game_id": self.game_id,
            "game": c["game"],
            "options": c["options"],
            "board": self.game.board.name if self.game is not None else "",
            "seats": self.seats,
            "move_time_ms": move_time,
            "seed": c["seed"],
            "engine_version": c["engine_version"],
            "status": self.status,
            "seq": self.seq,
            "ply": self.ply,
            "to_move": self.to_move,
            "position": self.state.board_string() if self.state is not None else "",
            "scores": self.scores,
            "last_move": self.last_move,
            "result": self.result,
            "created": c["time"],
            "updated": self.updated,
            "deadline": self.deadline,
        }
        # Only games that use these carry them: the views of others keep their bytes.
        if "imported_from" in c:
            view["imported_from"] = c["imported_from"]
        if self.banks:
            view["banks_ms"] = self.banks
        if "tournament" in c:
            view["tournament"] = c["tournament"]
        if self.error:
            view["error"] = self.error
        state = self.state
        if state is not None:
            if self.to_move and self.seats[self.to_move - 1]["kind"] == "human":
                # People need the legal moves to play; bots compute their own.
                view["legal"] = [str(m) for m in state.legal_moves()]
            display = state.display()
            if display is not None:
                view["display"] = display.to_dict()
        return view

    def view_bytes(self) -> bytes:
        return dumps(self.view())


@functools.cache
def _rules(name: str, options: tuple[tuple[str, str], ...]) -> tuple[Game, dict[str, int]]:
    """One `Game` per rules and options (building one costs more than a short game), and
    a memo of its notation: parsing a move is a good part of replaying it."""
    return load_game(name, **dict(options)), {}


def by_ply(events: Iterable[EventMap]) -> Iterator[tuple[int, GameFold]]:
    """The game after each ply in turn, one fold advanced along the events (the same object
    each time): the position after ply N holds every event before move N + 1."""
    it = iter(events)
    game = GameFold.start(next(it), keep_moves=True)
    moves = 0
    for ev in it:
        if ev["type"] == "move_played":
            yield moves, game
            moves += 1
        game.apply(ev)
    yield moves, game


def fold(game_id: str, events: Iterable[EventMap]) -> GameFold:
    """Fold a whole log's event maps into its projection."""
    it = iter(events)
    first = next(it, None)
    if first is None:
        raise ValueError(f"game {game_id} has an empty log")
    proj = GameFold.start(first)
    if proj.game_id != game_id:
        raise ValueError(f"the log of game {game_id} belongs to game {proj.game_id}")
    proj.extend(it)
    return proj
