"""``cox sweep`` against a real stack of two runners: 40 scripted tasks with ``--parallel 8``
give 40 results whose pass or fail is their check's; a sweep killed halfway and started again
ends with exactly one session per task (the run whose session it never recorded included); a
runner killed -9 under a sweep loses no task."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from cox.sweep_plan import Task, Unit, client_id, intent, new_nonce, sweep_line
from tests.support.stack import TOKEN, Api, Stack, script, stack_fixture, tool

stack = stack_fixture("cox_sweep", runners=2)
N = 40


def env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("COX_")}


def argv(stack: Stack, tasks: Path, out: Path, *more: str) -> list[str]:
    return [sys.executable, "-m", "cox", "sweep", str(tasks), "--out", str(out), "--url", stack.url,
            "--token", TOKEN, *more]


def sweep(stack: Stack, tasks: Path, out: Path, *more: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv(stack, tasks, out, *more), capture_output=True, text=True, timeout=timeout, env=env(),
                          stdin=subprocess.DEVNULL)


def template(api: Api, stack: Stack, name: str) -> None:
    """A workspace of the caller's with a file in it, to be copied for each task."""
    api.create(name)
    (stack.root / name / "README.md").write_text("the template\n")


def task(i: int, tmpl: str, delay_ms: int = 0, good: bool = True) -> dict[str, Any]:
    """Task i writes answer.txt (its own number, or a wrong one) and its check greps for it."""
    content = f"{i}\n" if good else "wrong\n"
    steps: list[dict[str, Any]] = [{"delay_ms": delay_ms, "tools": [tool("write_file", path="answer.txt", content=content)]},
             # written again: a turn a dead runner crashed goes on at the next step
             {"tools": [tool("write_file", path="answer.txt", content=content)]},
             {"text": f"wrote {i}"}]
    return {"id": f"t{i:02d}", "prompt": script(*steps, text=f"task {i}"), "template": tmpl,
            "check": f"grep -qx {i} answer.txt && test -f README.md", "max_turns": 4}


def write_tasks(path: Path, tasks: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(t) + "\n" for t in tasks))
    return path


def results(out: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in out.read_text().splitlines()]


def runs_of(api: Api, tmpl: str) -> list[dict[str, Any]]:
    """The principal's runs on copies of ``tmpl``."""
    got = []
    for state in ("running", "ended"):
        r = api.http.get("/v1/runs", params={"state": state})
        assert r.status_code == 200, r.text
        got += [s for s in r.json()["runs"] if Path(s["workspace"]).name.startswith(tmpl + "-run-")]
    return got


def test_forty_tasks_in_parallel_give_forty_results_passed_as_their_checks_say(
        stack: Stack, api: Api, tmp_path: Path) -> None:
    template(api, stack, "sw-a")
    good = {i: i % 3 != 0 for i in range(N)}
    tasks = write_tasks(tmp_path / "tasks.jsonl", [task(i, "sw-a", delay_ms=300, good=good[i]) for i in range(N)])
    out = tmp_path / "results.jsonl"
    t0 = time.monotonic()
    r = sweep(stack, tasks, out, "--parallel", "8", "--yolo")
    took = time.monotonic() - t0
    assert r.returncode == 0, r.stdout + r.stderr
    got = results(out)
    assert sorted(x["id"] for x in got) == [f"t{i:02d}" for i in range(N)]
    for x in got:
        i = int(x["id"][1:])
        assert set(x) == {"id", "model", "session_id", "outcome", "passed", "turns", "tool_calls", "input_tokens",
                          "output_tokens", "cost", "seconds", "exit_code"}, x
        assert x["passed"] is good[i] and x["exit_code"] == (0 if good[i] else 1), x
        # one turn, unless a loaded machine let a runner's lease lapse: the run goes on after the crash
        ends = [e["outcome"] for e in api.all_events(x["session_id"]) if e["type"] == "turn.end"]
        assert (x["model"], x["outcome"], x["turns"]) == ("script", "completed", len(ends)), (x, ends)
        assert ends == ["crashed"] * (len(ends) - 1) + ["completed"], ends
        assert x["tool_calls"] == 2 or "crashed" in ends, x
        assert x["input_tokens"] > 0 and x["output_tokens"] > 0 and x["seconds"] >= 0.3, x
    assert len({x["session_id"] for x in got}) == N
    sessions = runs_of(api, "sw-a")
    assert len(sessions) == N and {s["id"] for s in sessions} == {x["session_id"] for x in got}
    # eight at a time: 40 runs of 0.3 s or more each took far less than 40 in a row
    assert took < N * 0.3 + 60, took
    # no terminal: a line per run on stderr, then the summary table on stdout
    assert len([x for x in r.stderr.splitlines() if x.startswith("[")]) == N, r.stderr
    assert "pass rate" in r.stdout and "script" in r.stdout and f"{sum(good.values()) / N:.0%}" in r.stdout, r.stdout

    # the same command again: everything has a result, nothing runs
    again = sweep(stack, tasks, out, "--parallel", "8", "--yolo", "--json")
    assert again.returncode == 0, again.stderr
    (line,) = again.stdout.splitlines()
    (row,) = json.loads(line)["summary"]
    assert (row["model"], row["tasks"], row["passed"]) == ("script", N, sum(good.values()))
    assert len(runs_of(api, "sw-a")) == N and len(results(out)) == N


def test_a_sweep_killed_halfway_and_started_again_has_one_session_per_task(
        stack: Stack, api: Api, tmp_path: Path) -> None:
    template(api, stack, "sw-b")
    tasks_list = [task(i, "sw-b", delay_ms=1000) for i in range(N)]
    tasks = write_tasks(tmp_path / "tasks.jsonl", tasks_list)
    out = tmp_path / "results.jsonl"
    journal = tmp_path / "results.jsonl.journal"
    p = subprocess.Popen(argv(stack, tasks, out, "--parallel", "8", "--yolo"), stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL, env=env(), stdin=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while not journal.exists():  # made when the sweep takes its lock, before anything else
            assert p.poll() is None and time.monotonic() < deadline, "the sweep did not start"
            time.sleep(0.05)
        # a second sweep on the same results file refuses while the first holds it
        second = sweep(stack, tasks, out, timeout=60)
        assert second.returncode == 2 and "another cox sweep is writing" in second.stderr, second.stderr
        while not out.exists() or len(out.read_text().splitlines()) < N // 2:
            assert p.poll() is None and time.monotonic() < deadline, "the sweep did not get halfway"
            time.sleep(0.05)
        p.send_signal(signal.SIGKILL)
        p.wait(10)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    done = {x["id"] for x in results(out)}
    assert N // 2 <= len(done) < N, "killed halfway"
    in_flight = {j["id"] for j in map(json.loads, journal.read_text().splitlines()) if "id" in j} - done
    assert in_flight, "runs were going when it was killed"

    # The window no journal closes: a POST made the run, and the sweep died before it wrote the
    # session down. Made here as an older cox sweep made it (an intent line without a client_id, a
    # POST without one): found again among the runs (the client_id case is the test below).
    fresh = [t for t in tasks_list if t["id"] not in done and t["id"] not in in_flight]
    assert fresh
    lost = fresh[0]
    with journal.open("a") as f:
        f.write(json.dumps({"event": "intent", "id": lost["id"], "model": "script", "at": int(time.time() * 1000)})
                + "\n")
    made = api.http.post("/v1/runs", json={"text": lost["prompt"], "template": "sw-b", "model": "script",
                                           "confirm": "yolo", "unattended": True, "max_turns": 4})
    assert made.status_code == 201, made.text

    r = sweep(stack, tasks, out, "--parallel", "8", "--yolo")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "re-attaching to" in r.stderr
    got = results(out)
    assert sorted(x["id"] for x in got) == [t["id"] for t in tasks_list], "every task once"
    assert all(x["passed"] and x["outcome"] == "completed" for x in got), [x for x in got if not x["passed"]]
    sessions = runs_of(api, "sw-b")
    assert len(sessions) == N, f"{len(sessions)} sessions for {N} tasks"
    assert {s["id"] for s in sessions} == {x["session_id"] for x in got}
    assert next(x for x in got if x["id"] == lost["id"])["session_id"] == made.json()["session_id"]


def turns_in_flight(log: str) -> int:
    """How many turns a runner's JSON log says it began (a drive's ``turn.begin``, which names
    the message) and has not ended."""
    begun, ended = set(), set()
    for line in log.splitlines():
        with contextlib.suppress(ValueError):
            e = json.loads(line)
            if e.get("event") == "turn.begin" and "message_id" in e:
                begun.add(e["turn_id"])
            elif e.get("event") == "turn.end":
                ended.add(e.get("turn_id"))
    return len(begun - ended)


@pytest.mark.faults  # a runner killed: waits for its lease to lapse (the faults lane, drill leases)
def test_a_runner_killed_under_a_sweep_loses_no_task(stack: Stack, api: Api, tmp_path: Path) -> None:
    template(api, stack, "sw-c")
    tasks = write_tasks(tmp_path / "tasks.jsonl", [task(i, "sw-c", delay_ms=600) for i in range(N)])
    out = tmp_path / "results.jsonl"
    p = subprocess.Popen(argv(stack, tasks, out, "--parallel", "8", "--yolo", "--json"), stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env=env(), stdin=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while not out.exists() or len(out.read_text().splitlines()) < 8:
            assert p.poll() is None and time.monotonic() < deadline, "the sweep did not start"
            time.sleep(0.05)
        # Killed while it holds a turn: the tasks run in waves of eight and a wave can start on the
        # other runner alone (CI: the kill fell between two waves and ended nothing).
        while turns_in_flight(stack.log("turn-runner-1")) == 0:
            assert p.poll() is None and time.monotonic() < deadline, "turn-runner-1 never held a turn of the sweep"
            time.sleep(0.02)
        stack.kill("turn-runner-1")
        stdout, stderr = p.communicate(timeout=240)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        if stack.procs["turn-runner-1"].poll() is not None:
            stack.spawn("turn-runner-1", "cox_runner")
    assert p.returncode == 0, stderr
    lines = [json.loads(x) for x in stdout.splitlines()]
    assert "summary" in lines[-1] and lines[-1]["summary"][0]["tasks"] == N
    got = results(out)
    assert lines[:-1] == got, "--json prints each result line as written"
    assert sorted(x["id"] for x in got) == [f"t{i:02d}" for i in range(N)]
    sessions = runs_of(api, "sw-c")
    assert len(sessions) == N and {s["id"] for s in sessions} == {x["session_id"] for x in got}
    crashed = [s["id"] for s in sessions
               if any(e["type"] == "turn.end" and e["outcome"] == "crashed" for e in api.all_events(s["id"]))]
    assert crashed, "the kill ended turns in flight"
    # a crashed turn is not the run's end: its run went on and did the work
    assert all(x["passed"] for x in got), [x for x in got if not x["passed"]]
    assert {x["outcome"] for x in got if x["session_id"] in crashed} <= {"completed"}
    assert all(x["turns"] >= 2 for x in got if x["session_id"] in crashed)


def test_ctrl_c_leaves_the_runs_going_and_the_same_command_picks_them_up(
        stack: Stack, api: Api, tmp_path: Path) -> None:
    template(api, stack, "sw-d")
    n = 12
    # The first four (the sweep starts tasks in file order) are still running well after Ctrl-C
    # however loaded the machine is (1.5 s each was seen to end before the check); the rest are short.
    tasks = write_tasks(tmp_path / "tasks.jsonl", [task(i, "sw-d", delay_ms=10_000 if i < 4 else 300)
                                                   for i in range(n)])
    out = tmp_path / "results.jsonl"
    p = subprocess.Popen(argv(stack, tasks, out, "--parallel", "4", "--yolo"), stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env=env(), stdin=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while len(runs_of(api, "sw-d")) < 4:
            assert p.poll() is None and time.monotonic() < deadline, "the sweep did not start its runs"
            time.sleep(0.1)
        p.send_signal(signal.SIGINT)
        _, stderr = p.communicate(timeout=30)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 1, stderr
    assert "interrupted" in stderr and "run the same command again to re-attach" in stderr, stderr
    going = [s for s in runs_of(api, "sw-d") if s["run"]["state"] == "running"]
    assert going, "Ctrl-C does not stop the runs"
    r = sweep(stack, tasks, out, "--parallel", "4", "--yolo")
    assert r.returncode == 0, r.stderr
    got = results(out)
    assert sorted(x["id"] for x in got) == [f"t{i:02d}" for i in range(n)] and all(x["passed"] for x in got)
    sessions = runs_of(api, "sw-d")
    assert len(sessions) == n and {s["id"] for s in sessions} == {x["session_id"] for x in got}
    assert {s["id"] for s in going} <= {x["session_id"] for x in got}, "the runs going were re-attached to"


def test_a_sweep_that_died_right_after_its_post_runs_the_task_once(
        stack: Stack, api: Api, tmp_path: Path) -> None:
    """The sweep died after its POST made the run and before the journal had the session (here:
    its journal's nonce and intent written, and the POST sent with the client_id the sweep derives,
    as the sweep would have). Started again it sends the POST again, which answers that run
    (``replay``): the task runs once, and the task nobody started runs too."""
    template(api, stack, "sw-e")
    tasks_list = [task(i, "sw-e", delay_ms=300) for i in range(2)]
    tasks = write_tasks(tmp_path / "tasks.jsonl", tasks_list)
    out = tmp_path / "results.jsonl"
    journal = tmp_path / "results.jsonl.journal"
    nonce = new_nonce()
    unit = Unit(Task.model_validate(tasks_list[0]), "script")
    cid = client_id(nonce, unit)
    journal.write_text(json.dumps(sweep_line(nonce)) + "\n"
                       + json.dumps(intent(unit, int(time.time() * 1000), cid)) + "\n")
    made = api.http.post("/v1/runs", json={"text": unit.task.prompt, "template": "sw-e", "model": "script",
                                           "confirm": "yolo", "unattended": True, "max_turns": 4, "client_id": cid})
    assert made.status_code == 201, made.text

    r = sweep(stack, tasks, out, "--yolo")
    assert r.returncode == 0, r.stdout + r.stderr
    got = {x["id"]: x for x in results(out)}
    assert sorted(got) == ["t00", "t01"] and all(x["passed"] for x in got.values()), got
    assert got["t00"]["session_id"] == made.json()["session_id"], "re-attached to the run the POST made"
    sessions = runs_of(api, "sw-e")
    assert len(sessions) == 2 and {s["id"] for s in sessions} == {x["session_id"] for x in got.values()}
    assert len([e for e in api.all_events(got["t00"]["session_id"]) if e["type"] == "user.msg"]) == 1
    lines = [json.loads(x) for x in journal.read_text().splitlines()]
    assert [x for x in lines if x["event"] == "sweep"] == [sweep_line(nonce)], "the nonce is kept, not renewed"
    assert all(x.get("client_id") for x in lines if x["event"] == "intent")
