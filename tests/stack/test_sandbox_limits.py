"""Resource limits per command (``[sandbox]`` max_processes, memory_mb, cpu_seconds, file_mb,
workspace_mb, workspace_files; cox_runner.workspace.limits): the attacks first.

Real stacks, real bubblewrap, real cgroups where the machine has them (v1 on CI). Each attack
is a command the model runs (the script model) with ``commands = "allow"``: only the limits
stand between it and the machine. Each must end with a result naming the limit, soon, and the
session must take a new turn at once; a fork bomb must leave another session serving.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.flow import result, run_allowing
from tests.support.stack import Api, Stack, script, stack_fixture, tool

pytestmark = [
    pytest.mark.skipif(shutil.which("bwrap") is None,
                       reason="bubblewrap is not installed (./dev installs it: apt-get install bubblewrap)"),
    # fork bombs and memory hogs load the whole machine, and the tests bound how long a turn takes
    pytest.mark.serial,
]

LIMITS = """[approval]
commands = "allow"
[sandbox]
max_processes = 200
memory_mb = 256
cpu_seconds = 3
file_mb = 100
workspace_mb = 20
workspace_files = 500
"""
limited = stack_fixture("limited", runners=1, config=LIMITS)
BOUNDS = """[approval]
commands = "allow"
[sandbox]
workspace_mb = 20
workspace_files = 500
"""
bounded = stack_fixture("bounded", runners=1, config=BOUNDS)
"""Default process, memory and CPU limits (making 100,000 files takes several CPU seconds)."""


@pytest.fixture
def bapi(bounded: Stack) -> Iterator[Api]:
    with bounded.client() as client:
        yield client


@pytest.fixture
def lapi(limited: Stack) -> Iterator[Api]:
    with limited.client() as client:
        yield client


def command_result(api: Api, sid: str, command: str, timeout_s: float = 60, turn_timeout: float = 120
                   ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Run one command in a turn; its ``tool.result`` event and the turn's events."""
    evs = run_allowing(api, sid, script({"text": "Running.", "tools": [
        tool("run_command", command=command, timeout_s=timeout_s)]}, {"text": "Done."}), timeout=turn_timeout)
    call = next(e for e in evs if e["type"] == "tool.call" and e["name"] == "run_command")
    return result(evs, call["call_id"]), evs


def takes_a_turn_at_once(api: Api, sid: str) -> float:
    """The session is free: a new turn with a command runs and ends quickly; its duration."""
    t0 = time.monotonic()
    res, _ = command_result(api, sid, "echo still-here", turn_timeout=30)
    took = time.monotonic() - t0
    assert res["ok"] and "still-here" in res["output"] and res.get("limit") is None, res
    assert took < 15, f"the session took {took:.1f}s to run a new turn after the limit"
    return took


def leftover_cgroups(stack: Stack) -> list[str]:
    """Command cgroups of ``stack``'s runners (``cox-<runner pid>-cmd<n>``) left under this
    process's cgroups. Only this stack's: another stack's commands running beside it (a developer's
    parallel run) are not its leftovers."""
    pids = [stack.procs[name].pid for name in stack.runner_names()]
    out: list[str] = []
    own = {}
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, ctrls, path = line.split(":", 2)
        for c in ctrls.split(","):
            own[c] = path
    for c in ("pids", "memory", "cpu", "cpuacct", "freezer"):
        base = Path("/sys/fs/cgroup") / c / own.get(c, "/").lstrip("/")
        if base.is_dir():
            out += [str(p) for pid in pids for p in base.glob(f"cox-{pid}-cmd*")]
    return out


def cgroups_on(api: Api) -> bool:
    body = api.http.get("/healthz").json()
    return bool(body["services"]["turn-runner"]["detail"]["sandbox"]["limits"]["cgroups"] != "off")


# ---------------------------------------------------------------- processes


@pytest.mark.parametrize("bomb", [
    # the bomb's own shell stays (else its exit ends the sandbox's process namespace, and with it
    # the bomb, before the limit is reached: stopped too, but not by the limit this test is about)
    ":(){ :|:& };:; sleep 30",
    "python3 -c 'import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass'",
], ids=["shell", "python"])
def test_a_fork_bomb_is_stopped_naming_max_processes_while_another_session_keeps_serving(
        limited: Stack, lapi: Api, bomb: str) -> None:
    assert cgroups_on(lapi), "this machine has cgroups: the runner must use them"
    victim = lapi.create(f"lim-bomb-{bomb[:3].isalpha()}")
    other = lapi.create("lim-bystander")
    times: list[float] = []
    errors: list[str] = []
    stop = threading.Event()

    def bystander() -> None:
        with limited.client() as api:
            while not stop.is_set():
                t0 = time.monotonic()
                try:
                    res, _ = command_result(api, other["id"], "echo served", turn_timeout=60)
                    if "served" not in res["output"]:
                        errors.append(res["output"])
                except AssertionError as exc:  # a turn that did not end in time
                    errors.append(str(exc)[:300])
                times.append(time.monotonic() - t0)

    t = threading.Thread(target=bystander, daemon=True)
    t.start()
    try:
        t0 = time.monotonic()
        evs = run_allowing(lapi, victim["id"], script({"text": "Running.", "tools": [
            tool("run_command", command=bomb, timeout_s=60) for _ in range(3)]}, {"text": "Done."}), timeout=150)
        took = time.monotonic() - t0
    finally:
        stop.set()
        t.join(90)
    calls = [e["call_id"] for e in evs if e["type"] == "tool.call" and e["name"] == "run_command"]
    assert len(calls) == 3
    for call_id in calls:
        res = result(evs, call_id)
        assert res["limit"] == "max_processes", res["output"][-400:]
        assert "[sandbox] max_processes = 200" in res["output"], res["output"][-400:]
        assert not res["ok"]
    assert took < 60, f"three bombs took {took:.1f}s (each has a 60s time-out)"
    assert not errors, errors
    assert times, "the other session ran turns meanwhile"
    print(f"\nbomb {bomb[:12]!r}: result after {took:.2f}s; bystander turns {len(times)}: "
          f"max {max(times):.2f}s, mean {sum(times) / len(times):.2f}s")
    assert max(times) < 20, f"another session's turn took {max(times):.1f}s during the fork bomb"
    takes_a_turn_at_once(lapi, victim["id"])
    assert leftover_cgroups(limited) == [], "every command's cgroup is removed after it"


def test_ordinary_work_runs_under_the_default_limits(tmp_path: Path) -> None:
    """A small compile/test loop: make -j, a C compiler, a Python test suite of 200 tests, git."""
    from tests.support.stack import running

    with running(tmp_path, runners=1, config='[approval]\ncommands = "allow"\n') as st, st.client() as api:
        s = api.create("lim-ordinary")
        ws = Path(s["workspace"])
        (ws / "a.c").write_text('#include <stdio.h>\nint main(void){puts("compiled");return 0;}\n')
        (ws / "Makefile").write_text("all: a b\na: a.c\n\tcc -O1 -o a a.c\nb: a.c\n\tcc -O0 -o b a.c\n")
        tests = "import unittest\n" + "".join(
            f"class T{i}(unittest.TestCase):\n    def test_{i}(self):\n        self.assertEqual({i} + 1, {i + 1})\n"
            for i in range(200))
        (ws / "test_many.py").write_text(tests)
        res, _ = command_result(api, s["id"], "make -j4 >/dev/null && ./a && ./b && "
                                "python3 -m unittest -q test_many 2>&1 | tail -3 && "
                                "git init -q . && git -c user.email=a@b -c user.name=t add -A && "
                                "git -c user.email=a@b -c user.name=t commit -qm one && "
                                "git checkout -qb topic && git log --oneline | wc -l")
        out = res["output"]
        assert res["ok"] and res.get("limit") is None, out
        assert out.count("compiled") == 2 and "Ran 200 tests" in out and "OK" in out, out


# ---------------------------------------------------------------- memory, cpu, files


@pytest.mark.parametrize("hog", [
    "python3 -c 'b = bytearray(600 * 1024 * 1024); print(len(b))'",
    # spread over processes: each under the limit, together over it (the cgroup bounds the tree)
    "for i in 1 2 3 4; do python3 -c 'import time; b = bytearray(100 * 1024 * 1024); time.sleep(20)' & done; wait",
], ids=["one", "spread"])
def test_memory_past_memory_mb_is_stopped_naming_it(limited: Stack, lapi: Api, hog: str) -> None:
    s = lapi.create(f"lim-mem-{len(hog)}")
    t0 = time.monotonic()
    res, _ = command_result(lapi, s["id"], hog)
    took = time.monotonic() - t0
    assert res["limit"] == "memory_mb", res
    assert "[sandbox] memory_mb = 256" in res["output"] and not res["ok"], res["output"][-400:]
    assert took < 20, f"the result came {took:.1f}s after the call"
    takes_a_turn_at_once(lapi, s["id"])


@pytest.mark.parametrize("writer", [
    "head -c 150M /dev/zero > big.bin; echo went-on",
    "dd if=/dev/zero of=big.bin bs=1M count=150 2>&1 | tail -1",
    "python3 -c \"open('big.bin', 'wb').write(bytes(150 * 1024 * 1024))\"",
], ids=["head", "dd", "python"])
def test_a_file_past_file_mb_is_refused_naming_it(limited: Stack, lapi: Api, writer: str) -> None:
    s = lapi.create(f"lim-file-{writer.split()[0]}")
    ws = Path(s["workspace"])
    res, _ = command_result(lapi, s["id"], writer)
    assert res["limit"] == "file_mb", res["output"]
    assert "[sandbox] file_mb = 100" in res["output"], res["output"][-400:]
    assert (ws / "big.bin").stat().st_size <= 100 * 1024 * 1024, "the kernel stopped the file at file_mb"
    takes_a_turn_at_once(lapi, s["id"])


@pytest.mark.parametrize("burn", [
    "while :; do :; done",
    # four processes: none reaches cpu_seconds alone before the tree's total does
    "for i in 1 2 3 4; do (while :; do :; done) & done; wait",
], ids=["one", "spread"])
def test_cpu_past_cpu_seconds_is_stopped_naming_it(limited: Stack, lapi: Api, burn: str) -> None:
    s = lapi.create(f"lim-cpu-{len(burn)}")
    t0 = time.monotonic()
    res, _ = command_result(lapi, s["id"], burn, timeout_s=60)
    took = time.monotonic() - t0
    assert res["limit"] == "cpu_seconds", res
    assert "[sandbox] cpu_seconds = 3" in res["output"] and not res["ok"], res["output"][-400:]
    assert took < 30, f"the result came {took:.1f}s after the call (time-out 60s)"
    takes_a_turn_at_once(lapi, s["id"])


# ---------------------------------------------------------------- what one command adds


def store_size(ws: Path) -> int:
    total = 0
    for top, _, names in os.walk(ws / ".coxswain"):
        for n in names:
            try:
                total += os.lstat(os.path.join(top, n)).st_size
            except OSError:
                pass
    return total


MANY = ("python3 -c \"import os, time\nos.makedirs('many', exist_ok=True)\n"
        "for i in range(100000):\n    open(f'many/f{i}', 'w').write(str(i))\nprint('END', time.time())\"")


def test_a_hundred_thousand_files_are_not_versioned_whole_and_the_result_comes_at_once(bapi: Api) -> None:
    lapi = bapi
    s = lapi.create("lim-many")
    ws = Path(s["workspace"])
    (ws / "keep.txt").write_text("before\n")
    command_result(lapi, s["id"], "echo warm")  # the shadow's first snapshot
    before = store_size(ws)
    res, evs = command_result(lapi, s["id"], MANY + " && echo changed > keep.txt", timeout_s=300, turn_timeout=400)
    ended = float(next(ln for ln in res["output"].splitlines() if ln.startswith("END")).split()[1])
    delay = res["ts"] / 1000 - ended
    grown = store_size(ws) - before
    print(f"\n100,000 files: result {delay:.2f}s after the command's end; .coxswain grew {grown / 1e6:.2f} MB")
    assert res["limit"] == "workspace_files", res
    assert "[sandbox] workspace_files = 500" in res["output"] and "not versioned" in res["output"], res["output"]
    assert delay < 20, f"the result came {delay:.1f}s after the command ended"
    assert grown < 20 * 1024 * 1024, f".coxswain grew by {grown} bytes"
    written = [e for e in evs if e["type"] == "file.written"]
    assert 0 < len(written) <= 500, len(written)
    # the session is free, its next command's snapshot is quick, and undo still works for
    # what was versioned
    assert takes_a_turn_at_once(lapi, s["id"]) < 15


def test_big_files_are_not_copied_into_the_shadow_and_workspace_mb_is_named(bapi: Api) -> None:
    """A 70 MB file (over the 64 MB the store keeps) is indexed by id, never copied; 30 MB of
    small files past workspace_mb = 20 are not versioned past the bound."""
    lapi = bapi
    s = lapi.create("lim-big")
    ws = Path(s["workspace"])
    command_result(lapi, s["id"], "echo warm")
    before = store_size(ws)
    t0 = time.monotonic()
    res, _ = command_result(lapi, s["id"], "head -c 70M /dev/urandom > big.bin && head -c 70M /dev/urandom > big.bin")
    took = time.monotonic() - t0
    grown = store_size(ws) - before
    print(f"\n70 MB file written twice: turn {took:.2f}s; .coxswain grew {grown / 1e6:.2f} MB")
    assert grown < 5 * 1024 * 1024, f"the shadow copied the big file: .coxswain grew by {grown} bytes"
    assert res["limit"] == "workspace_mb", res  # 70 MB added > workspace_mb = 20
    # rewriting it again costs no copy either
    res, _ = command_result(lapi, s["id"], "head -c 70M /dev/urandom > big.bin")
    assert store_size(ws) - before < 5 * 1024 * 1024
    res, _ = command_result(lapi, s["id"], "mkdir -p m && for i in $(seq 1 30); do head -c 1M /dev/urandom > m/f$i; done")
    assert res["limit"] == "workspace_mb", res
    assert "[sandbox] workspace_mb = 20" in res["output"], res["output"]
    assert store_size(ws) - before < 30 * 1024 * 1024
    takes_a_turn_at_once(lapi, s["id"])


# ---------------------------------------------------------------- status


def test_the_limits_and_the_cgroup_state_are_in_healthz(lapi: Api) -> None:
    body = lapi.http.get("/healthz").json()
    assert body["sandbox"]["limits"]["max_processes"] == 200
    lim = body["services"]["turn-runner"]["detail"]["sandbox"]["limits"]
    assert lim["cgroups"] in ("v1", "v2") and "pids" in lim["controllers"] and "memory" in lim["controllers"], lim
    assert lim["rlimits"] is True and lim["memory_mb"] == 256


NOBODY = """
import asyncio, json, sys, tempfile
from pathlib import Path
from coxswain.config import SandboxConfig
from cox_runner.workspace import limits, tools
from cox_runner.workspace.sandbox import Sandbox

async def main():
    sb = Sandbox(SandboxConfig(mode="none", file_mb=1, cpu_seconds=2), ".coxswain")
    st = limits.of(sb).probe()
    ws = Path(tempfile.mkdtemp())
    big = await tools.run_command(ws, "head -c 3M /dev/zero > f; echo went-on", 20, 4000, sb)
    cpu = await tools.run_command(ws, "while :; do :; done", 20, 4000, sb)
    print(json.dumps({"cgroups": st.cgroups, "reason": st.reason, "big": big.limit, "size": (ws / "f").stat().st_size,
                      "cpu": cpu.limit}))

asyncio.run(main())
"""


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to become an unprivileged user for the test")
def test_without_a_writable_cgroup_the_rlimits_still_hold_and_the_status_says_cgroups_are_off() -> None:
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.run(["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", "--",
                           sys.executable, "-c", NOBODY], capture_output=True, text=True, timeout=60, cwd="/tmp",
                          env={"PATH": os.environ["PATH"], "HOME": "/tmp",
                               "PYTHONPATH": f"{root}/shared:{root}/services/turn-runner"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["cgroups"] == "off" and got["reason"], got
    assert got["big"] == "file_mb" and got["size"] == 1024 * 1024, got
    assert got["cpu"] == "cpu_seconds", got


def test_a_hook_that_forks_without_end_fails_closed_naming_max_processes(limited: Stack, lapi: Api) -> None:
    """A repository's hooks.json runs a fork bomb before every command: the hook is stopped at
    max_processes, it fails closed (the call is denied) and the turn ends soon."""
    ws = limited.root / "lim-hook"
    (ws / ".coxswain").mkdir(parents=True)
    (ws / ".coxswain" / "hooks.json").write_text(json.dumps({"hooks": {"PreToolUse": [
        {"matcher": "run_command", "hooks": [{"type": "command", "command": ":(){ :|:& };:; sleep 30", "timeout": 60}]}]}}))
    s = lapi.create("lim-hook")
    t0 = time.monotonic()
    res, evs = command_result(lapi, s["id"], "echo never > ran.txt")
    took = time.monotonic() - t0
    decision = next(e for e in evs if e["type"] == "hook.decision" and e["hook_event"] == "PreToolUse")
    assert decision["decision"] == "deny" and decision["failed"] is True, decision
    assert "max_processes" in decision["reason"], decision["reason"]
    assert not res["ok"] and not (ws / "ran.txt").exists()
    assert took < 30, f"the turn took {took:.1f}s (the hook's time-out is 60s)"
    assert leftover_cgroups(limited) == []
