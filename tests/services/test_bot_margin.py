"""Searching bots keep a margin: they plan to stop well before the turn's deadline.

The margin (`bots.clock`) is the larger of 15% of the time left and the move overhead this
process has measured (`Overhead`, fed by the worker): reports raise it, a single slow one
ages out of the window, and it never falls below the reserve. And the MCTS bot, on the real
engine with no Redis, answers a person's move with 3 s and with 10 s to go before the
deadline less part of that margin, on a process that has searched before (the last tree's
freeing and the garbage collector are what made it overrun by 0.17 s in the lobby).
"""

from __future__ import annotations

import gc
import threading
import time

import pytest

from bots.base import TurnContext
from bots.clock import (
    FLOOR_MS,
    PAD_MS,
    RECENT,
    RESERVE,
    WINDOW,
    Clock,
    Overhead,
    take_planned_stop_ms,
    thinking,
)
from bots.mcts import MctsBot
from engine import Move, load_game


def test_no_reports_plans_for_the_floor() -> None:
    assert Overhead().estimate_ms() == FLOOR_MS


def test_reports_raise_the_margin() -> None:
    overhead = Overhead()
    before = overhead.margin_s(0.1)
    for _ in range(10):
        overhead.observe(80)
    assert overhead.estimate_ms() == 80
    assert overhead.margin_s(0.1) == pytest.approx((80 + PAD_MS) / 1000)
    assert overhead.margin_s(0.1) > before


def test_the_margin_never_falls_below_the_reserve() -> None:
    overhead = Overhead(floor_ms=0)
    for left in (0.0, 0.05, 1.0, 3.0, 10.0, 600.0):
        assert overhead.margin_s(left) >= RESERVE * left
    for _ in range(WINDOW):
        overhead.observe(0)
    assert overhead.margin_s(10.0) == pytest.approx(RESERVE * 10.0)


def test_an_outlier_counts_at_once_and_ages_out() -> None:
    overhead = Overhead()
    for _ in range(WINDOW):
        overhead.observe(20)
    overhead.observe(900)
    assert overhead.estimate_ms() == 900
    for _ in range(RECENT):
        overhead.observe(20)
    assert overhead.estimate_ms() == 20


def test_recurring_slow_moves_keep_the_margin_up() -> None:
    overhead = Overhead()
    for n in range(WINDOW):
        overhead.observe(300 if n % 5 == 0 else 20)
    for _ in range(RECENT):
        overhead.observe(20)
    assert overhead.estimate_ms() == 300


def test_a_move_before_its_planned_stop_is_no_report() -> None:
    overhead = Overhead()
    for _ in range(10):
        overhead.observe(-500)
    assert overhead.estimate_ms() == FLOOR_MS


def test_the_clock_plans_its_stop_before_the_margin() -> None:
    overhead = Overhead()
    for _ in range(5):
        overhead.observe(300)
    deadline = int(time.time() * 1000) + 1000
    clock = Clock(TurnContext("g", 1, 0, deadline), 5.0, overhead)
    assert clock.stop_ms <= deadline - 300 - PAD_MS
    assert take_planned_stop_ms() == clock.stop_ms
    assert take_planned_stop_ms() is None
    # Without a deadline, the bot's own budget.
    assert 0.9 < Clock(TurnContext("g", 1, 0, 0), 1.0).left() <= 1.0


def test_thinking_pauses_the_collector_and_resumes_it() -> None:
    for thread in threading.enumerate():
        if thread.name == "mcts-free":
            thread.join()  # an earlier test's tree, freed with the collector paused
    assert gc.isenabled()
    with thinking(), thinking():
        assert not gc.isenabled()
    assert gc.isenabled()
    gc.disable()
    try:
        with thinking():
            pass
        assert not gc.isenabled()  # someone else's pause is theirs to end
    finally:
        gc.enable()


def test_mcts_resumes_the_collector_once_its_tree_is_freed() -> None:
    state = load_game("hexade").new_initial_state()
    MctsBot(iterations=200).choose(state, TurnContext("g", 1, 0, 0))
    freeing = [t for t in threading.enumerate() if t.name == "mcts-free"]
    assert freeing
    for thread in freeing:
        thread.join()
    assert gc.isenabled()


def _answers_in_time(move_time_s: float) -> None:
    """MCTS answers a person's Teeko move before the deadline less half the reserve, after
    a search of the same length on an earlier move (its tree to free, its garbage)."""
    state = load_game("teeko").new_initial_state()
    bot = MctsBot()
    for seq in range(2):
        state.apply_action(state.legal_actions()[seq])  # the person's move
        deadline = int((time.time() + move_time_s) * 1000)
        move = bot.choose(state.clone(), TurnContext("person-vs-mcts", 2, seq, deadline))
        answered = time.time() * 1000
        assert answered <= deadline - RESERVE * move_time_s * 1000 / 2, (seq, move)
        state.apply_action(state.game.action_of(Move.parse(move)))


def test_mcts_answers_a_person_at_3_s_with_a_margin() -> None:
    _answers_in_time(3.0)


def test_mcts_answers_a_person_at_10_s_with_a_margin() -> None:
    # One bot move only: the person's clock is theirs, the bot's first answer is the test.
    state = load_game("teeko").new_initial_state()
    state.apply_action(state.legal_actions()[0])
    deadline = int((time.time() + 10.0) * 1000)
    MctsBot().choose(state, TurnContext("person-vs-mcts-10", 2, 1, deadline))
    assert time.time() * 1000 <= deadline - RESERVE * 10.0 * 1000 / 2
