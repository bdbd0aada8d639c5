"""No service holds its event loop for more than 50 ms through ordinary work.

The stack runs with ``loop_stall_ms = 50`` (coxswain/stalls.py): each service logs
``loop.stalled`` (how long, and the stack of the loop thread) when one step holds its loop
longer. The work is what every session does: sends, queued and steered messages, writes with
their versions, a judged command, Leads, a Stop, reads of the log and of versions. A report whose
loop thread spent the time on the CPU (``cpu_ms``) or asleep in the kernel (``blocked_ms``) fails
the test, naming the service and where its loop was held; one with neither was the machine's (the
thread runnable, waiting for a core: the VM paused or another lane ran) and is only printed.

Serial: alone on the machine, so such reports stay rare and the ones that count stand out.
"""

from __future__ import annotations

import json

import pytest

from tests.support.stack import Api, Stack, script, stack_fixture

pytestmark = pytest.mark.serial

CONFIG = '[approval]\ncommands = "judge"\n'
stack = stack_fixture("stalls", runners=2, config=CONFIG, env={"COX_LOOP_STALL_MS": "50"})  # THRESHOLD_MS


def work(label: str, delay_ms: int = 0) -> str:
    return script(
        {"text": f"{label}: writing", "delay_ms": delay_ms,
         "tools": [{"name": "write_file", "args": {"path": f"{label}/a.txt", "content": "one\n" * 50}}]},
        {"tools": [{"name": "list_dir", "args": {"path": "."}}, {"name": "read_file", "args": {"path": f"{label}/a.txt"}}]},
        {"tools": [{"name": "run_command", "args": {"command": f"cat {label}/a.txt"}}]},
        {"tools": [{"name": "write_file", "args": {"path": f"{label}/a.txt", "content": "two\n"}}]},
        {"text": f"{label}: done"},
        text=label,
    )


THRESHOLD_MS = 50


def stalls(stack: Stack) -> list[str]:
    """The reports of a step that held a loop: its own CPU or a blocking call, not a starved process."""
    found = []
    for name in stack.procs:
        for line in stack.log(name).splitlines():
            if "loop.stalled" not in line:
                continue
            report = json.loads(line)
            if report["cpu_ms"] >= THRESHOLD_MS or report["blocked_ms"] >= THRESHOLD_MS:
                found.append(f"{name}: {line}")
            else:
                print(f"{name}: starved, not held: {line}")
    return found


def test_no_service_holds_its_loop_over_50_ms_through_a_session_s_ordinary_work(stack: Stack, api: Api) -> None:
    assert stack.env["COX_LOOP_STALL_MS"] == str(THRESHOLD_MS)
    sids = [api.create(f"stall-{i}")["id"] for i in range(3)]
    for round_ in range(3):
        for sid in sids:
            assert api.send(sid, work(f"r{round_}")).status_code == 202
            assert api.send(sid, work(f"q{round_}"), mode="queue").status_code == 202
        for sid in sids:
            api.wait_idle(sid, timeout=60)
    sid = sids[0]
    before = api.all_events(sid)[-1]["seq"]
    assert api.send(sid, work("long", delay_ms=400)).status_code == 202
    api.wait_type(sid, "turn.start", after=before)
    assert api.http.post(f"/v1/sessions/{sid}/lead", json={"text": "also say hi"}).status_code in (200, 202)
    assert api.send(sid, work("steered"), mode="steer").status_code == 202
    api.wait_idle(sid, timeout=60)
    before = api.all_events(sid)[-1]["seq"]
    assert api.send(sid, work("stopped", delay_ms=2000)).status_code == 202
    api.wait_type(sid, "turn.start", after=before)
    assert api.http.post(f"/v1/sessions/{sid}/stop").status_code in (200, 202)
    api.wait_idle(sid, timeout=60)
    for s in sids:
        assert api.http.get(f"/v1/sessions/{s}/events", params={"format": "json"}).status_code == 200
        kept = api.http.get(f"/v1/sessions/{s}/versions", params={"path": "r0/a.txt"})
        assert kept.status_code == 200 and len(kept.json()["versions"]) >= 2, kept.text
    ends = [e for e in api.all_events(sid) if e["type"] == "turn.end"]
    assert {e["outcome"] for e in ends} >= {"completed"}, ends
    found = stalls(stack)
    assert found == [], "\n".join(found[:10])
