"""The gateway's SSE frames: each live event rendered once for all of its session's readers."""

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
    assert len(dumps) == 2, f"{len(dumps)} renderings of 2 events for 200 readers"
    assert all(f is g for other in frames[1:] for f, g in zip(frames[0], other, strict=True))
    text = frames[0][0].decode()
    head, data = text.split("data: ", 1)
    assert head == "id: 7\nevent: tool.result\n" and data.endswith("\n\n") and "\n" not in data[:-2]
    assert json.loads(data) == {"seq": 7, "ts": 1, "type": "tool.result", "sid": "s_1", "output": "é\n" * 3}


def test_an_event_read_from_the_stream_is_rendered_as_a_live_one_is() -> None:
    ev = json.loads(line(9, note="x"))
    shared = eventlog.Message(line(9, note="x")).events()[0]
    assert streams.frame(ev) == streams.frame(shared)
