"""Units that need no server: the rules judge, the judge's confinement rule, guard's command
policy, tool argument checks, the script model's parser and the sandbox's argv."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import pytest
from pydantic import ValidationError
from pydantic_ai.messages import ToolCallPart

from cox_guard import policy
from cox_judge import rules
from cox_judge.service import confined_only
from cox_runner.errors import SandboxUnavailable
from cox_runner.model.script_model import Plan, ScriptError, _parts, parse_script
from cox_runner.workspace import bwrap, sandbox, tools
from coxswain.config import SandboxConfig, Settings
from coxswain.models import STANDING_NETWORK, CallSpec, GuardRequest, GuardResult, JudgeRequest, JudgeResult


def test_rules_units() -> None:
    ok = ["ls -la", "cat a | grep x | wc -l", "git status", "git log --oneline -5", "git branch -a",
          "sed -n 1,10p f", "echo hi 2>/dev/null", "head -n 5 f && tail f", "cat <<EOF\nhi\nEOF"]
    bad = ["rm -rf x", "echo hi > f", "git branch -D x", "git diff --output=x", "sort -o out in",
           'sed "s/a/b/w out" f', "sed -i s/a/b/ f", "ls $(whoami)", "find . -delete", "python3 x.py",
           "X=1 ls", "sleep 1 &", "git tag v1", "uniq a b", "rg --pre=sh x"]
    assert [c for c in ok if not rules.judge(c).ok] == []
    assert [c for c in bad if rules.judge(c).ok] == []


def _judged(sandboxed: bool, network: bool) -> JudgeResult:
    req = JudgeRequest(sid="s_1", workspace="/w", call=CallSpec(call_id="c", name="run_command",
                                                                 args={"command": "ls"}),
                       sandboxed=sandboxed, network=network)
    return confined_only(req, JudgeResult(verdict="allow", score=1.0, reason="only read-only commands", kind="rules"))


def test_the_judge_allows_unasked_only_what_runs_confined() -> None:
    assert _judged(True, False).verdict == "allow"
    net = _judged(True, True)
    assert net.verdict == "refuse" and "network" in net.reason and net.reason.startswith("only read-only")
    bare = _judged(False, False)
    assert bare.verdict == "refuse" and "without a sandbox" in bare.reason


def _guard(tmp_path: Path, args: dict[str, object], standing: list[str] | None = None, **cfg: object) -> GuardResult:
    (tmp_path / "ws").mkdir(exist_ok=True)
    settings = Settings(root=tmp_path, sandbox=SandboxConfig(**cfg))
    return policy.check(settings, GuardRequest(sid="s_1", workspace=str(tmp_path / "ws"),
                                               call=CallSpec(call_id="c", name="run_command", args=args),
                                               standing=standing or []))


def test_guard_makes_a_network_request_a_security_confirm_unless_granted(tmp_path: Path) -> None:
    asked = _guard(tmp_path, {"command": "ls", "network": True})
    assert (asked.verdict, asked.security, asked.route) == ("ask", True, "judge")
    standing = _guard(tmp_path, {"command": "ls", "network": True}, [STANDING_NETWORK])
    assert standing.security is False
    config = _guard(tmp_path, {"command": "ls", "network": True}, network=True)
    assert config.security is False
    plain = _guard(tmp_path, {"command": "ls"})
    assert plain.security is False


def test_a_network_standing_approval_is_not_a_command_prefix(tmp_path: Path) -> None:
    res = _guard(tmp_path, {"command": "network-tool --all"}, [STANDING_NETWORK])
    assert res.actor != "standing"


def test_tool_arguments_are_checked() -> None:
    assert tools.check_args("run_command", {"command": "ls", "network": True}) is None
    assert tools.check_args("run_command", {"command": "ls", "network": "yes"}) == "argument 'network' has the wrong type"
    assert tools.check_args("run_command", {"command": "ls", "timeout_s": True}) is not None
    assert tools.check_args("run_command", {"command": "ls", "timeout_s": 5}) is None
    assert tools.check_args("nope", {}) is not None
    assert tools.check_args("write_file", {"path": "a"}) == "missing argument 'content'"


def test_the_script_model_parses_its_block() -> None:
    steps = parse_script('go\n```script\n[{"text": "hi", "tools": [{"name": "list_dir", "args": {"path": "."}}]}]\n```')
    assert steps is not None and steps[0].text == "hi" and steps[0].tools[0].name == "list_dir"
    assert parse_script("no block") is None
    with pytest.raises(ScriptError):
        parse_script("```script\nnot json\n```")


def test_the_script_models_generation_time_is_its_delay_however_late_each_chunk_wakes(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``delay_ms`` is the response's generation time, spread over its chunks: a chunk woken late
    (a timer's rounding, a busy loop) shortens the waits after it instead of adding to the total.
    A fake clock: each sleep takes what it asked for plus 1.5 ms."""
    import asyncio

    from pydantic_ai.messages import ModelRequest, UserPromptPart
    from pydantic_ai.models import ModelRequestParameters

    from cox_runner.model import script_model

    clock = [100.0]
    asked: list[float] = []

    async def late_sleep(s: float) -> None:
        asked.append(s)
        clock[0] += s + 0.0015

    monkeypatch.setattr(script_model, "_now", lambda: clock[0])
    monkeypatch.setattr(asyncio, "sleep", late_sleep)  # the stream's waits; asyncio.run takes none
    text = 'go\n```script\n[{"text": "one two three four five six", "delay_ms": 60}]\n```'

    async def stream() -> list[Any]:
        model = script_model.ScriptModel()
        async with model.request_stream([ModelRequest(parts=[UserPromptPart(content=text)])], None,
                                        ModelRequestParameters()) as s:
            return [e async for e in s]

    got = asyncio.run(stream())
    assert got and len(asked) == 6  # still one wait before each of the six chunks
    assert clock[0] - 100.0 == pytest.approx(0.060 + 0.0015, abs=1e-9)  # one wake-up's lateness, not six
    assert all(s >= 0 for s in asked)


def test_the_script_models_parsed_steps_are_shared_and_cannot_be_changed() -> None:
    text = 'go\n```script\n[{"tools": [{"name": "write_file", "args": {"path": "a", "content": "x", "n": [1]}}]}]\n```'
    first = parse_script(text)
    assert first is not None and parse_script("again:\n" + text) is first  # one parse per block
    with pytest.raises(ValidationError):
        first[0].tools[0].name = "run_command"  # type: ignore[misc]
    call = _parts(Plan(first[0], "s0"))[0]
    assert isinstance(call, ToolCallPart) and isinstance(call.args, dict)
    args = cast(dict[str, Any], call.args)
    args["n"].append(2)  # whatever the loop does to a call's arguments stays in that call
    args["path"] = "b"
    again = _parts(Plan(first[0], "s0"))[0]
    assert isinstance(again, ToolCallPart) and again.args == {"path": "a", "content": "x", "n": [1]}
    for _ in range(2):  # a broken block is an error every time, not a cached None
        with pytest.raises(ScriptError):
            parse_script("```script\n[{\"finish\": 3, \"nope\": 1}]\n```")


def test_the_sandbox_hides_what_others_may_not_read_in_etc(tmp_path: Path) -> None:
    etc = tmp_path / "etc"
    (etc / "open").mkdir(parents=True)
    (etc / "open" / "public.conf").write_text("x")
    (etc / "open" / "secret.key").write_text("x")
    (etc / "open" / "secret.key").chmod(0o600)
    (etc / "closed").mkdir()
    (etc / "closed").chmod(0o700)
    dirs, files = bwrap.hidden_in_etc(str(etc))
    assert dirs == [str(etc / "closed")]
    assert files == [str(etc / "open" / "secret.key")]


def test_the_sandbox_fails_closed_without_bwrap(tmp_path: Path) -> None:
    sb = sandbox.Sandbox(SandboxConfig(bwrap="no-such-bwrap-here"), ".coxswain")
    with pytest.raises(SandboxUnavailable, match="not found"):
        sb.argv(tmp_path, "true", network=False)
    bare = sandbox.Sandbox(SandboxConfig(mode="none"), ".coxswain")
    assert bare.argv(tmp_path, "true", network=False)[-3:] == ["/bin/bash", "-c", "true"]
    assert bare.status().available and not bare.confined


def test_a_nats_url_may_list_every_node_of_a_cluster() -> None:
    from cox.creds import Credentials, nats_admin_url
    from coxswain.config import Settings
    from coxswain.service import nats_servers

    one = "nats://127.0.0.1:4222"
    three = " nats://a:4222, nats://b:4222 ,nats://c:4222,"
    assert nats_servers(one) == [one]
    assert nats_servers(three) == ["nats://a:4222", "nats://b:4222", "nats://c:4222"]
    creds = Credentials.generate()
    urls = nats_admin_url(three, creds).split(",")
    assert [u.rsplit("@", 1)[1] for u in urls] == ["a:4222", "b:4222", "c:4222"]
    assert all(u.startswith("nats://admin:") for u in urls)
    assert Settings().nats.stream_replicas == 1
    assert Settings(nats={"stream_replicas": 3}).nats.stream_replicas == 3
