"""``cox sweep``'s task file and plan without a server: every good shape parses, every bad line is
named with its line number and what is wrong, and the plan runs each task on the right models."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cox.main import main
from cox.sweep_plan import MAX_ERRORS, SweepFileError, Task, load_tasks, parse_models, parse_tasks, plan


def errors_of(text: str) -> list[str]:
    with pytest.raises(SweepFileError) as err:
        parse_tasks(text, "t.jsonl")
    return err.value.messages


def test_tasks_parse_in_file_order_with_blank_lines_skipped() -> None:
    text = "\n".join([
        json.dumps({"id": "a", "prompt": "fix it"}),
        "",
        "   ",
        json.dumps({"id": "b", "prompt": "p", "template": "repo", "model": "script", "check": "pytest -q",
                    "max_turns": 3}),
    ]) + "\n"
    a, b = parse_tasks(text)
    assert a == Task(id="a", prompt="fix it")
    assert (b.id, b.template, b.model, b.check, b.max_turns) == ("b", "repo", "script", "pytest -q", 3)


@pytest.mark.parametrize(("line", "expected"), [
    ('{"id": "a", "prompt": "x"', "t.jsonl:1: not JSON"),
    ('["a", "x"]', "t.jsonl:1: a task is a JSON object {id, prompt, ...}, not list"),
    ('{"id": "a"}', "t.jsonl:1: prompt: missing (a task has id, prompt, template, model, check, max_turns)"),
    ('{"id": "a", "promt": "x", "prompt": "y"}', "t.jsonl:1: promt: unknown field (a task has id, prompt"),
    ('{"id": 7, "prompt": "x"}', "t.jsonl:1: id: Input should be a valid string"),
    ('{"id": "", "prompt": "x"}', "t.jsonl:1: id: String should have at least 1 character"),
    ('{"id": "a", "prompt": "x", "max_turns": "3"}', "t.jsonl:1: max_turns: Input should be a valid integer"),
    ('{"id": "a", "prompt": "x", "max_turns": 0}', "t.jsonl:1: max_turns: Input should be greater than or equal to 1"),
    ('{"id": "a", "prompt": "x", "max_turns": true}', "t.jsonl:1: max_turns: Input should be a valid integer"),
    ('{"id": "a", "prompt": "x", "check": ""}', "t.jsonl:1: check: String should have at least 1 character"),
])
def test_a_bad_line_is_named_with_what_is_wrong(line: str, expected: str) -> None:
    messages = errors_of(line)
    assert len(messages) == 1 and messages[0].startswith(expected), messages


def test_every_bad_line_is_reported_not_only_the_first_and_ids_are_unique() -> None:
    text = "\n".join([
        json.dumps({"id": "a", "prompt": "x"}),
        "nope",
        json.dumps({"id": "a", "prompt": "again"}),
        json.dumps({"id": "c"}),
    ])
    messages = errors_of(text)
    assert messages[0].startswith("t.jsonl:2: not JSON")
    assert messages[1] == "t.jsonl:3: id 'a' is already the id of line 1"
    assert messages[2].startswith("t.jsonl:4: prompt: missing")
    assert len(messages) == 3


def test_a_file_of_bad_lines_reports_a_bounded_number() -> None:
    messages = errors_of("\n".join("x" for _ in range(50)))
    assert len(messages) == MAX_ERRORS + 1 and messages[-1] == f"... and {50 - MAX_ERRORS} more"


def test_an_empty_file_and_a_missing_or_binary_one_are_errors(tmp_path: Path) -> None:
    assert errors_of("\n\n")[0].startswith("t.jsonl: no tasks")
    with pytest.raises(SweepFileError, match="cannot read it"):
        load_tasks(tmp_path / "missing.jsonl")
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(b'{"id": "a", "prompt": "x"}\n{"id": "b", "prompt": "\xff"}\n')
    with pytest.raises(SweepFileError, match=r"bad.jsonl:2: not UTF-8"):
        load_tasks(bad)


def test_models_flag_and_the_plan() -> None:
    assert parse_models(None) is None
    assert parse_models(" a, b,,a ") == ["a", "b"]
    with pytest.raises(SweepFileError, match="no model named"):
        parse_models(" , ")
    tasks = [Task(id="t1", prompt="x"), Task(id="t2", prompt="y", model="claude")]
    assert [u.key for u in plan(tasks, None, "script", ["script", "claude"])] == [("t1", "script"), ("t2", "claude")]
    # --models overrides a task's own model: every task on each, task by task
    assert [u.key for u in plan(tasks, ["script", "claude"], "script", ["script", "claude"])] == [
        ("t1", "script"), ("t1", "claude"), ("t2", "script"), ("t2", "claude")]
    with pytest.raises(SweepFileError, match="unknown model 'gpt': the server offers claude, script"):
        plan(tasks, ["gpt"], "script", ["script", "claude"])


def test_usage_errors_exit_2_before_any_connection(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("COX_TOKEN", raising=False)
    monkeypatch.chdir(tmp_path)
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text('{"id": "a"}\n')
    # nothing listens on this port: a usage error must be found before any request
    url = ["--url", "http://127.0.0.1:9"]
    assert main(["sweep", str(tasks), "--out", str(tmp_path / "r.jsonl"), "--token", "t", *url]) == 2
    assert "tasks.jsonl:1: prompt: missing" in capsys.readouterr().err
    tasks.write_text('{"id": "a", "prompt": "x"}\n')
    assert main(["sweep", str(tasks), "--out", str(tmp_path / "r.jsonl"), *url]) == 2
    assert "no token" in capsys.readouterr().err
    assert main(["sweep", str(tasks), "--out", str(tmp_path / "nowhere" / "r.jsonl"), "--token", "t", *url]) == 2
    assert "--out: no folder" in capsys.readouterr().err
    assert main(["sweep", str(tasks), "--out", str(tmp_path / "r.jsonl"), "--parallel", "0", "--token", "t", *url]) == 2
    assert "--parallel must be 1 to 64" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        main(["sweep", str(tasks), "--out", "r.jsonl", "--judge", "--yolo"])
    assert exc.value.code == 2
    assert "not allowed with argument" in capsys.readouterr().err
    # the gateway not answering is a connection error: 2 as well
    assert main(["sweep", str(tasks), "--out", str(tmp_path / "r.jsonl"), "--token", "t", *url]) == 2
    assert "did not answer" in capsys.readouterr().err
