"""What the bots know of each game (`bots.evaluation.Knowledge`), from its one registry.

Every registered game has a `Knowledge`, built once per game and option set, whose
evaluation, leaf value, move ranking and position key answer along a seeded random game;
an unknown game is refused by name. The searches are handed it and name no game: MCTS judges
its leaves with the knowledge it is given, and no bot module names a game or imports one.
"""

from __future__ import annotations

import math
import random
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import cast

import pytest

from bots import TurnContext
from bots.clock import Clock
from bots.evaluation import Knowledge, knowledge_of
from bots.mcts import MctsBot
from engine import Game, State, game_names, load_game

BOTS = Path(__file__).resolve().parents[2] / "bots"
#: the modules that search, which must take a game's aids from its `Knowledge`
SEARCHES = ("mcts.py", "alphabeta.py", "greedy.py")


def positions(name: str, plies: int = 30) -> list[State]:
    """The positions of one seeded random game of `name` (defaults), up to `plies`."""
    state = load_game(name).new_initial_state()
    rng = random.Random(name)
    out = [state.clone()]
    while not state.is_terminal and state.ply < plies:
        actions = state.legal_actions()
        state.apply_action(actions[rng.randrange(len(actions))])
        out.append(state.clone())
    return out


@pytest.mark.parametrize("name", game_names())
def test_every_game_has_knowledge_that_answers_along_a_game(name: str) -> None:
    knowledge = knowledge_of(load_game(name))
    assert isinstance(knowledge, Knowledge) and knowledge.scale > 0
    for state in positions(name):
        for colour in (1, 2):
            assert math.isfinite(knowledge.evaluate(state, colour))
            assert math.isfinite(knowledge.leaf_value(state, colour))
        key = knowledge.position_key(state)
        assert key == knowledge.position_key(state.clone()) and hash(key) is not None
        actions = state.legal_actions()
        if knowledge.priorities is not None and actions:
            ranked = knowledge.priorities(state, actions)
            assert len(ranked) == len(actions) and all(map(math.isfinite, ranked))


def test_knowledge_is_built_once_per_game_and_options() -> None:
    plain = knowledge_of(load_game("supply-chains"))
    assert knowledge_of(load_game("supply-chains")) is plain
    other = load_game("supply-chains", board="hex-4-5", variant="capture-122")
    assert knowledge_of(other) is not plain


def test_an_unknown_game_has_no_knowledge() -> None:
    stranger = cast(Game, SimpleNamespace(name="chess", options={}))
    with pytest.raises(ValueError, match=r"no knowledge for game 'chess'; known: .*teeko"):
        knowledge_of(stranger)


def test_mcts_judges_its_leaves_with_the_knowledge_it_is_given() -> None:
    teeko = knowledge_of(load_game("teeko"))
    judged: list[State] = []

    def value(state: State, colour: int) -> float:
        judged.append(state)
        return teeko.value(state, colour)

    state = load_game("teeko").new_initial_state()
    clock = Clock(TurnContext("g", 1, 0, 0), 1e6)
    bot = MctsBot(iterations=30)
    # Teeko's playouts stop at once (cutoff 0): every iteration judges its leaf, a
    # placement that cannot repeat or end the game in the first plies.
    bot.search(state, replace(teeko, value=value), random.Random(1), clock)
    assert len(judged) == 30
    # Without a cutoff the playouts run to the end of the game and judge nothing.
    judged.clear()
    bot.search(state, replace(teeko, value=value, cutoff=None), random.Random(1), clock)
    assert judged == []


@pytest.mark.parametrize("module", SEARCHES)
def test_the_searches_name_no_game(module: str) -> None:
    source = (BOTS / module).read_text()
    assert "engine.games" not in source
    for name in game_names():
        assert f'"{name}"' not in source, f"bots/{module} names {name!r}"
