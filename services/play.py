"""`agon play`: seeded random games in the terminal, straight on the engine (no Redis).

Prints each game's board after every move and the result; the quickest way to see
the rules at work.
"""

from __future__ import annotations

import argparse
import random

from engine import game_names, load_game


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--game", action="append", choices=game_names(), help="default: all five")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--quiet", action="store_true", help="print only the final boards")


def run(args: argparse.Namespace) -> int:
    for name in args.game or game_names():
        game = load_game(name)
        state = game.new_initial_state()
        rng = random.Random(args.seed)
        print(f"=== {game!r}, seed {args.seed} ===")
        while not state.is_terminal:
            mover = state.current_player
            move = rng.choice(state.legal_moves())
            state.apply(move)
            if not args.quiet:
                print(f"ply {state.ply}: player {mover} plays {move}")
                print(state.render())
        outcome = state.outcome()
        assert outcome is not None
        if args.quiet:
            print(state.render())
        verdict = "draw" if outcome.winner == 0 else f"player {outcome.winner} wins"
        print(f"result: {verdict} by {outcome.reason}; scores {outcome.scores}")
        print(f"{state.ply} plies\n")
    return 0
