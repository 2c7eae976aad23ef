"""Retry backoff: exponential, jittered, capped (tasks.executor.retry_delay)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from tasks.executor import retry_delay

attempts = st.integers(min_value=1, max_value=64)
seconds = st.floats(min_value=0.0, max_value=3600.0, allow_nan=False, allow_infinity=False)


@given(attempt=attempts, base=seconds, cap=seconds)
def test_retry_delay__within_half_and_full_of_the_capped_exponential(
        attempt: int, base: float, cap: float) -> None:
    """delay is in [c/2, c] with c = min(cap, base * 2^(attempt-1)): never above the cap,
    never below half the nominal delay (jitter spreads a thundering herd)."""
    ceiling = min(cap, base * 2 ** (attempt - 1))
    delay = retry_delay(attempt, base, cap)
    assert ceiling * 0.5 <= delay <= ceiling
    assert delay <= cap


@given(base=st.floats(min_value=0.001, max_value=10.0), attempt=st.integers(1, 20))
def test_retry_delay__a_later_retry_never_waits_less(base: float, attempt: int) -> None:
    """The jitter window [c/2, c] doubles per attempt, so whatever the random draws, the
    retry after attempt n+1 waits at least as long as the one after attempt n."""
    cap = base * 2**25
    assert retry_delay(attempt + 1, base, cap) >= retry_delay(attempt, base, cap)


def test_retry_delay__first_retry_with_test_settings() -> None:
    """With the suite's settings (base 0.1 s, cap 1 s) the first retry waits 50-100 ms."""
    assert all(0.05 <= retry_delay(1, 0.1, 1.0) <= 0.1 for _ in range(200))


def test_retry_delay__zero_base_means_immediate_retry() -> None:
    """ONWARD_RETRY_BASE_S=0 is allowed (ge=0) and means no wait at all."""
    assert retry_delay(5, 0.0, 60.0) == 0.0


@given(attempt=st.integers(min_value=1, max_value=100_000))
def test_retry_delay__any_attempt_count_is_capped(attempt: int) -> None:
    """The attempt budget is an unbounded int (ONWARD_STEP_MAX_ATTEMPTS, ``ge=1``): a step on
    its 2000th attempt must still get a capped delay, not an OverflowError that escapes the
    executor's failure path."""
    delay = retry_delay(attempt, 0.5, 60.0)
    assert delay <= 60.0
    if attempt >= 8:  # 0.5 * 2^7 = 64 > 60: the cap binds from here on
        assert delay >= 30.0
