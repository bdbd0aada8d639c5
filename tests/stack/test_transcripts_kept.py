"""A chat of turns with the session idle between them: each turn starts from the transcript the
runner kept, with only the events since folded in, and the model is sent what the whole log
builds (docs/api.md ``[runner] transcripts_kept``).

A real model server (the fake OpenAI one, which refuses a call without its result) records every
request. The turns' requests must continue one another, message for message; a fork of the
session, whose first turn builds its transcript from the copied log, must send the model exactly
what the source's next (folded) turn sends; and the runner's health counts the folds and the first
turns made of their message alone, so the test knows which path ran. Rewinds between turns (which the fold refuses) are
``test_fork.py``'s and the state machine's.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.support.fake_providers import FakeModels, Reply
from tests.support.flow import run_turn
from tests.support.stack import Api, Stack, running


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, fake: FakeModels) -> Iterator[Stack]:
    config = f"""
{fake.openai_provider()}
"""
    with running(tmp_path_factory.mktemp("kept"), runners=1, config=config) as s:
        yield s


def _counted(stack: Stack, what: str) -> int:
    body = httpx.get(stack.url + "/healthz", timeout=10).json()
    return int(body["services"]["turn-runner"]["detail"]["transcripts"][what])


def _folded(stack: Stack) -> int:
    return _counted(stack, "folded")


def _conversation(req: dict[str, Any]) -> list[dict[str, Any]]:
    """A request's messages but the system prompt (it names the session's workspace)."""
    return [m for m in req["messages"] if m.get("role") not in ("system", "developer")]


def test_idle_turns_fold_the_log_and_send_what_the_log_builds(stack: Stack, api: Api, fake: FakeModels) -> None:
    fake.cases.update({
        "kept1": [Reply("the first answer")],
        "kept2": [Reply.calls(("list_dir", {"path": "."})), Reply("listed it")],
        "kept3": [Reply.calls(("read_file", {"path": "missing.txt"}), ("list_dir", {"path": "."})),
                  Reply("read and listed")],
        "kept4": [Reply("the fourth answer")],
        "kept5": [Reply("the fifth answer")],
    })
    s = api.create("kept", model="fake-openai")
    sid = s["id"]
    before, firsts = _folded(stack), _counted(stack, "first")
    for n in range(1, 5):
        evs = run_turn(api, sid, f"[case:kept{n}] message {n}")
        assert [e["outcome"] for e in evs if e["type"] == "turn.end"] == ["completed"], evs
        api.wait_idle(sid)
        if n == 1:  # the session's first turn: its message alone, no log read
            assert _counted(stack, "first") == firsts + 1
    assert _folded(stack) - before == 3  # every turn but the session's first started from a kept transcript
    assert _counted(stack, "first") == firsts + 1

    # Each turn's first request is the previous turn's last one, its answer and the new message.
    turns = [fake.for_case(f"kept{n}") for n in range(1, 5)]
    assert [len(t) for t in turns] == [1, 2, 2, 1]
    for n in range(1, 4):
        prev, first = _conversation(turns[n - 1][-1]), _conversation(turns[n][0])
        assert first[: len(prev)] == prev, n
        answer, message = first[len(prev):]
        assert answer["role"] == "assistant" and message["role"] == "user"
        assert f"message {n + 1}" in str(message["content"])
    tool_results = [m for m in _conversation(turns[3][0]) if m["role"] == "tool"]
    assert len(tool_results) == 3  # list_dir of turn 2, read_file and list_dir of turn 3

    # A fork's first turn builds from the log (its log holds the source's conversation: it is not
    # a first turn); the source's next turn folds. The same messages.
    r = api.http.post(f"/v1/sessions/{sid}/fork", json={"at_turn": 4})
    assert r.status_code == 201, r.text
    fid = r.json()["id"]
    folded = _folded(stack)
    run_turn(api, sid, "[case:kept5] message 5")
    assert _folded(stack) == folded + 1
    api.wait_idle(sid)
    run_turn(api, fid, "[case:kept5] message 5")
    assert _counted(stack, "first") == firsts + 1
    source, fork = fake.for_case("kept5")
    assert _conversation(source) == _conversation(fork)
    assert len(_conversation(source)) == len(_conversation(turns[3][0])) + 2
