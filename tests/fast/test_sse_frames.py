"""The gateway's SSE frames: each live event rendered once for all of its session's readers, from
its JSON as the stream holds it (not parsed and dumped again)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from cox_gateway import streams
from coxswain import eventlog


def line(seq: int, **extra: Any) -> bytes:
    return json.dumps({"seq": seq, "ts": 1, "type": "tool.result", "sid": "s_1", "output": "é\n" * 3, **extra}).encode()


def test_a_live_event_is_rendered_once_for_every_reader(monkeypatch: pytest.MonkeyPatch) -> None:
    msg = eventlog.Message(line(7) + b"\n" + line(8))
    dumps: list[int] = []
    real = json.dumps

    def counted(obj: Any, **kw: Any) -> str:
        dumps.append(1)
        return real(obj, **kw)

    monkeypatch.setattr(json, "dumps", counted)
    frames = [[streams.frame(ev) for ev in msg.events()] for _ in range(200)]
    assert dumps == [], "a live event's data is its line of the message, not dumped again"
    assert all(f is g for other in frames[1:] for f, g in zip(frames[0], other, strict=True))
    text = frames[0][0].decode()
    head, data = text.split("data: ", 1)
    assert head == "id: 7\nevent: tool.result\n" and data.endswith("\n\n") and "\n" not in data[:-2]
    assert json.loads(data) == {"seq": 7, "ts": 1, "type": "tool.result", "sid": "s_1", "output": "é\n" * 3}
    assert data[:-2].encode() == line(7), "the line as it came"


def test_an_event_read_from_the_stream_is_rendered_as_a_live_one_is() -> None:
    """Same id, event and JSON (a backlog event is dumped compactly; a live one is its line)."""
    raw = json.dumps({"seq": 9, "ts": 1, "type": "agent.message", "text": "a \u2028 é \\ \"q\""},
                     ensure_ascii=False, separators=(",", ":")).encode()
    ev = json.loads(raw)
    shared = eventlog.Message(raw).events()[0]
    assert streams.frame(ev) == streams.frame(shared)
    loose = eventlog.Message(line(9, note="x")).events()[0]
    a, b = streams.frame(json.loads(line(9, note="x"))).decode(), streams.frame(loose).decode()
    assert a.split("data: ")[0] == b.split("data: ")[0] == "id: 9\nevent: tool.result\n"
    assert json.loads(a.split("data: ")[1]) == json.loads(b.split("data: ")[1])
