"""What the outside bots' turn streams of one gateway share: positions, and streams by bot.

`TurnPositions` keeps the latest position of each game whose turns the gateway sends, so
that a turn's legal moves (`services.gateway.turns`) cost only the moves played since the
last turn of that game (`engine.positions`, as a bot worker's), and each game's per-move
limit. `BotStreams`
knows the streams open here by bot, so that a bot's `POST /api/bot/ready` reaches them.
"""

from __future__ import annotations

from typing import Protocol

from engine.positions import GameType, Positions, game_type
from schemas.turns import TurnRequest
from services.bus.cache import LRU

#: Games whose position (and move limit) a gateway keeps for its turns' legal moves.
POSITIONS_KEPT = 2_000

__all__ = ["BotStreams", "GameType", "TurnPositions", "game_type"]


class TurnPositions:
    """The latest position of each game whose turns this gateway sends, so that a turn's legal
    moves cost only the moves played since the last one (`engine.positions`), and each
    game's per-move limit."""

    def __init__(self, size: int = POSITIONS_KEPT) -> None:
        self.positions = Positions(size)
        self.limits: LRU[str, int] = LRU(size)

    def legal_moves(self, turn: TurnRequest) -> list[str]:
        state = self.positions.after(turn.game_id, turn.game, turn.options, turn.moves)
        return [str(m) for m in state.legal_moves()]

    def forget(self, game_id: str) -> None:
        self.positions.forget(game_id)
        self.limits.pop(game_id)


class Stream(Protocol):
    """A bot's turn stream, as `BotStreams` knows it (`services.gateway.turns.Turns`)."""

    @property
    def bot(self) -> str: ...

    def ready_for(self, game: str, options: dict[str, str]) -> int: ...


class BotStreams:
    """The turn streams open on this gateway, by bot (a `ready` POSTed by a bot reaches its
    streams here), and the positions they share."""

    def __init__(self) -> None:
        self.bots: dict[str, set[Stream]] = {}
        self.positions = TurnPositions()

    def add(self, turns: Stream) -> None:
        self.bots.setdefault(turns.bot, set()).add(turns)

    def discard(self, turns: Stream) -> None:
        streams = self.bots.get(turns.bot, set())
        streams.discard(turns)
        if not streams:
            self.bots.pop(turns.bot, None)

    def ready(self, bot: str, game: str, options: dict[str, str]) -> int:
        """The bot is ready for this game type on all its streams here: the turns released."""
        return sum(turns.ready_for(game, options) for turns in self.bots.get(bot, ()))
