"""Programs (issue 25, item 1): long-running processes the model starts in the command sandbox,
reads, writes to and stops; they outlive the turn. Real stacks, real bubblewrap.

- a dev server started by one call is reached by a later command of the session on the sandbox's
  own loopback (never the host's), the next turn reads its log, ``stop_program`` ends it;
- a REPL on a terminal answers ``write_program``; input is judged as its own confirm (the person
  sees the program's command and recent output), and denied input never reaches the program;
- programs die with Stop ``{programs: true}`` (not without it), with ``[sandbox] program_idle_s``,
  and with their runner (kill -9: nothing left on the host; the next turn is told they are gone);
- ``[sandbox] max_programs`` refuses the next one; a flood of output stays bounded.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from coxswain import keys
from tests.support.checks import of_type
from tests.support.flow import answer, result, run_allowing
from tests.support.stack import Api, Stack, running, script, stack_fixture, tool

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None,
                                reason="bubblewrap is not installed (./dev installs it: apt-get install bubblewrap)")

ROOT = os.geteuid() == 0
IDLE_S = 6
LIMIT = 4000
CONFIG = f"""[approval]
commands = "ask"

[runner]
output_limit = {LIMIT}

[sandbox]
max_programs = 2
"""
stack = stack_fixture("programs", runners=1, config=CONFIG)
# A stack of its own for the idle stop: with a 6 s idle limit on the module's stack, a program
# whose next read came in a turn more than 6 s later (a loaded CI machine: a turn took 7 s) was
# stopped as idle under the tests that read it.
idle_stack = stack_fixture("programs-idle", runners=1, config=CONFIG + f"program_idle_s = {IDLE_S}\n")


@pytest.fixture
def api(stack: Stack) -> Iterator[Api]:
    with stack.client() as client:
        yield client


def start(**args: Any) -> dict[str, Any]:
    """A ``start_program`` call of a script step (its ``name`` argument is the program's)."""
    return {"name": "start_program", "args": args}


def marker() -> str:
    return str(700000 + int(uuid.uuid4().int % 90000))


def procs(text: str) -> list[str]:
    out = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True, check=True).stdout
    return [line for line in out.splitlines() if text in line and "ps -eo" not in line]


def wait_gone(text: str, timeout: float = 15.0) -> list[str]:
    deadline = time.monotonic() + timeout
    left = procs(text)
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = procs(text)
    return left


def results(evs: list[dict[str, Any]], name: str) -> list[str]:
    ids = [e["call_id"] for e in evs if e["type"] == "tool.call" and e["name"] == name]
    return [result(evs, i)["output"] for i in ids]


def wait_event(api: Api, sid: str, type_: str, timeout: float = 30.0, **match: Any) -> dict[str, Any]:
    return api.wait_type(sid, type_, timeout=timeout, **match)


def test_a_dev_server_is_reached_by_a_later_command_and_read_by_the_next_turn(stack: Stack, api: Api) -> None:
    port = int(marker()) % 20000 + 20000
    s = api.create("prog-web")
    sid, ws = s["id"], Path(s["workspace"])
    (ws / "index.txt").write_text("hello from the workspace\n")
    fetch = (f"for i in $(seq 100); do python3 -c \"import urllib.request as u; "
             f"print(u.urlopen('http://127.0.0.1:{port}/index.txt', timeout=2).read().decode())\" "
             f"2>/dev/null && exit 0; sleep 0.1; done; echo never reached; exit 1")
    evs = run_allowing(api, sid, script(
        {"text": "Starting the server.",
         "tools": [start(command=f"python3 -m http.server {port} --bind 127.0.0.1", name="web")]},
        {"text": "Testing it.", "tools": [tool("run_command", command=fetch)]},
        {"text": "Done."},
    ))
    started = of_type(evs, "program.started")
    assert len(started) == 1 and started[0]["name"] == "web" and "http.server" in started[0]["command"], started
    pid = started[0]["program_id"]
    assert results(evs, "start_program")[0].startswith(f"Started program {pid} (web): running")
    out = results(evs, "run_command")[0]
    assert out.startswith("exit code 0") and "hello from the workspace" in out, out
    # It outlives the turn: the session lists it, and it runs on the host (as the sandbox user).
    listed = api.session(sid)["programs"]
    assert [p["program_id"] for p in listed] == [pid] and listed[0]["name"] == "web"
    assert procs(f"http.server {port}"), "the program did not outlive its turn"
    # The sandbox's loopback is its own: the host's 127.0.0.1 does not reach the server.
    with pytest.raises(OSError), socket.create_connection(("127.0.0.1", port), timeout=2):
        pass
    # Nor does another session's command: the namespace is this session's.
    other = api.create("prog-web-other")["id"]
    evs_other = run_allowing(api, other, script({"text": "Peeking.", "tools": [tool("run_command", command=(
        f"python3 -c \"import urllib.request as u; u.urlopen('http://127.0.0.1:{port}/', timeout=2)\" 2>&1 "
        "| tail -1"))]}, {"text": "Done."}))
    assert "Connection refused" in results(evs_other, "run_command")[0]

    # The next turn reads its log (what it wrote since: the GET), then stops it.
    evs = run_allowing(api, sid, script(
        {"text": "Reading.", "tools": [tool("read_program", program_id="web", wait_s=5)]},
        {"text": "Stopping.", "tools": [tool("stop_program", program_id=pid)]},
        {"text": "Done."},
    ))
    read = results(evs, "read_program")[0]
    assert read.startswith(f"[program {pid} (web): running;"), read
    assert "GET /index.txt HTTP/1.1" in read and " 200 " in read, read
    assert results(evs, "stop_program")[0] == f"Stopped program {pid} (web)."
    stopped = of_type(evs, "program.stopped")
    assert [(e["program_id"], e["by"]) for e in stopped] == [(pid, "model")]
    assert api.session(sid)["programs"] == []
    assert wait_gone(f"http.server {port}") == [], "stop_program left the server running"


REPL = "stty -echo; exec python3 -q -i"


def test_a_repl_answers_input_and_denied_input_never_reaches_it(stack: Stack, api: Api) -> None:
    s = api.create("prog-repl")
    sid = s["id"]
    after = int(api.session(sid)["last_seq"])
    assert api.send(sid, script(
        # read first, as an agent would: its prompt is there before anything is written to it.
        # The terminal does not echo: a read after a write then waits for the REPL's answer, not
        # for the echo of the line (a CI run's read returned with the echo alone).
        {"text": "A REPL.", "tools": [start(command=REPL, name="repl", pty=True),
                                      tool("read_program", program_id="repl", wait_s=10)]},
        {"text": "Asking.", "tools": [tool("write_program", program_id="repl", text="print(6 * 7)\n"),
                                      tool("read_program", program_id="repl", wait_s=5)]},
        {"text": "Again.", "tools": [tool("write_program", program_id="repl", text="print('DENIED' + 'MARK')\n"),
                                     tool("read_program", program_id="repl", wait_s=2)]},
        {"text": "Done.", "tools": [tool("stop_program", program_id="repl")]},
        {"text": "Bye."},
    )).status_code == 202
    asked: list[dict[str, Any]] = []
    seen = after
    while True:
        e = api.wait_for(sid, lambda x: x["type"] in ("approval.pending", "turn.end"), 90, after=seen)
        seen = e["seq"]
        if e["type"] == "turn.end":
            break
        asked.append(e)
        deny = e["name"] == "write_program" and "MARK" in e["args"]["text"]
        answer(api, sid, e["approval_id"], "deny" if deny else "allow")
    evs = [x for x in api.all_events(sid) if x["seq"] > after]
    writes = [a for a in asked if a["name"] == "write_program"]
    assert len(writes) == 2, [a["name"] for a in asked]
    # The person sees what the input goes to: the program's command and what it wrote lately.
    assert writes[0]["args"]["program"]["command"] == REPL
    assert ">>>" in writes[0]["args"]["recent_output"], writes[0]["args"]
    assert "42" in writes[1]["args"]["recent_output"], writes[1]["args"]
    reads = results(evs, "read_program")
    assert ">>>" in reads[0], reads[0]
    assert "42" in reads[1], reads[1]
    assert "MARK" not in reads[2] and "DENIED" not in reads[2], reads[2]
    assert results(evs, "write_program")[1] == "Denied by the person."
    assert [e["by"] for e in of_type(evs, "program.stopped")] == ["model"]


def test_stop_kills_programs_only_when_asked(stack: Stack, api: Api) -> None:
    mark = marker()
    s = api.create("prog-stop")
    sid = s["id"]
    evs = run_allowing(api, sid, script(
        {"text": "Sleeping.", "tools": [start(command=f"sleep {mark}", name="nap")]},
        {"text": "Done."},
    ))
    # A CI run (stop 40, the parallel lane) found no such process here once; the start's result
    # and the program's events say why next time.
    call = next(e for e in evs if e["type"] == "tool.call" and e["name"] == "start_program")
    started = result(evs, call["call_id"])
    programs = [e for e in evs if e["type"].startswith("program.")]
    assert started["ok"], (started, programs)
    assert len(procs(f"sleep {mark}")) == 1, (started, programs, api.session(sid).get("programs"))
    # Stop without programs: they run on.
    assert api.http.post(f"/v1/sessions/{sid}/stop").status_code == 200
    time.sleep(1.5)
    assert len(procs(f"sleep {mark}")) == 1, "Stop without programs: true stopped a program"
    assert api.session(sid)["programs"][0]["name"] == "nap"
    assert api.http.post(f"/v1/sessions/{sid}/stop", json={"programs": True}).status_code == 200
    stopped = wait_event(api, sid, "program.stopped")
    assert stopped["by"] == "stop"
    assert wait_gone(f"sleep {mark}") == []
    assert api.session(sid)["programs"] == []


def test_an_idle_program_is_stopped(idle_stack: Stack) -> None:
    mark = marker()
    with idle_stack.client() as api:
        s = api.create("prog-idle")
        sid = s["id"]
        t0 = time.monotonic()
        run_allowing(api, sid, script(
            {"text": "Sleeping.", "tools": [start(command=f"sleep {mark}")]},
            {"text": "Done."},
        ))
        stopped = wait_event(api, sid, "program.stopped", timeout=IDLE_S + 20)
    assert stopped["by"] == "idle" and time.monotonic() - t0 >= IDLE_S - 1
    assert wait_gone(f"sleep {mark}") == []


def test_max_programs_refuses_the_next_one_with_a_clear_result(stack: Stack, api: Api) -> None:
    mark = marker()
    s = api.create("prog-max")
    sid = s["id"]
    evs = run_allowing(api, sid, script(
        {"text": "Three.", "tools": [start(command=f"sleep {mark}1", name="a"),
                                     start(command=f"sleep {mark}2", name="b"),
                                     start(command=f"sleep {mark}3", name="c")]},
        {"text": "Done."},
    ))
    out = results(evs, "start_program")
    assert out[0].startswith("Started program") and out[1].startswith("Started program")
    assert out[2].startswith("Refused: this session already runs 2 programs") and "max_programs = 2" in out[2], out[2]
    assert not procs(f"sleep {mark}3")
    assert len(of_type(evs, "program.started")) == 2
    assert api.http.post(f"/v1/sessions/{sid}/stop", json={"programs": True}).status_code == 200
    assert wait_gone(f"sleep {mark}") == []


def test_a_flood_of_output_stays_bounded(stack: Stack, api: Api) -> None:
    s = api.create("prog-flood")
    sid = s["id"]
    flood = "python3 -c \"import sys\nwhile True: sys.stdout.write('FLOOD' * 1000 + chr(10))\""
    evs = run_allowing(api, sid, script(
        {"text": "Flooding.", "tools": [start(command=flood, name="flood")]},
        {"text": "Reading.", "tools": [tool("run_command", command="sleep 2"),
                                       tool("read_program", program_id="flood"),
                                       tool("read_program", program_id="flood")]},
        {"text": "Stopping.", "tools": [tool("stop_program", program_id="flood")]},
        {"text": "Done."},
    ))
    reads = results(evs, "read_program")
    for text in reads:
        assert len(text.encode()) <= LIMIT + 600, len(text)
        assert "FLOOD" in text
    # The first read starts past what was not kept, and says how much fell out.
    assert "earlier bytes were not kept" in reads[0] or "more bytes: read again" in reads[0], reads[0][:300]
    assert max(len(e.get("output", "")) for e in evs if e["type"] == "tool.result") <= LIMIT + 600
    listed = [p for p in api.session(sid)["programs"] if p["name"] == "flood"]
    assert listed == []
    assert [e["by"] for e in of_type(evs, "program.stopped")] == ["model"]


@pytest.mark.faults  # a runner killed: waits for its lease to lapse (the faults lane, drill leases)
def test_kill_9_of_the_runner_leaves_nothing_and_the_next_turn_is_told(tmp_path: Path) -> None:
    mark = marker()
    port = 20000 + int(mark) % 20000
    config = '[approval]\ncommands = "allow"\n'
    with running(tmp_path, runners=1, config=config) as st, st.client() as api:
        s = api.create("prog-kill")
        sid = s["id"]
        run_allowing(api, sid, script(
            {"text": "Sleeping.", "tools": [start(command=f"sleep {mark}", name="nap"),
                                            start(command=f"python3 -m http.server {port}")]},
            {"text": "Done."},
        ))
        assert len(procs(f"sleep {mark}")) == 1 and procs(f"http.server {port}")
        st.procs["turn-runner-1"].send_signal(signal.SIGKILL)
        st.procs["turn-runner-1"].wait(10)
        assert wait_gone(f"sleep {mark}") == [], "a program outlived its runner"
        assert wait_gone(f"http.server {port}") == [], "a program outlived its runner"
        assert [p for p in procs("bwrap") if mark in p] == []
        assert len(api.session(sid)["programs"]) == 2  # recorded; nobody could say otherwise yet
        st.spawn("turn-runner-1", "cox_runner")
        st.wait_healthy(60)
        evs = run_allowing(api, sid, script({"text": "Anything?"}))
        gone = of_type(evs, "program.stopped")
        assert sorted(e["by"] for e in gone) == ["runner", "runner"], gone
        notes = [e for e in of_type(evs, "user.msg") if "are gone" in e["text"]]
        assert notes and "nap" in notes[0]["text"], of_type(evs, "user.msg")
        assert api.session(sid)["programs"] == []


def test_a_persons_background_command_is_a_program_they_can_stop(stack: Stack, api: Api) -> None:
    mark = marker()
    s = api.create("prog-person")
    sid = s["id"]
    r = api.http.post(f"/v1/sessions/{sid}/observe", json={"command": f"sleep {mark}", "background": True})
    assert r.status_code == 202, r.text
    started = wait_event(api, sid, "program.started")
    assert started["command"] == f"sleep {mark}" and started.get("call_id") is None
    pid = started["program_id"]
    obs = wait_event(api, sid, "observed")
    assert obs["command"] == f"&sleep {mark}" and pid in obs["output"]
    (listed,) = api.session(sid)["programs"]
    assert listed["program_id"] == pid and listed["by"] == "person"
    deadline = time.monotonic() + 10
    while not procs(f"sleep {mark}") and time.monotonic() < deadline:
        time.sleep(0.1)
    assert len(procs(f"sleep {mark}")) == 1
    # The model reads it by its id in its next turn (the !& was folded into the turn's view).
    evs = run_allowing(api, sid, script({"text": "Reading.", "tools": [tool("read_program", program_id=pid)]},
                                        {"text": "Done."}))
    assert results(evs, "read_program")[0].startswith(f"[program {pid} (sleep): running;")
    r = api.http.post(f"/v1/sessions/{sid}/programs/{pid}/stop")
    assert r.status_code == 202, r.text
    stopped = wait_event(api, sid, "program.stopped")
    assert stopped["program_id"] == pid and stopped["by"] == "person"
    assert wait_gone(f"sleep {mark}") == []
    assert api.session(sid)["programs"] == []


def test_with_two_runners_every_turn_runs_where_the_programs_run(tmp_path: Path) -> None:
    port = 20000 + int(marker()) % 20000
    fetch = (f"for i in $(seq 50); do python3 -c \"import urllib.request as u; "
             f"print(u.urlopen('http://127.0.0.1:{port}/', timeout=2).status)\" 2>/dev/null && exit 0; "
             f"sleep 0.1; done; exit 1")
    with running(tmp_path, runners=2, config='[approval]\ncommands = "allow"\n') as st, st.client() as api:
        s = api.create("prog-two")
        sid = s["id"]
        run_allowing(api, sid, script(
            {"text": "Serving.", "tools": [start(command=f"python3 -m http.server {port} --bind 127.0.0.1",
                                                 name="web")]},
            {"text": "Done."},
        ))
        holder = st.redis_client().get(keys.session(sid) + keys.PROGRAM_LOCK)
        assert holder, "no program lock"
        # Sends reach either runner (a queue group); each turn runs on the holder all the same.
        for _ in range(5):
            evs = run_allowing(api, sid, script({"text": "Testing.", "tools": [tool("run_command", command=fetch)]},
                                                {"text": "Done."}))
            out = results(evs, "run_command")[0]
            assert out.startswith("exit code 0") and "200" in out, out
        # The runner that does not hold the programs ran none of the session's turns.
        (other,) = [n for n in st.runner_names() if f'"runner": "{holder}"' not in st.log(n)]
        ran = [line for line in st.log(other).splitlines() if '"turn.begin"' in line and sid in line]
        assert ran == [], "a turn ran away from its programs"
        evs = run_allowing(api, sid, script({"text": "Stop.", "tools": [tool("stop_program", program_id="web")]},
                                            {"text": "Done."}))
        assert [e["by"] for e in of_type(evs, "program.stopped")] == ["model"]
        assert wait_gone(f"http.server {port}") == []



def test_a_program_granted_the_network_keeps_a_namespace_of_its_own(stack: Stack, api: Api) -> None:
    """The session's programs and commands share one namespace; a granted program (its egress
    forwarder on its own 127.0.0.1) does not join it."""
    if not ROOT:
        pytest.skip("only a root runner shares a session's network namespace")
    mark = marker()
    s = api.create("prog-net")
    sid = s["id"]
    show = f"readlink /proc/self/ns/net; echo proxy=$HTTPS_PROXY; exec sleep {mark}"
    evs = run_allowing(api, sid, script(
        {"text": "Two.", "tools": [start(command=show, name="plain"), start(command=show, name="granted", network=True)]},
        {"text": "Compare.", "tools": [tool("run_command", command="readlink /proc/self/ns/net"),
                                       tool("read_program", program_id="plain", wait_s=5),
                                       tool("read_program", program_id="granted", wait_s=5)]},
        {"text": "Done."},
    ))
    command = results(evs, "run_command")[0].splitlines()[1]
    plain, granted = results(evs, "read_program")
    assert command.startswith("net:[") and command in plain, (command, plain)
    assert command not in granted and "net:[" in granted and "proxy=http://127.0.0.1:" in granted, granted
    assert "proxy=\n" in plain or plain.rstrip().endswith("proxy=") or "proxy=\r\n" in plain, plain
    assert api.http.post(f"/v1/sessions/{sid}/stop", json={"programs": True}).status_code == 200
    assert wait_gone(f"sleep {mark}") == []


def test_a_runner_that_shuts_down_stops_its_programs_and_says_so(tmp_path: Path) -> None:
    mark = marker()
    with running(tmp_path, runners=1, config='[approval]\ncommands = "allow"\n') as st, st.client() as api:
        s = api.create("prog-term")
        sid = s["id"]
        run_allowing(api, sid, script({"text": "Sleeping.", "tools": [start(command=f"sleep {mark}", name="nap")]},
                                      {"text": "Done."}))
        assert len(procs(f"sleep {mark}")) == 1
        st.procs["turn-runner-1"].send_signal(signal.SIGTERM)
        st.procs["turn-runner-1"].wait(30)
        assert wait_gone(f"sleep {mark}") == []
        stopped = [e for e in api.all_events(sid) if e["type"] == "program.stopped"]
        assert [e["by"] for e in stopped] == ["runner"], stopped
        assert api.session(sid)["programs"] == []
