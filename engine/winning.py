"""The cells of a finished game's winning shape, for a board to highlight.

Teeko and Hexade end when the mover completes a shape through the piece just placed or
moved: a line (Teeko's of 4, Hexade's of 6), Teeko's square, Hexade's ring or triangle.
`winning_cells` finds it again on the final position, from the tables the games check wins
with (per site, the masks of the shapes through it): the cells of every complete winning
shape of the winner's colour (a run of five holds two lines of four: both are shown). The
other games end by counting or by a player left without moves: no shape, nothing to show.
"""

from __future__ import annotations

from collections.abc import Sequence

from engine.core import EndRule, State
from engine.games.hexade import HexadeState
from engine.games.teeko import TeekoState

#: The ends that complete a shape on the board.
SHAPES = frozenset({EndRule.LINE, EndRule.SQUARE, EndRule.RING, EndRule.TRIANGLE})


def winning_cells(state: State) -> list[str]:
    """The labels of the cells of the winning shape(s), in site order; [] when the game
    did not end by completing one."""
    if isinstance(state, TeekoState):
        through: Sequence[Sequence[int]] = [effect[2] for effect in state.game.effects]
    elif isinstance(state, HexadeState):
        through = state.game.wins
    else:
        return []
    if state.reason not in SHAPES or not state.winner:
        return []
    mine = state.bits[state.winner]
    won = 0
    for site in range(state.game.n):
        if not mine >> site & 1:
            continue
        for mask in through[site]:
            shape = mask | 1 << site  # a pattern's mask leaves out the site it starts from
            if mine & shape == shape:
                won |= shape
    labels = state.game.board.labels
    return [label for site, label in enumerate(labels) if won >> site & 1]
