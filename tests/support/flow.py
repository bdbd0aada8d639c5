"""Helpers for policy and versions tests: follow a turn's tool calls and answer its approvals."""

from __future__ import annotations

import time
from typing import Any

import httpx

from .stack import Api, Stack


def patch(api: Api, sid: str, **body: Any) -> dict[str, Any]:
    r = api.http.patch(f"/v1/sessions/{sid}", json=body)
    assert r.status_code == 200, r.text
    return dict(r.json())


def answer(api: Api, sid: str, approval_id: str, decision: str, scope: str = "once",
           message: str | None = None) -> None:
    body: dict[str, Any] = {"decision": decision, "scope": scope}
    if message:
        body["message"] = message
    r = api.http.post(f"/v1/sessions/{sid}/approvals/{approval_id}", json=body)
    assert r.status_code == 200, r.text


def next_approval(api: Api, sid: str, after: int = 0, timeout: float = 30.0) -> dict[str, Any]:
    return api.wait_type(sid, "approval.pending", timeout=timeout, after=after)


def call_ids(evs: list[dict[str, Any]], name: str | None = None) -> list[str]:
    return [e["call_id"] for e in evs if e["type"] == "tool.call" and (name is None or e["name"] == name)]


def of_call(evs: list[dict[str, Any]], call_id: str, type_: str) -> list[dict[str, Any]]:
    return [e for e in evs if e["type"] == type_ and e.get("call_id") == call_id]


def result(evs: list[dict[str, Any]], call_id: str) -> dict[str, Any]:
    found = of_call(evs, call_id, "tool.result")
    assert found, f"no tool.result for {call_id}"
    return found[0]


def final_decision(evs: list[dict[str, Any]], call_id: str) -> dict[str, Any]:
    found = of_call(evs, call_id, "policy.decision")
    assert found, f"no policy.decision for {call_id}"
    return found[-1]


def run_turn(api: Api, sid: str, text: str, timeout: float = 60.0) -> list[dict[str, Any]]:
    """Send ``text``, wait for its turn to end, and return the events of that turn."""
    start = api.all_events(sid)
    after = start[-1]["seq"] if start else 0
    r = api.send(sid, text)
    assert r.status_code == 202, r.text
    api.wait_type(sid, "turn.end", timeout=timeout, after=after)
    return [e for e in api.all_events(sid) if e["seq"] > after]


def last_seq(api: Api, sid: str) -> int:
    evs = api.all_events(sid)
    return evs[-1]["seq"] if evs else 0


def respawn(stack: Stack, names: list[str], env: dict[str, str], timeout: float = 60.0) -> None:
    """Restart some services of a running stack with extra environment (config overrides)."""
    for name in names:
        stack.kill(name)
    stack.env.update(env)
    modules = {"guard": "cox_guard", "judge": "cox_judge", "versions": "cox_versions", "gateway": "cox_gateway"}
    for name in names:
        stack.spawn(name, modules[name])
    # The old processes are gone (killed and reaped), so a 200 from healthz means the new ones answer.
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(stack.url + "/healthz", timeout=3).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise AssertionError(f"{names} did not come back: {stack.all_logs()[-3000:]}")


def run_allowing(api: Api, sid: str, text: str, timeout: float = 90.0) -> list[dict[str, Any]]:
    """Send ``text`` and allow every approval its turn asks for (a security confirm included: a
    command's own path can read as taint once an error message has echoed it). The sandbox must
    hold even for what a person allows."""
    after = int(api.session(sid)["last_seq"])
    assert api.send(sid, text).status_code == 202
    seen = after
    while True:
        ev = api.wait_for(sid, lambda e: e["type"] in ("approval.pending", "turn.end"), timeout, after=seen)
        seen = ev["seq"]
        if ev["type"] == "turn.end":
            return [e for e in api.all_events(sid) if e["seq"] > after]
        answer(api, sid, ev["approval_id"], "allow")
