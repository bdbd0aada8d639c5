"""Did a load keep the promises? Read from the event log alone.

- FIFO: each session's turns started in the order its messages were accepted (202 order).
- No overlap: turn.start and turn.end alternate with matching turn ids, a turn never starts
  before the previous one ended (seq and ts), and a turn's work events (model output, tool
  calls, policy decisions) lie between its own start and end.
- Complete: every accepted message ran exactly once, every turn ended ``completed``, and seq
  rises by one with no gap.
- Answered: each turn's last model answer is the one its own message's script asks for (so
  the turn read its message, and the transcript before it, from the log).

A throughput that breaks any of these counts as zero.
"""

from __future__ import annotations

from typing import Any

WORK = frozenset({"assistant.delta", "assistant.msg", "tool.call", "tool.result", "tool.skipped", "policy.decision"})


def check(logs: dict[str, list[dict[str, Any]]], accepted: dict[str, list[str]],
          answers: dict[str, str] | None = None) -> dict[str, Any]:
    """``accepted``: per session, the message ids in the order the API accepted them.
    ``answers``: message id -> the text its turn's last model answer must be (the script says
    so), which shows each turn read its own message from the log."""
    problems: list[str] = []
    fifo = no_overlap = complete = answered = True
    for sid, evs in logs.items():
        if answers:
            last: dict[str, str] = {}
            msg_of = {e["turn_id"]: e["message_id"] for e in evs if e["type"] == "turn.start"}
            for e in evs:
                if e["type"] == "assistant.msg":
                    last[e["turn_id"]] = e.get("text", "")
            for tid, mid in msg_of.items():
                if mid in answers and last.get(tid) != answers[mid]:
                    answered = False
                    problems.append(f"{sid}: turn {tid} answered {last.get(tid)!r}, its message asks for "
                                    f"{answers[mid]!r}")
        seqs = [e["seq"] for e in evs]
        if seqs != list(range(1, len(evs) + 1)):
            complete = False
            problems.append(f"{sid}: seq is not 1..{len(evs)} without gaps")
        starts = [e for e in evs if e["type"] == "turn.start"]
        order = [e["message_id"] for e in starts]
        want = accepted.get(sid, [])
        if order != want:
            if sorted(order) == sorted(want):
                fifo = False
                problems.append(f"{sid}: turns ran in the order {order}, accepted {want}")
            else:
                complete = False
                problems.append(f"{sid}: turns {order} do not match the accepted messages {want}")
        open_turn: str | None = None
        last_end_ts = -1
        for e in evs:
            t = e["type"]
            if t == "turn.start":
                if open_turn is not None or e["ts"] < last_end_ts:
                    no_overlap = False
                    problems.append(f"{sid}: turn {e['turn_id']} started while {open_turn} ran")
                open_turn = e["turn_id"]
            elif t == "turn.end":
                if open_turn != e.get("turn_id"):
                    no_overlap = False
                    problems.append(f"{sid}: turn.end of {e.get('turn_id')} while {open_turn} was open")
                if e.get("outcome") != "completed":
                    complete = False
                    problems.append(f"{sid}: turn {e.get('turn_id')} ended {e.get('outcome')}")
                open_turn = None
                last_end_ts = e["ts"]
            elif t in WORK and e.get("turn_id") != open_turn:
                no_overlap = False
                problems.append(f"{sid}: {t} of turn {e.get('turn_id')} outside it (open: {open_turn})")
        if open_turn is not None:
            complete = False
            problems.append(f"{sid}: turn {open_turn} never ended")
    return {"fifo": fifo, "no_overlap": no_overlap, "complete": complete, "answered": answered,
            "ok": fifo and no_overlap and complete and answered,
            "sessions": len(logs), "problems": problems[:10], "problem_count": len(problems)}
