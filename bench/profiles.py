"""How much each phase does: the full run (under 20 minutes on a quiet 2-core box) and --quick."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Counts:
    name: str
    floor_n: int = 2000
    """Round trips per floor."""
    send_n: int = 2000
    send_sessions: int = 20
    tool_calls: int = 200
    tool_turns: int = 5
    lead_n: int = 300
    handoff_rounds: int = 100
    """Sessions of one running turn + 5 queued: 5 hand-offs each."""
    latency_repeats: int = 3
    """Times the latency phases (send, tool_calls, lead, handoff) run, each with the counts above,
    interleaved (send, tool calls, lead, hand-off, then again): each figure is the median of the
    repeats', with the lowest and highest beside it (bench/README.md). One run of the same code
    moved these rows by 20-70% between runs an hour apart on the 2-core VMs (ANALYSIS.md)."""
    chat_sessions: int = 10
    chat_turns: int = 120
    """Turns each chat session takes, each sent when the last ended (bench/chat.py)."""
    chat_window: int = 20
    """Rounds metered at the start and at the end of the chat."""
    sweep_sessions: tuple[int, ...] = (10, 100, 1000)
    sweep_runners: tuple[int, ...] = (1, 2, 4)
    sweep_messages: int = 5
    sweep_delay_ms: int = 50
    sweep_timeout_s: float = 240.0
    memory_sessions: int = 10_000
    runner_starts: int = 5
    """Runners started into the memory phase's stack, each way (bench/startup.py)."""
    sandbox_n: int = 500
    """Commands (``true``) each way, bwrap and bare."""
    runs_tasks: int = 1000
    """Scripted tasks started with POST /v1/runs per runner count (bench/runs.py)."""
    runs_runners: tuple[int, ...] = (1, 2, 4)
    runs_delay_ms: int = 50
    runs_interactive_n: int = 30
    runs_timeout_s: float = 600.0
    compose_adds: int = 3
    """Runners added one at a time with ``docker compose up --scale`` (bench/compose.py)."""
    peer_threads: tuple[int, ...] = (10, 100)
    peer_steer_n: int = 30
    peer_dbos_poll_s: float = 0.01
    """DBOS's queue polling interval (its default is 1.0 s; lower is DBOS's own answer to latency,
    paid in polling CPU): bench/peer/dbos.py."""


FULL = Counts(name="full")
QUICK = Counts(
    name="quick", floor_n=500, send_n=200, send_sessions=10, tool_turns=2, lead_n=30, handoff_rounds=10, latency_repeats=1,
    chat_sessions=5, chat_turns=40, chat_window=10,
    sweep_sessions=(10, 50), sweep_runners=(1, 2), sweep_timeout_s=60.0, memory_sessions=1000, runner_starts=3, sandbox_n=100,
    peer_threads=(10,), peer_steer_n=5, runs_tasks=100, runs_runners=(1, 2), runs_interactive_n=10,
    runs_timeout_s=120.0, compose_adds=1,
)
