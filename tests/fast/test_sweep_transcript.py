"""``cox run`` without a server: its compact transcript, its JSON lines, its body and its exit codes
for the usage errors it finds before any request."""

from __future__ import annotations

import argparse
import io
import json
from typing import Any

import pytest

from cox.main import main
from cox.run import Transcript, build_parser, exit_code, run_body, show_json


def lines(*evs: dict[str, Any]) -> list[str]:
    t = Transcript(io.StringIO())
    return [x for ev in evs if (x := t.line({"sid": "s_1", **ev})) is not None]


def test_the_transcript_is_short_and_says_how_the_run_ended() -> None:
    script = 'fix it\n```script\n[{"text": "x"}]\n```'
    out = lines(
        {"type": "run.start", "confirm": "judge", "unattended": True, "max_turns": 4},
        {"type": "user.msg", "text": script},
        {"type": "assistant.delta", "text": "Look"},
        {"type": "assistant.msg", "text": "Looking.\nSecond line.", "tool_calls": []},
        {"type": "tool.call", "call_id": "c1", "name": "run_command", "args": {"command": "ls -la"}},
        {"type": "policy.decision", "call_id": "c1", "verdict": "allow", "actor": "judge"},
        {"type": "tool.result", "call_id": "c1", "ok": True, "output": "exit code 0\na\nb"},
        {"type": "tool.call", "call_id": "c2", "name": "write_file", "args": {"path": "b.txt", "content": "x"}},
        {"type": "policy.decision", "call_id": "c2", "verdict": "refuse", "actor": "policy", "reason": "protected"},
        {"type": "tool.result", "call_id": "c2", "ok": False, "output": ""},
        {"type": "tool.call", "call_id": "c3", "name": "plan_write", "args": {"steps": ["a"]}},
        {"type": "approval.pending", "approval_id": "a_1", "name": "run_command", "args": {"command": "rm x"}},
        {"type": "turn.end", "outcome": "completed"},
        {"type": "user.msg", "text": "plain"},
        {"type": "turn.end", "outcome": "error", "detail": "boom"},
        {"type": "run.end", "outcome": "max_turns", "turns": 4},
        {"type": "run.end", "outcome": "completed", "turns": 1},
    )
    assert out == [
        "run s_1: confirm judge, unattended, at most 4 turns",
        "> fix it",
        "  Looking.\n  Second line.",
        "  $ ls -la",
        "    ok: exit code 0  (+2 lines)",
        "  write_file b.txt",
        "    refused by policy: protected",
        "    failed",
        '  plan_write {"steps": ["a"]}',
        "  ? approval a_1 for $ rm x: answer it in the console or with cox chat s_1",
        "turn ended completed",
        "> plain",
        "turn ended error: boom",
        "run ended max_turns after 4 turns",
        "run ended completed after 1 turn",
    ]


def test_json_lines_are_the_events_but_the_deltas() -> None:
    buf = io.StringIO()
    for ev in ({"seq": 1, "type": "assistant.delta", "text": "a"}, {"seq": 2, "type": "run.end", "outcome": "completed"}):
        show_json(ev, buf)
    assert [json.loads(x) for x in buf.getvalue().splitlines()] == [{"seq": 2, "type": "run.end", "outcome": "completed"}]


def test_exit_codes_and_the_body() -> None:
    assert exit_code("completed") == 0
    assert [exit_code(o) for o in ("max_turns", "stopped", "error", None)] == [1, 1, 1, 1]
    p = argparse.ArgumentParser()
    build_parser(p)
    a = p.parse_args(["hi"])
    assert run_body(a, "hi") == {"text": "hi", "confirm": "person", "unattended": False}
    a = p.parse_args(["--workspace", "w", "--model", "m", "--yolo", "--unattended", "--max-turns", "3", "hi"])
    assert run_body(a, "hi") == {"text": "hi", "confirm": "yolo", "unattended": True, "workspace": "w", "model": "m",
                                 "max_turns": 3}
    assert run_body(p.parse_args(["--judge", "x"]), "x")["confirm"] == "judge"


def test_usage_errors_exit_2(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
                             tmp_path: Any) -> None:
    monkeypatch.delenv("COX_TOKEN", raising=False)
    monkeypatch.chdir(tmp_path)
    url = ["--url", "http://127.0.0.1:9"]
    assert main(["run", *url, "hi"]) == 2
    assert "no token" in capsys.readouterr().err
    assert main(["run", *url, "--token", "t", "--max-turns", "0", "hi"]) == 2
    assert "--max-turns must be at least 1" in capsys.readouterr().err
    monkeypatch.setattr("sys.stdin", io.StringIO("  \n"))
    assert main(["run", *url, "--token", "t", "-"]) == 2
    assert "the text is empty" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        main(["run", "--judge", "--yolo", "hi"])
    assert exc.value.code == 2
    # nothing listens there: a connection error is 2 as well
    assert main(["run", *url, "--token", "t", "hi"]) == 2
    assert "the gateway did not answer" in capsys.readouterr().err
