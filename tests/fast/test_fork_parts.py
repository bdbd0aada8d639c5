"""Fork and rewind without a server: turn numbers, the transcript a rewind leaves, and the events a
fork's log begins with (renumbered, a compaction's through_seq mapped)."""

from __future__ import annotations

import json
from typing import Any

from cox_runner.forks import copied_events
from cox_runner.transcript import build
from coxswain.turns import rewound, turns


def turn(seq: int, n: str, text: str) -> list[dict[str, Any]]:
    """A turn's events from ``seq`` on: message, start, response, end (4 events)."""
    tid = f"t_{n}"
    return [
        {"seq": seq, "type": "user.msg", "turn_id": tid, "message_id": f"m_{n}", "text": text, "via": "send"},
        {"seq": seq + 1, "type": "turn.start", "turn_id": tid, "message_id": f"m_{n}", "model": "script"},
        {"seq": seq + 2, "type": "assistant.msg", "turn_id": tid, "text": f"re {text}", "finish_reason": "stop",
         "tool_calls": [], "usage": {}},
        {"seq": seq + 3, "type": "turn.end", "turn_id": tid, "outcome": "completed"},
    ]


def users(events: list[dict[str, Any]]) -> list[str]:
    return [e["text"] for e in events if e["type"] == "user.msg"]


def test_turns_are_numbered_in_the_order_they_started_and_rewinds_do_not_renumber() -> None:
    log = [{"seq": 1, "type": "session.created"}, *turn(2, "a", "one"), *turn(6, "b", "two"),
           {"seq": 10, "type": "session.rewound", "to_turn": 1, "scope": "conversation", "through_seq": 5},
           *turn(11, "c", "three")]
    spans = turns(log)
    assert [(s.number, s.turn_id, s.end_seq) for s in spans] == [(1, "t_a", 5), (2, "t_b", 9), (3, "t_c", 14)]
    assert users(rewound(log)) == ["one", "three"]
    # a files rewind leaves the conversation alone
    files = [dict(e, scope="files") if e["type"] == "session.rewound" else e for e in log]
    assert users(rewound(files)) == ["one", "two", "three"]
    # the running turn has no end yet
    assert turns(log[:-1])[-1].end_seq is None


def test_a_rewind_to_a_turn_an_earlier_rewind_dropped_brings_back_that_turns_transcript() -> None:
    log = [*turn(1, "a", "one"), *turn(5, "b", "two"),
           {"seq": 9, "type": "session.rewound", "to_turn": 1, "scope": "both", "through_seq": 4},
           *turn(10, "c", "three"),
           {"seq": 14, "type": "session.rewound", "to_turn": 2, "scope": "conversation", "through_seq": 8},
           *turn(15, "d", "four"),
           {"seq": 19, "type": "session.rewound", "to_turn": 3, "scope": "conversation", "through_seq": 13},
           *turn(20, "e", "five")]
    assert users(rewound(log)) == ["one", "three", "five"]
    assert users(rewound([e for e in log if e["seq"] < 19])) == ["one", "two", "four"]
    b = build(log)
    assert b.seq == 23  # the builder still knows the log's latest seq


def test_a_forks_log_is_the_transcript_renumbered_with_compaction_mapped() -> None:
    log = [{"seq": 1, "type": "session.created", "sid": "s_src"},
           {"seq": 2, "type": "assistant.delta", "sid": "s_src", "text": "x"},
           *turn(3, "a", "one"),
           {"seq": 7, "type": "queue.added", "sid": "s_src", "message_id": "m_q", "position": 1, "text": "q"},
           *turn(8, "b", "two"),
           {"seq": 12, "type": "context.compacted", "sid": "s_src", "before_tokens": 9, "after_tokens": 3,
            "summary": "so far", "through_seq": 10, "dropped": 0},
           *turn(13, "c", "three")]
    out = [json.loads(b) for b in copied_events(log, "s_new", first_seq=2)]
    types = [e["type"] for e in out]
    assert "session.created" not in types and "assistant.delta" not in types and "queue.added" not in types
    assert all(e["sid"] == "s_new" and "seq" not in e and "ts" not in e for e in out)
    # seqs 3..6 -> 2..5, 8..11 -> 6..9; through_seq 10 (turn b's response) -> 8
    compacted = next(e for e in out if e["type"] == "context.compacted")
    assert compacted["through_seq"] == 8
    renumbered = [dict(e, seq=i) for i, e in enumerate(out, start=2)]

    def seen(events: list[dict[str, Any]]) -> list[list[str]]:
        return [[str(getattr(p, "content", "")) for p in m.parts] for m in build(events).messages]

    assert seen(renumbered) == seen(log)
    assert any("so far" in part for msg in seen(renumbered) for part in msg)
