"""`agon play`: seeded random games in the terminal, straight on the engine (no Redis).

Prints each game's board after every move and the result; the quickest way to see
the rules at work. `--option key=value` plays a variant (`--game supply-chains
--option board=hex-3-4`); `--games N` plays N games of each, seeds `--seed`, +1, ...
"""

from __future__ import annotations

import argparse
import random

from engine import Game, game_names
from schemas.wording import ending
from services.cli.options import UsageError, game_options_or_usage, parse_options, positive_int


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--game", action="append", choices=game_names(), help="default: all five")
    parser.add_argument(
        "--option",
        action="append",
        metavar="KEY=VALUE",
        help="a game option, e.g. board=hex-3-4 (repeatable; needs --game)",
    )
    parser.add_argument("--games", type=positive_int, default=1, help="games of each (default 1)")
    parser.add_argument("--seed", type=int, default=1, help="seed of the first game (default 1)")
    parser.add_argument("--quiet", action="store_true", help="print only the final boards")


def _games(args: argparse.Namespace) -> list[Game]:
    """The chosen games with their options, every one checked before any is played."""
    options = parse_options(args.option)
    if options and not args.game:
        raise UsageError("--option needs --game: each game has options of its own")
    return [game_options_or_usage(name, options) for name in args.game or game_names()]


def run(args: argparse.Namespace) -> int:
    for game in _games(args):
        for seed in range(args.seed, args.seed + args.games):
            _play(game, seed, quiet=args.quiet)
    return 0


def _play(game: Game, seed: int, *, quiet: bool) -> None:
    state = game.new_initial_state()
    rng = random.Random(seed)
    print(f"=== {game!r}, seed {seed} ===")
    while not state.is_terminal:
        mover = state.current_player
        move = rng.choice(state.legal_moves())
        state.apply(move)
        if not quiet:
            print(f"ply {state.ply}: player {mover} plays {move}")
            print(state.render())
    outcome = state.outcome()
    assert outcome is not None
    if quiet:
        print(state.render())
    verdict = "draw" if outcome.winner == 0 else f"player {outcome.winner} wins"
    print(f"result: {verdict} ({ending('natural', outcome.reason)}); scores {outcome.scores}")
    print(f"{state.ply} plies\n")
