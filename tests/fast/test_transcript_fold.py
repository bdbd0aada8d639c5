"""A kept transcript with the log's new events folded in is the transcript the whole log builds.

A runner keeps the transcript a drive left when its session went idle, and the session's next
turn there folds in only the events recorded since (``LogReader.history``). The law: for any log
and any point where the kept transcript stops, ``extend(build(head), tail)`` gives the model the
same messages as ``build(head + tail)``, whenever ``foldable(tail)``. The cases the fold cannot
take (a conversation rewind, an attachment withheld afterwards) are shown to give a different
transcript when folded anyway, so ``foldable`` refusing them is what keeps the law.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic_ai.messages import ModelMessagesTypeAdapter

from cox_runner import transcript

FILES = transcript.AttachmentFiles(root=Path("/nonexistent-root"), store_dir=".coxswain", workspace=Path("/nonexistent-ws"))


def _untimed(x: Any) -> Any:
    if isinstance(x, dict):
        return {k: _untimed(v) for k, v in x.items() if k != "timestamp"}
    if isinstance(x, list):
        return [_untimed(v) for v in x]
    return x


def _dump(b: transcript.Builder) -> tuple[Any, int, int]:
    """What the model is sent (every part's creation time aside), the seq covered, made-up returns."""
    msgs = ModelMessagesTypeAdapter.dump_python(b.request_messages("system"), mode="json")
    return _untimed(msgs), b.seq, b.synthesized


@st.composite
def logs(draw: st.DrawFn, rewinds: bool = False, withheld: bool = False) -> list[dict[str, Any]]:
    """A session's log: turns of user messages, responses with tool calls, their results or
    skips (some never recorded), noise events the transcript ignores, and optionally rewinds and
    withheld attachments."""
    out: list[dict[str, Any]] = []
    calls: list[str] = []
    n_calls = 0
    kinds = ["user", "user", "assistant", "assistant", "result", "result", "skipped", "noise"]
    if rewinds:
        kinds.append("rewind")
    if withheld:
        kinds.append("withheld")
    for _ in range(draw(st.integers(0, 40))):
        seq = len(out) + 1
        kind = draw(st.sampled_from(kinds))
        if kind == "user":
            ev: dict[str, Any] = {"type": "user.msg", "text": f"message {seq}",
                                  "via": draw(st.sampled_from(["send", "lead", "approval", "queue"]))}
            if draw(st.booleans()) and withheld:
                ev["attachments"] = [{"attachment_id": f"a{seq}", "name": "key.txt", "media_type": "text/plain",
                                      "size": 3, "sha256": "0" * 64}]
        elif kind == "assistant":
            k = draw(st.integers(0, 3))
            ids = [f"c{n_calls + i}" for i in range(k)]
            n_calls += k
            calls = list(ids)
            ev = {"type": "assistant.msg", "text": draw(st.sampled_from(["", f"answer {seq}"])),
                  "tool_calls": [{"call_id": c, "name": "read_file", "args": {"path": c}} for c in ids],
                  "finish_reason": "tool_call" if ids else "stop"}
        elif kind in ("result", "skipped"):
            known = bool(calls) and draw(st.integers(0, 4)) > 0
            call = draw(st.sampled_from(calls)) if known else f"c-unknown-{seq}"
            ev = ({"type": "tool.result", "call_id": call, "ok": True, "output": f"out {seq}",
                   "observed": [{"command": "ls", "output": "x"}] if draw(st.integers(0, 5)) == 0 else None}
                  if kind == "result" else
                  {"type": "tool.skipped", "call_id": call, "reason": draw(st.sampled_from(["lead", "stop", "odd"]))})
        elif kind == "rewind":
            ev = {"type": "session.rewound", "scope": draw(st.sampled_from(["conversation", "both", "files"])),
                  "through_seq": draw(st.integers(0, seq - 1))}
        elif kind == "withheld":
            ev = {"type": "attachment.withheld", "attachment_id": f"a{draw(st.integers(1, seq))}"}
        else:
            ev = {"type": draw(st.sampled_from(["turn.start", "turn.end", "usage", "approval.pending"]))}
        out.append({"seq": seq, **ev})
    return out


@settings(max_examples=300, deadline=None)
@given(log=logs(rewinds=True, withheld=True), cut=st.integers(0, 40))
def test_a_foldable_tail_folds_into_the_same_transcript(log: list[dict[str, Any]], cut: int) -> None:
    # a rewind or a withheld attachment in the head is the head's business: build takes it
    cut = min(cut, len(log))
    head, tail = log[:cut], log[cut:]
    if not transcript.foldable(tail):
        return
    kept = transcript.build(head, FILES)
    assert _dump(transcript.extend(kept, tail, FILES)) == _dump(transcript.build(log, FILES))


@settings(max_examples=200, deadline=None)
@given(log=logs(), cut=st.integers(0, 40))
def test_a_log_without_rewinds_or_withheld_folds_at_any_point(log: list[dict[str, Any]], cut: int) -> None:
    cut = min(cut, len(log))
    assert transcript.foldable(log[cut:])
    kept = transcript.build(log[:cut], FILES)
    assert _dump(transcript.extend(kept, log[cut:], FILES)) == _dump(transcript.build(log, FILES))


def _turns(*texts: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for t in texts:
        out.append({"seq": len(out) + 1, "type": "user.msg", "text": t, "via": "send"})
        out.append({"seq": len(out) + 1, "type": "assistant.msg", "text": f"re {t}", "tool_calls": [],
                    "finish_reason": "stop"})
        out.append({"seq": len(out) + 1, "type": "turn.end"})
    return out


def test_a_conversation_rewind_in_the_tail_is_not_foldable() -> None:
    log = _turns("one", "two")
    rewind = {"seq": len(log) + 1, "type": "session.rewound", "scope": "conversation", "through_seq": 3}
    after = {"seq": len(log) + 2, "type": "user.msg", "text": "three", "via": "send"}
    tail = [rewind, after]
    full = transcript.build([*log, *tail], FILES)
    folded = transcript.extend(transcript.build(log, FILES), tail, FILES)
    assert _dump(folded) != _dump(full)  # folded anyway, turn two would stay in
    assert not transcript.foldable(tail)
    assert transcript.foldable([{**rewind, "scope": "files"}, after])  # a files rewind leaves the transcript


def test_an_attachment_withheld_after_its_message_is_not_foldable() -> None:
    msg = {"seq": 1, "type": "user.msg", "text": "see the file", "via": "send",
           "attachments": [{"attachment_id": "a1", "name": "key.txt", "media_type": "text/plain", "size": 3,
                            "sha256": "0" * 64}]}
    tail = [{"seq": 2, "type": "attachment.withheld", "attachment_id": "a1"},
            {"seq": 3, "type": "user.msg", "text": "and now?", "via": "send"}]
    full = transcript.build([msg, *tail], FILES)
    folded = transcript.extend(transcript.build([msg], FILES), tail, FILES)
    assert _dump(folded) != _dump(full)  # folded anyway, the earlier message would keep showing it
    assert not transcript.foldable(tail)
