"""The greedy, MCTS and alpha-beta bots, and the bots benchmark's game loop, without Redis.

Every bot answers a legal move in every game (each at its defaults, plus a Supply Chains
option set on another hex board with captures) from positions along seeded random games;
the same turn gives the same move; a short deadline is kept; a win in one is taken and an
opponent's win in one blocked; and MCTS beats the random bot at Teeko.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import Any

import pytest

from bench.bots import PAIRINGS, Job, jobs, play, run_bots_bench, summarise, wilson
from bots import Bot, TurnContext, bot_names, load_bot
from bots.alphabeta import AlphaBetaBot
from bots.evaluation import FORK, ShapeValue, evaluate, leaf_value, move_priorities, value_function
from bots.greedy import GreedyBot
from bots.mcts import MctsBot
from engine import State, load_game
from tests.engine.test_hexade import BOARD, go, position, room_for

GAMES: list[tuple[str, dict[str, Any]]] = [
    ("supply-chains", {}),
    ("supply-chains", {"board": "hex-4-5", "variant": "capture-122"}),
    ("supplier-sabotage", {}),
    ("overflow", {}),
    ("teeko", {}),
    ("hexade", {}),
]
GAME_IDS = [name + "".join(f"-{v}" for v in options.values()) for name, options in GAMES]

#: the bots under test, small enough to answer fast: MCTS capped in iterations, alpha-beta
#: in depth (its clock is tested on its own)
BOTS: dict[str, Callable[[], Bot]] = {
    "greedy": GreedyBot,
    "mcts": lambda: MctsBot(iterations=60),
    "alphabeta": lambda: AlphaBetaBot(max_depth=2),
}


def random_positions(name: str, options: dict[str, Any], plies: tuple[int, ...]) -> list[State]:
    """Positions of one seeded random game after each number of plies (or its last one)."""
    state = load_game(name, **options).new_initial_state()
    rng = random.Random(f"{name}{options}")
    out = []
    for target in plies:
        while state.ply < target:
            actions = state.legal_actions()
            step = state.clone()
            step.apply_action(actions[rng.randrange(len(actions))])
            if step.is_terminal:
                break
            state = step
        out.append(state.clone())
    return out


def context(seq: int, seconds: float = 0.0, game_id: str = "g1") -> TurnContext:
    deadline = int((time.time() + seconds) * 1000) if seconds else 0
    return TurnContext(game_id, 1, seq, deadline)


def legal_texts(state: State) -> set[str]:
    return {str(m) for m in state.legal_moves()}


def winning_moves(state: State) -> set[str]:
    """The moves that end the game at once with a win for the seat to move."""
    seat = state.seat_to_move
    wins = set()
    for action in state.legal_actions():
        after = state.clone()
        after.apply_action(action)
        outcome = after.outcome()
        if outcome is not None and outcome.winner and after.seat_of(outcome.winner) == seat:
            wins.add(str(state.game.move_of(action)))
    return wins


def position_with_a_win(name: str) -> State:
    """A position of a seeded random game where some moves, not all, win at once."""
    for attempt in range(50):
        state = load_game(name).new_initial_state()
        rng = random.Random(f"{name}:{attempt}")
        while not state.is_terminal:
            wins = winning_moves(state)
            if wins and wins != legal_texts(state):
                return state
            actions = state.legal_actions()
            state.apply_action(actions[rng.randrange(len(actions))])
    raise AssertionError(f"no {name} position with a win in one among 50 random games")


def teeko(board: str, mover: int, markers: int = 8) -> State:
    """A Teeko position from its board (site order: A1..E1, A2.., as RULES.md §0 numbers it)."""
    game = load_game("teeko", markers=markers)
    text = board.replace(" ", "")
    ply = sum(ch != "." for ch in text)
    snapshot = {
        **game.new_initial_state().snapshot_header(),
        "ply": ply,
        "mover": mover,
        "board": text,
        "winner": 0,
        "reason": "",
    }
    return game.state_from_dict(snapshot)


def test_the_registry_knows_the_new_bots() -> None:
    assert {"greedy", "mcts", "alphabeta"} <= set(bot_names())
    assert [load_bot(n).name for n in ("greedy", "mcts", "alphabeta")] == [
        "greedy",
        "mcts",
        "alphabeta",
    ]


@pytest.mark.parametrize("bot_name", list(BOTS))
@pytest.mark.parametrize(("name", "options"), GAMES, ids=GAME_IDS)
def test_every_bot_plays_legal_moves_in_every_game(
    bot_name: str, name: str, options: dict[str, Any]
) -> None:
    bot = BOTS[bot_name]()
    # Ply 1 is Hexade's swap, 20 Teeko's movement phase.
    for seq, state in enumerate(random_positions(name, options, (0, 1, 9, 20, 60)), start=2):
        move = bot.choose(state.clone(), context(seq))
        assert move in legal_texts(state), f"{bot_name} played {move} in {state.to_dict()}"


@pytest.mark.parametrize("bot_name", list(BOTS))
@pytest.mark.parametrize("name", ["teeko", "hexade", "supply-chains", "overflow"])
def test_the_same_turn_gives_the_same_move(bot_name: str, name: str) -> None:
    for seq, state in enumerate(random_positions(name, {}, (0, 7, 15)), start=2):
        first = BOTS[bot_name]().choose(state.clone(), context(seq))
        again = BOTS[bot_name]().choose(state.clone(), context(seq))
        assert first == again


def test_mcts_with_the_same_iterations_repeats_its_search() -> None:
    [state] = random_positions("supplier-sabotage", {}, (6,))
    moves = {MctsBot(iterations=300).choose(state.clone(), context(7)) for _ in range(3)}
    assert len(moves) == 1
    # Other game ids seed other searches: over many, some choose differently.
    others = {
        MctsBot(iterations=30).choose(state.clone(), context(7, game_id=f"g{i}")) for i in range(12)
    }
    assert len(others) > 1


@pytest.mark.parametrize("bot_name", ["greedy", "mcts", "alphabeta"])
@pytest.mark.parametrize(("name", "ply"), [("hexade", 20), ("overflow", 10), ("supply-chains", 6)])
def test_a_short_deadline_is_kept(bot_name: str, name: str, ply: int) -> None:
    [state] = random_positions(name, {}, (ply,))
    bot = load_bot(bot_name)
    bot.choose(state.clone(), context(1, 0.05))  # tables and evaluations built: not timed
    start = time.monotonic()
    move = bot.choose(state.clone(), context(2, 0.15))
    elapsed = time.monotonic() - start
    assert move in legal_texts(state)
    assert elapsed < 0.15 + 0.05, f"{bot_name} took {elapsed:.3f} s for a 0.15 s deadline"


@pytest.mark.parametrize("bot_name", ["greedy", "mcts", "alphabeta"])
def test_a_deadline_already_past_still_gets_a_legal_move(bot_name: str) -> None:
    [state] = random_positions("teeko", {}, (5,))
    late = TurnContext("g1", state.seat_to_move, 3, int(time.time() * 1000) - 1000)
    start = time.monotonic()
    assert load_bot(bot_name).choose(state.clone(), late) in legal_texts(state)
    assert time.monotonic() - start < 0.05


#: P1 to move, three in a row on the first rank (D1 wins); P2's markers threaten nothing.
TEEKO_WIN = "111.. ..... 2.2.. ..... ....2"
#: P1 to move, P2 three in a row on the top rank (D5 blocks); P1 has no win in one.
TEEKO_BLOCK = "1.1.. ..... ....1 ..... 222.."
#: Scarne's Teeko (4 markers) in its movement phase, P1 to move: D2-D1 completes A1-D1.
TEEKO_STEP_WIN = "111.. ...1. ....2 ..... 22.2."


@pytest.mark.parametrize("bot_name", ["greedy", "mcts", "alphabeta"])
@pytest.mark.parametrize(
    ("board", "markers"), [(TEEKO_WIN, 8), (TEEKO_STEP_WIN, 4)], ids=["place", "step"]
)
def test_a_teeko_win_in_one_is_taken(bot_name: str, board: str, markers: int) -> None:
    state = teeko(board, 1, markers)
    wins = winning_moves(state)
    assert wins, "the position has a win in one"
    assert load_bot(bot_name).choose(state.clone(), context(1, 0.3)) in wins


@pytest.mark.parametrize("bot_name", ["mcts", "alphabeta"])
def test_an_opponents_teeko_win_in_one_is_blocked(bot_name: str) -> None:
    state = teeko(TEEKO_BLOCK, 1)
    assert not winning_moves(state)
    assert load_bot(bot_name).choose(state.clone(), context(1, 0.3)) == "D5"


@pytest.mark.parametrize("bot_name", ["greedy", "mcts", "alphabeta"])
@pytest.mark.parametrize("name", ["supplier-sabotage", "overflow", "teeko", "hexade"])
def test_a_win_in_one_is_taken_in_random_positions(bot_name: str, name: str) -> None:
    state = position_with_a_win(name)
    bot = MctsBot(iterations=300) if bot_name == "mcts" else load_bot(bot_name)
    assert bot.choose(state.clone(), context(1, 0.5)) in winning_moves(state)


#: P1 to move with no win in one, but D1 (or C2) makes two threats, which cannot both be met.
TEEKO_DOUBLE = ".11.. ..... 2...2 ..... ..2.1"


def test_alphabeta_finds_a_win_in_three() -> None:
    state = teeko(TEEKO_DOUBLE, 1)
    assert not winning_moves(state)
    move = AlphaBetaBot().choose(state.clone(), context(1, 1.0))
    after = state.clone()
    after.apply(move)
    for reply in after.legal_moves():
        answer = after.clone()
        answer.apply(reply)
        assert winning_moves(answer), f"after {move} {reply} P1 has no win"


def test_mcts_beats_random_at_teeko() -> None:
    wins = 0
    for pair in range(5):
        for seat in (1, 2):
            state = load_game("teeko").new_initial_state()
            players = {seat: MctsBot(iterations=200), 3 - seat: load_bot("random")}
            seq = 1
            while not state.is_terminal:
                mover = state.seat_to_move
                turn = TurnContext(f"m{pair}", mover, seq, 0)
                state.apply(players[mover].choose(state.clone(), turn))
                seq += 1
            outcome = state.outcome()
            assert outcome is not None
            wins += outcome.winner != 0 and state.seat_of(outcome.winner) == seat
    assert wins >= 8, f"MCTS won {wins} of 10 against random"


def test_mcts_tries_a_hexade_capture_first_even_at_the_edge() -> None:
    # The first cell in site order (a corner) with two cells east of it: a colour-2 stone
    # next to it and a colour-1 stone beyond, so colour 1 placing there captures.
    corner = room_for("E", 2)
    enemy, friend = go(corner, "E"), go(corner, "E", "E")
    state = position({enemy: 2, friend: 1}, mover=1)
    site, enemy_site = BOARD.site(corner), BOARD.site(enemy)
    assert state.captures(site, 1) == 1 << enemy_site
    actions = state.legal_actions()
    priorities = move_priorities(state, actions)
    assert priorities is not None
    assert max(zip(priorities, actions, strict=True))[1] == site, "a capture outranks the centre"
    state.apply_action(site)
    assert state.cells[enemy_site] == 0 and state.captures(enemy_site, 2) == 0


def test_a_hexade_fork_counts_at_a_search_leaf_for_the_side_to_move() -> None:
    shapes = value_function(load_game("hexade"))
    assert isinstance(shapes, ShapeValue)
    # The middle row: four stones of colour 2 with two empty cells on either side, so a
    # fifth on the first cell beyond either end leaves two lines of six one short.
    line = [go("A8", *["E"] * k) for k in range(4, 8)]
    four = dict.fromkeys(line, 2)
    state = position(four, mover=2)
    assert (shapes.fork_value(state, 2), shapes.fork_value(state, 1)) == (FORK, -FORK)
    assert leaf_value(state, 2) == evaluate(state, 2) + FORK
    # Only the side to move can play its fork; three in a row make none.
    assert shapes.fork_value(position(four, mover=1), 1) == 0
    assert shapes.fork_value(position(dict.fromkeys(line[:3], 2), mover=2), 2) == 0
    # A gap on the board comes first: it must be filled or blocked at once. (Colour 1's
    # five from the west edge of the bottom row leave it one gap.)
    gap = position({**four, **{go("A1", *["E"] * k): 1 for k in range(5)}}, mover=2)
    assert leaf_value(gap, 2) == evaluate(gap, 2)


def test_the_bench_plays_seat_swapped_pairs_to_the_end() -> None:
    todo = jobs(["teeko"], 2, 0.02)
    assert len(todo) == 2 * len(PAIRINGS)
    pair = [j for j in todo if j.opponent == "random"]
    assert {j.seat for j in pair} == {1, 2} and len({j.game_id for j in pair}) == 1
    results = [play(job) for job in todo]
    assert all(r.score in (0.0, 0.5, 1.0) and r.plies > 0 for r in results)
    rows = summarise(["teeko"], results, 0.02)
    assert [r["pairing"] for r in rows] == ["mcts v random", "mcts v greedy"]
    assert all(r["games"] == 2 and r["low"] <= r["score"] <= r["high"] for r in rows)
    assert play(Job("teeko", "random", "random", 0, 1, 0.01)).plies > 0


def test_the_bench_plays_one_variant_against_one_opponent() -> None:
    todo = jobs(["teeko"], 2, 0.02, {"markers": "4"}, ["greedy"])
    assert [(j.opponent, j.seat, j.options) for j in todo] == [
        ("greedy", 1, (("markers", "4"),)),
        ("greedy", 2, (("markers", "4"),)),
    ]
    rows = summarise(["teeko"], [play(job) for job in todo], 0.02)
    assert [(r["pairing"], r["options"], r["games"]) for r in rows] == [
        ("mcts v greedy", {"markers": "4"}, 2)
    ]
    # The options reach the engine: one it does not have is refused there.
    with pytest.raises(ValueError, match="markers"):
        play(Job("teeko", "random", "random", 0, 1, 0.01, (("markers", "5"),)))


def test_a_piped_bench_prints_its_score_so_far(capsys: pytest.CaptureFixture[str]) -> None:
    [row] = run_bots_bench(["teeko"], 2, 0.02, workers=1, opponents=["random"])
    lines = [line for line in capsys.readouterr().err.splitlines() if " games in " in line]
    assert [line.split(" games in ")[0] for line in lines] == ["1/2", "2/2"]
    wdl = f"{row['wins']}-{row['draws']}-{row['losses']}"
    assert lines[-1].endswith(f"; teeko mcts v random {wdl}"), lines


def test_wilson_intervals() -> None:
    low, high = wilson(10, 10)
    assert (round(low, 4), round(high, 4)) == (0.7225, 1.0)
    low, high = wilson(50, 100)
    assert (round(low, 4), round(high, 4)) == (0.4038, 0.5962)
