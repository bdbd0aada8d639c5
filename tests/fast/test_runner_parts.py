"""The runner's parts: a handler for every tool, and the pure budget's rules (the imports' order,
which rules out a cycle, is tests/fast/test_layers.py)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from cox_runner import handlers
from cox_runner.budget import Budget
from cox_runner.drive import take_renewal
from cox_runner.leases import Drive
from cox_runner.turn import Turn
from cox_runner.workspace import tools
from coxswain.config import LimitsConfig, SoftLimits


def test_every_tool_has_a_handler() -> None:
    assert set(handlers.HANDLERS) == set(tools.TOOL_NAMES)


def _budget(**limits: object) -> Budget:
    return Budget(LimitsConfig(**limits), started=100.0)


def test_hard_limits_before_a_call() -> None:
    b = _budget(tool_calls=2, actions=1)
    assert b.call_limit(is_action=True) is None
    b.tool_calls, b.actions = 1, 1
    assert b.call_limit(is_action=False) is None
    assert b.call_limit(is_action=True) == ("actions", 1)
    b.tool_calls = 2
    assert b.call_limit(is_action=False) == ("tool_calls", 2)


def test_time_spent_waiting_for_the_person_is_not_work() -> None:
    b = _budget(seconds=10)
    b.waited = 4.0
    assert b.elapsed(now=108.0) == 4.0
    assert b.time_left(now=108.0) == 6.0


def test_soft_limits_are_due_once_and_only_below_their_hard_limit() -> None:
    b = _budget(tool_calls=10, tokens=100, soft=SoftLimits(tool_calls=3, tokens=500))
    b.tool_calls, b.tokens = 3, 1000
    due = b.soft_due(now=100.0)
    assert [d.limit for d in due] == ["tool_calls"], "a soft limit above its hard one is no checkpoint"
    assert due[0].value == 3 and due[0].soft == 3 and due[0].hard == 10
    assert b.soft_due(now=100.0) == [], "each soft limit asks once per turn"


def test_spend_and_tokens_after_a_response() -> None:
    b = _budget(tokens=100, spend=0.5)
    b.add_response(60, 0.2)
    assert not b.tokens_over() and not b.spend_over()
    b.add_response(40, 0.3)
    assert b.tokens_over() and b.spend_over()


def test_stuck_and_malformed() -> None:
    b = _budget(stuck_repeats=3)
    assert not b.stuck("list_dir", "{}", "a") and not b.stuck("list_dir", "{}", "a")
    assert b.stuck("list_dir", "{}", "a")
    assert not b.stuck("list_dir", "{}", "b")
    assert not b.malformed_round(True)
    assert b.malformed_round(True)
    assert not b.malformed_round(False)



def test_what_the_guards_will_say_counts_nothing() -> None:
    """The round's last call asks before its result is recorded (the Leads go with that record
    only if the turn goes on): the look ahead agrees with the guard and changes nothing."""
    b = _budget(stuck_repeats=3)
    for _ in range(2):
        assert not b.would_stick("list_dir", "{}", "a") and not b.stuck("list_dir", "{}", "a")
    out = "a"
    assert b.would_stick("list_dir", "{}", out) and b.would_stick("list_dir", "{}", out)
    assert not b.would_stick("list_dir", '{"path": "x"}', out) and not b.would_stick("read_file", "{}", out)
    assert b.stuck("list_dir", "{}", out), "the look ahead counted nothing; the guard counts this one"
    assert not b.would_fail_round(False) and not b.would_fail_round(True)
    assert not b.malformed_round(True)
    assert b.would_fail_round(True) and b.would_fail_round(True) and not b.would_fail_round(False)
    assert b.malformed_round(True)


def test_the_look_ahead_serializes_no_arguments_when_the_calls_before_differ() -> None:
    """Once a response: a call's arguments as JSON and a hash of its output cost microseconds
    each; they are needed only when the calls before it were the same call with the same result."""
    b = _budget(stuck_repeats=3)
    asked: list[str] = []

    def args() -> str:
        asked.append("args")
        return "{}"

    assert not b.would_stick("list_dir", args, "a") and asked == [], "nothing before it"
    b.stuck("list_dir", "{}", "a")
    b.stuck("read_file", "{}", "a")
    assert not b.would_stick("list_dir", args, "a") and asked == [], "the two before it differ"
    b.stuck("read_file", "{}", "a")
    assert b.would_stick("read_file", lambda: "{}", "a") and not b.would_stick("read_file", args, "b")
    assert asked == ["args"]


def test_a_half_done_writes_cleanup_survives_a_second_cancellation() -> None:
    """A turn that loses its lease is cancelled twice (deadline, then renewal): the cleanup of a
    staged write must still run to its end (CI once found temp files left behind)."""

    done: list[str] = []

    class Log:
        def warning(self, *a: object, **k: object) -> None:
            done.append("warned")

    async def cleanup() -> None:
        await asyncio.sleep(0.05)
        done.append("cleaned")

    async def writer() -> None:
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            await handlers._settle_apart(cleanup(), Log(), "a.txt")
            raise

    async def main() -> None:
        task = asyncio.ensure_future(writer())
        await asyncio.sleep(0.01)
        task.cancel()
        await asyncio.sleep(0.01)
        task.cancel()  # the second cancellation lands while the cleanup runs
        try:
            await task
        except asyncio.CancelledError:
            pass
        assert task.cancelled()
        await asyncio.sleep(0.1)

    asyncio.run(main())
    assert done == ["cleaned"]


def test_a_renewal_s_flags_reach_only_the_turn_they_were_read_for() -> None:
    """A renewal sent while one turn ran can be answered after the next has begun (the reply
    is late, or the Lua ran just before the turn ended): its stop flag was that turn's. Seen in
    CI: a steered turn ended "stopped: steer requested" after its first response, stopped by
    the steer that had started it."""
    async def go() -> None:
        d = Drive(sid="s_1", token="3")
        d.turn = Turn(sid="s_1", turn_id="t_new", token="3", message_id="m_2", text="next", via="steer",
                      workspace=Path("."), model="script")
        head = {"stop": "steer", "leads": 1, "observed": 0, "dont_ask": False, "turn_id": "t_old"}
        take_renewal(d, head)
        assert not d.turn.stopping and not d.turn.leads_waiting
        take_renewal(d, {**head, "turn_id": "t_new"})
        assert d.turn.stopping and d.turn.stop_reason == "steer" and d.turn.leads_waiting

    asyncio.run(go())
