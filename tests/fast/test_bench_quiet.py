"""A bench run waits, bounded, for a quiet machine before it starts: a run started right after
tests or a build was flagged "loaded" by the 1-minute load average, though it ran alone."""

from __future__ import annotations

from bench.__main__ import wait_quiet


def test_a_run_waits_until_the_load_average_falls_to_half_the_cores() -> None:
    readings = iter([1.6, 1.3, 1.05, 0.9, 0.5])
    slept: list[float] = []
    waited = wait_quiet(2, 180, read=lambda: (next(readings), 0.0, 0.0), sleep=slept.append, step_s=5)
    # 1.6, 1.3, 1.05 over 1.0: three pauses; 0.9 is quiet enough (one reading a look)
    assert slept == [5, 5, 5]
    assert waited == 15


def test_the_wait_is_bounded_and_a_quiet_machine_or_a_zero_bound_does_not_wait() -> None:
    slept: list[float] = []
    assert wait_quiet(2, 12, read=lambda: (3.0, 0.0, 0.0), sleep=slept.append, step_s=5) == 12
    assert slept == [5, 5, 2]
    slept.clear()
    assert wait_quiet(2, 180, read=lambda: (0.4, 0.0, 0.0), sleep=slept.append) == 0
    assert wait_quiet(2, 0, read=lambda: (3.0, 0.0, 0.0), sleep=slept.append) == 0
    assert slept == []
