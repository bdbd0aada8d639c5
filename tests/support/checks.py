"""Checks on a session's event log that every turn test makes (no servers here, only the log)."""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

from .stack import Api, Stack

CLOSING = ("tool.result", "tool.skipped")


def of_type(evs: list[dict[str, Any]], *types: str) -> list[dict[str, Any]]:
    return [e for e in evs if e["type"] in types]


def one(evs: list[dict[str, Any]], type_: str, **match: Any) -> dict[str, Any]:
    found = [e for e in evs if e["type"] == type_ and all(e.get(k) == v for k, v in match.items())]
    assert len(found) == 1, f"expected one {type_} {match}, found {len(found)}: {found}"
    return found[0]


def calls_closed(evs: list[dict[str, Any]]) -> None:
    """The model never sees a tool call without its result: every call an ``assistant.msg`` asked
    for is closed exactly once (``tool.result`` or ``tool.skipped``), after the response that asked
    for it and before the next model response or the turn's end."""
    closed = Counter(e["call_id"] for e in of_type(evs, *CLOSING))
    asked: list[str] = []
    open_calls: set[str] = set()
    for e in evs:
        if e["type"] in ("assistant.msg", "turn.end"):
            assert not open_calls, f"calls {open_calls} had no result before seq {e['seq']} ({e['type']})"
        if e["type"] == "assistant.msg":
            ids = [c["call_id"] for c in e.get("tool_calls") or []]
            asked += ids
            open_calls = set(ids)
        elif e["type"] in CLOSING:
            assert e["call_id"] in open_calls, f"{e['type']} for a call that is not open: {e}"
            open_calls.discard(e["call_id"])
    assert not open_calls, f"calls {open_calls} never got a result"
    for cid in asked:
        assert closed[cid] == 1, f"call {cid} closed {closed[cid]} times"
    assert set(closed) <= set(asked)


def seqs_rise(evs: list[dict[str, Any]]) -> None:
    assert [e["seq"] for e in evs] == list(range(1, len(evs) + 1)), "seq rises by one with no gap"


def finished(api: Api, sid: str, after: int = 0, timeout: float = 30.0) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Wait for the next ``turn.end`` and for the session to go idle; the end and the whole log."""
    end = api.wait_type(sid, "turn.end", timeout=timeout, after=after)
    api.wait_idle(sid, timeout=timeout)
    evs = api.all_events(sid)
    calls_closed(evs)
    seqs_rise(evs)
    return end, evs


def last_seq(api: Api, sid: str) -> int:
    """The seq of the session's latest recorded event (from the session object: reading the log
    until it runs dry never ends while a fast turn keeps writing)."""
    return int(api.session(sid)["last_seq"])


def holder(stack: Stack, sid: str, timeout: float = 10.0) -> str:
    """The turn-runner instance running ``sid``'s turn (from its ``turn.start`` log line)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for name in stack.runner_names():
            for line in stack.log(name).splitlines():
                if f'"sid": "{sid}"' in line and '"event": "turn.begin"' in line:
                    return name
        time.sleep(0.05)
    raise AssertionError(f"no runner logged a turn of {sid}")
