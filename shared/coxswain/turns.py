"""Turn numbers, and the conversation a rewind leaves (docs/api.md, "Fork and rewind").

A session's turns are numbered from 1 in the order their ``turn.start`` events stand in its log;
a number is never reused (a rewind does not renumber: the turns after it go on counting). A
fork's log begins with the transcript it was forked with, so its turns are numbered within it.

A ``session.rewound`` event with scope ``conversation`` or ``both`` makes the model's transcript
start over from the one it had at the event's ``through_seq``: :func:`rewound` gives the events
the transcript is built from, with every such rewind applied (a rewind to a turn that an earlier
rewind had dropped from the transcript brings back the transcript as that turn saw it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

REWOUND: Final = "session.rewound"
FORKED: Final = "session.forked"
CONVERSATION_SCOPES: Final = frozenset({"conversation", "both"})
FILE_SCOPES: Final = frozenset({"files", "both"})


@dataclass(frozen=True)
class TurnSpan:
    number: int
    turn_id: str
    start_seq: int
    end_seq: int | None
    """The seq of its ``turn.end``; None while it runs."""
    outcome: str | None = None


def turns(events: list[dict[str, Any]]) -> list[TurnSpan]:
    """The session's turns, numbered from 1 in the order they started."""
    starts: list[tuple[str, int]] = []
    ends: dict[str, tuple[int, str | None]] = {}
    for e in events:
        t, tid = e.get("type"), e.get("turn_id")
        if not tid:
            continue
        if t == "turn.start":
            starts.append((str(tid), int(e.get("seq") or 0)))
        elif t == "turn.end" and tid not in ends:
            ends[str(tid)] = (int(e.get("seq") or 0), e.get("outcome"))
    out = []
    for i, (tid, seq) in enumerate(starts, start=1):
        end = ends.get(tid)
        out.append(TurnSpan(number=i, turn_id=tid, start_seq=seq, end_seq=end[0] if end else None,
                            outcome=end[1] if end else None))
    return out


def rewound(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The events the model's transcript is built from: each conversation rewind replaces what
    came before it by the transcript's events as they were at its ``through_seq``."""
    if not any(e.get("type") == REWOUND and e.get("scope") in CONVERSATION_SCOPES for e in events):
        return events
    out: list[dict[str, Any]] = []
    for i, e in enumerate(events):
        if e.get("type") == REWOUND and e.get("scope") in CONVERSATION_SCOPES:
            upto = int(e.get("through_seq") or 0)
            # strictly earlier events only, so this terminates
            out = list(rewound([x for x in events[:i] if int(x.get("seq") or 0) <= upto]))
        else:
            out.append(e)
    return out
