"""The positions of many games whose move lists grow: each new one costs only the new moves.

A bot worker and a gateway see a game's moves grow by a move or two per turn; replaying the
whole list every turn would be quadratic in the game's length. `Positions` keeps the latest
position of the `size` games used most recently, and the rules of each game type, and
replays only the moves it has not seen. The moves come from a log the engine checked, so
they are applied unchecked.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping, Sequence

from engine.core import Game, Move, State, load_game

#: A game type: the game's name and its options, sorted.
GameType = tuple[str, tuple[tuple[str, str], ...]]


def game_type(game: str, options: Mapping[str, str]) -> GameType:
    return game, tuple(sorted(options.items()))


class Positions:
    """The latest position of each of the last `size` games asked about."""

    def __init__(self, size: int = 10_000) -> None:
        self.size = size
        self._states: OrderedDict[str, tuple[State, int]] = OrderedDict()
        self._rules: dict[GameType, Game] = {}

    def after(
        self, game_id: str, game: str, options: Mapping[str, str], moves: Sequence[str]
    ) -> State:
        """The position after `moves`: the one kept, so clone it before changing it."""
        cached = self._states.pop(game_id, None)
        if cached is not None and cached[1] <= len(moves):
            state, done = cached
        else:
            state, done = self.rules(game, options).new_initial_state(), 0
        rules = state.game
        for text in moves[done:]:
            state.apply_action(rules.action_of(Move.parse(text)))
        self._states[game_id] = (state, len(moves))
        while len(self._states) > self.size:
            self._states.popitem(last=False)
        return state

    def rules(self, game: str, options: Mapping[str, str]) -> Game:
        """The game's rules with these options, loaded once."""
        kind = game_type(game, options)
        rules = self._rules.get(kind)
        if rules is None:
            rules = self._rules[kind] = load_game(game, **options)
        return rules

    def forget(self, game_id: str) -> None:
        self._states.pop(game_id, None)

    def clear(self) -> None:
        self._states.clear()
