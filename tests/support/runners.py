"""Helpers for tests that kill, pause and restart turn-runners: which one holds a turn (from
its JSON log lines), waiting for a log line, starting a runner again."""

from __future__ import annotations

import contextlib
import json
import time
from typing import Any

import psutil

from .stack import Stack


def records(stack: Stack, instance: str, since: int = 0) -> list[dict[str, Any]]:
    """The JSON log records of ``instance`` (from character ``since`` of its log file)."""
    out = []
    for line in stack.log(instance)[since:].splitlines():
        if line.startswith("{"):
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
    return out


def find(stack: Stack, instance: str, event: str, **match: Any) -> dict[str, Any] | None:
    for rec in records(stack, instance):
        if rec.get("event") == event and all(rec.get(k) == v for k, v in match.items()):
            return rec
    return None


def wait_log(stack: Stack, instance: str, events: tuple[str, ...], timeout: float = 20.0,
             **match: Any) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for ev in events:
            rec = find(stack, instance, ev, **match)
            if rec is not None:
                return rec
        time.sleep(0.05)
    raise AssertionError(f"{instance} logged none of {events} {match} within {timeout}s:\n{stack.log(instance)[-3000:]}")


def holder(stack: Stack, turn_id: str, timeout: float = 10.0) -> tuple[str, dict[str, Any]]:
    """The runner instance that began ``turn_id``, and its log record (with the token)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for name in stack.runner_names():
            rec = find(stack, name, "turn.begin", turn_id=turn_id)
            if rec is not None:
                return name, rec
        time.sleep(0.05)
    raise AssertionError(f"no runner logged turn.begin of {turn_id}")


def running(stack: Stack, marker: str, names: list[str] | None = None,
            timeout: float = 10.0) -> tuple[str, psutil.Process]:
    """The runner (of ``names``, default every one) with a child whose command line has
    ``marker``, and that child, as soon as one has (a drill pauses or kills it at that moment)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for name in names or stack.runner_names():
            with contextlib.suppress(psutil.Error):  # a child that ended while it was looked at
                for p in psutil.Process(stack.procs[name].pid).children(recursive=True):
                    if marker in " ".join(p.cmdline()):
                        return name, p
        time.sleep(0.02)
    raise AssertionError(f"no runner of {names or 'the stack'} runs a command with {marker!r}")


def respawn(stack: Stack, instance: str, env: dict[str, str] | None = None) -> None:
    """Start a runner again under the same instance name (after it was killed)."""
    old = stack.procs.get(instance)
    if old is not None and old.poll() is None:
        stack.resume(instance)  # a paused process would not act on its SIGTERM
        old.terminate()
        old.wait(30)
    if env:
        stack.env.update(env)
    since = len(stack.log(instance))
    stack.spawn(instance, "cox_runner")
    wait_ready(stack, instance, since)


def wait_ready(stack: Stack, instance: str, since: int, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(r.get("event") == "service.started" for r in records(stack, instance, since)):
            return
        if stack.procs[instance].poll() is not None:
            break
        time.sleep(0.05)
    raise AssertionError(f"{instance} did not start:\n{stack.log(instance)[-3000:]}")


