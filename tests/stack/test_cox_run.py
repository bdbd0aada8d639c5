"""``cox run`` against a real stack, as a person runs it from a shell: its transcript, its JSON
lines, its exit codes (0 completed, 1 otherwise, 2 usage or connection), stdin, and Ctrl-C."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from tests.support.stack import TOKEN, Api, Stack, script, stack_fixture, tool

stack = stack_fixture("cox_run", runners=2)


def env(**extra: str) -> dict[str, str]:
    return {**{k: v for k, v in os.environ.items() if not k.startswith("COX_")}, **extra}


def cox_run(stack: Stack, *args: str, stdin: str | None = None, token: bool = True,
            timeout: float = 90) -> subprocess.CompletedProcess[str]:
    auth = ["--token", TOKEN] if token else []
    return subprocess.run([sys.executable, "-m", "cox", "run", "--url", stack.url, *auth, *args],
                          input=stdin, capture_output=True, text=True, timeout=timeout, env=env(),
                          stdin=None if stdin is not None else subprocess.DEVNULL)


def runs(api: Api, workspace: str) -> list[dict[str, Any]]:
    out = []
    for state in ("running", "ended"):
        r = api.http.get("/v1/runs", params={"state": state})
        assert r.status_code == 200, r.text
        out += [s for s in r.json()["runs"] if Path(s["workspace"]).name == workspace]
    return out


def test_a_run_that_completes_streams_its_transcript_and_exits_0(stack: Stack, api: Api) -> None:
    text = script(
        {"text": "Writing it.", "tools": [tool("write_file", path="out.txt", content="42\n")]},
        {"tools": [tool("run_command", command="cat out.txt")]},
        {"text": "Done: out.txt says 42."},
        text="write the answer")
    r = cox_run(stack, "--workspace", "run-ok", "--yolo", text)
    assert r.returncode == 0, r.stdout + r.stderr
    assert (stack.root / "run-ok" / "out.txt").read_text() == "42\n"
    lines = r.stdout.splitlines()
    assert lines[0].startswith("run s_") and "confirm yolo, at most 10 turns" in lines[0], lines
    assert "> write the answer" in lines
    assert "  Writing it." in lines and "  write_file out.txt" in lines and "  $ cat out.txt" in lines
    assert any(x.startswith("    ok: exit code 0") for x in lines), lines
    assert "  Done: out.txt says 42." in lines
    assert lines[-2:] == ["turn ended completed", "run ended completed after 1 turn"], lines
    assert "session s_" in r.stderr and r.stderr.rstrip().endswith("/run-ok")
    (session,) = runs(api, "run-ok")
    assert session["run"]["state"] == "ended" and session["run"]["outcome"] == "completed"
    assert session["run"]["confirm"] == "yolo" and session["run"]["unattended"] is False


def test_a_run_cut_at_max_turns_exits_1_and_json_lines_are_its_events(stack: Stack, api: Api) -> None:
    # each response is cut off (finish: length), so no turn completes and the run goes on
    text = script(*({"text": f"part {i}", "finish": "length"} for i in range(5)), text="never done")
    r = cox_run(stack, "--workspace", "run-cut", "--max-turns", "2", "--unattended", "--json", "-", stdin=text)
    assert r.returncode == 1, r.stdout + r.stderr
    evs = [json.loads(x) for x in r.stdout.splitlines()]
    types = [e["type"] for e in evs]
    assert "assistant.delta" not in types
    assert types[0] == "session.created" and types[-1] == "run.end", types
    assert [e["seq"] for e in evs] == sorted({e["seq"] for e in evs}), "each event once, in order"
    (start,) = [e for e in evs if e["type"] == "run.start"]
    assert (start["confirm"], start["unattended"], start["max_turns"]) == ("person", True, 2)
    assert [e["outcome"] for e in evs if e["type"] == "turn.end"] == ["output_limit", "output_limit"]
    assert [e["via"] for e in evs if e["type"] == "user.msg"] == ["send", "run"], "the run's continue"
    assert (evs[-1]["outcome"], evs[-1]["turns"]) == ("max_turns", 2)
    (session,) = runs(api, "run-cut")
    assert (session["run"]["outcome"], session["run"]["turns"]) == ("max_turns", 2)


def test_the_token_comes_from_the_environment_or_the_state_folder(stack: Stack, tmp_path: Path) -> None:
    base = [sys.executable, "-m", "cox", "run", "--url", stack.url, "--workspace", "run-tok", "hello"]
    r = subprocess.run(base, capture_output=True, text=True, timeout=60, env=env(COX_TOKEN=TOKEN),
                       stdin=subprocess.DEVNULL, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "  echo: hello" in r.stdout.splitlines()
    (tmp_path / ".cox").mkdir()
    (tmp_path / ".cox" / "token").write_text(TOKEN + "\n")
    r = subprocess.run(base, capture_output=True, text=True, timeout=60, env=env(), stdin=subprocess.DEVNULL,
                       cwd=tmp_path)
    assert r.returncode == 0, r.stderr


def test_usage_and_connection_errors_exit_2(stack: Stack, tmp_path: Path) -> None:
    r = cox_run(stack, "--workspace", "run-bad", "--model", "no-such-model", "hi")
    assert r.returncode == 2 and "422 invalid" in r.stderr, r.stderr
    r = cox_run(stack, "--workspace", "run-bad", "--token", "wrong-token", "hi", token=False)
    assert r.returncode == 2 and "401 unauthorized" in r.stderr, r.stderr
    # --state: a folder with no token, so a .cox/ that `./dev up` left in the checkout is not found
    r = cox_run(stack, "--workspace", "run-never", "--state", str(tmp_path / "no-state"), "hi", token=False)
    assert r.returncode == 2 and "no token" in r.stderr, r.stderr
    r = subprocess.run([sys.executable, "-m", "cox", "run", "--url", "http://127.0.0.1:9", "--token", TOKEN, "hi"],
                       capture_output=True, text=True, timeout=60, env=env(), stdin=subprocess.DEVNULL)
    assert r.returncode == 2 and "the gateway did not answer" in r.stderr, r.stderr
    assert not (stack.root / "run-never").exists()


def test_ctrl_c_stops_the_run_and_exits_1(stack: Stack, api: Api) -> None:
    text = script({"text": "thinking for a long time", "delay_ms": 60_000}, {"text": "never"})
    p = subprocess.Popen([sys.executable, "-m", "cox", "run", "--url", stack.url, "--token", TOKEN,
                          "--workspace", "run-stop", "--yolo", text],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env(),
                         stdin=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while not runs(api, "run-stop"):
            assert time.monotonic() < deadline, "the run never started"
            time.sleep(0.1)
        (session,) = runs(api, "run-stop")
        api.wait_type(session["id"], "turn.start")
        t0 = time.monotonic()
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=40)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 1, out + err
    assert time.monotonic() - t0 < 15, "the stop ends the turn at once, not after its 60 s"
    assert "stopping the run" in err
    assert out.splitlines()[-1] == "run ended stopped after 1 turn", out
    (session,) = runs(api, "run-stop")
    assert session["run"]["state"] == "ended" and session["run"]["outcome"] == "stopped"
    assert not session["busy"]
