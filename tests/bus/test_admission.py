"""Admission control: the clocked games a runner keeps going follow the platform's lag.

Pure: the heartbeats are values, the clock is a list. Additive increase while turns reach
their bots quickly, multiplicative decrease (once per lag window) when they do not or one
went undelivered, never below one game nor above what was asked; unclocked games are not
limited.
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from services.bus.admission import (
    BACK_OFF,
    FIRST,
    Admission,
    PlatformLag,
    platform_lag,
)
from services.bus.delivery import LAG_WINDOW_S
from services.bus.presence import ALIVE_MS, Beat

NOW = 1_800_000_000_000


def beat(role: str, age_ms: int = 0, **stats: int) -> Beat:
    return Beat(role, "workers", NOW - age_ms, stats=stats)


def test_the_lag_is_the_worst_live_bot_process_s() -> None:
    beats = {
        "w1": beat("bot-random", lag_p99_ms=40, send_p99_ms=5, late=1),
        "w2": beat("bot-mcts", lag_p99_ms=90, send_p99_ms=2, late=2),
        "gone": beat("bot-mcts", age_ms=ALIVE_MS + 1, lag_p99_ms=5_000, late=50),
        "engine": beat("engine", lag_p99_ms=9_999),
    }
    assert platform_lag(beats, NOW) == PlatformLag(lag_ms=90, send_ms=5, late=3)
    assert platform_lag({}, NOW) == PlatformLag()


def test_a_quick_platform_lets_the_limit_grow_to_what_was_asked() -> None:
    admission = Admission(move_time_ms=100, most=200)
    assert admission.limit == FIRST
    limits = [admission.observe(PlatformLag(lag_ms=10)) for _ in range(20)]
    assert limits == sorted(limits) and limits[-1] == 200
    assert admission.room(150) == 50 and admission.room(250) == 0


def test_a_lagging_platform_backs_off_once_per_window_and_never_below_one() -> None:
    now = [0.0]
    admission = Admission(move_time_ms=100, most=200, clock=lambda: now[0])
    slow = PlatformLag(lag_ms=150)  # over half of the (floored) move time
    assert admission.observe(slow) == int(FIRST * BACK_OFF)
    assert admission.observe(slow) == int(FIRST * BACK_OFF), "once per lag window"
    for _ in range(40):
        now[0] += LAG_WINDOW_S
        admission.observe(slow)
    assert admission.limit == 1


def test_an_undelivered_turn_or_a_slow_send_backs_off_too() -> None:
    late = Admission(move_time_ms=1_000, most=64)
    late.observe(PlatformLag(late=4))  # counted before this runner began: its baseline
    assert late.limit > FIRST
    now = late.limit
    late.observe(PlatformLag(late=5))  # one more since: news
    assert late.limit == int(now * BACK_OFF)
    sending = Admission(move_time_ms=1_000, most=64)
    assert sending.observe(PlatformLag(send_ms=200)) == int(FIRST * BACK_OFF)


@given(st.lists(st.integers(0, 5_000), max_size=60), st.integers(1, 500))
def test_unclocked_games_are_never_limited(lags: list[int], most: int) -> None:
    admission = Admission(move_time_ms=0, most=most)
    for ms in lags:
        assert admission.observe(PlatformLag(lag_ms=ms, late=ms)) == most
