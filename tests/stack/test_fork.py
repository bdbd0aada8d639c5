"""Fork and rewind, conversation and files together, through HTTP against a real stack.

A session of four turns writes files with ``write_file`` and with shell commands
(``run_command``: ``echo x > f``, ``rm``); a fork at turn 2 gets the files as they were after
turn 2 and the transcript of turns 1-2 (what the model is sent is read back through the script
model's ``history`` step); rewinds put back the files, the conversation, or both, and a files
rewind is undone as one write. Busy sessions and bad input are refused and change nothing.
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path
from typing import Any

from tests.support.flow import run_turn
from tests.support.stack import OTHER_TOKEN, Api, Stack, said, stack_fixture

CONFIG = """
[approval]
commands = "allow"
"""

stack = stack_fixture("fork", runners=1, config=CONFIG)


def write(path: str, content: str) -> dict[str, Any]:
    return {"name": "write_file", "args": {"path": path, "content": content}}


def cmd(command: str) -> dict[str, Any]:
    return {"name": "run_command", "args": {"command": command}}


TURNS = [
    ("turn one", [write("a.txt", "one"), write("b.txt", "b1")]),
    ("turn two", [write("a.txt", "two"), cmd("echo x > f")]),
    ("turn three", [cmd("echo y > f"), write("c.txt", "new"), write("a.txt", "three")]),
    ("turn four", [cmd("rm b.txt"), write("a.txt", "four")]),
]
AFTER = {
    1: {"a.txt": "one", "b.txt": "b1"},
    2: {"a.txt": "two", "b.txt": "b1", "f": "x\n"},
    4: {"a.txt": "four", "c.txt": "new", "f": "y\n"},
}


def files(ws: Path) -> dict[str, str]:
    """Every file of a workspace but the versions store, by relative path."""
    out: dict[str, str] = {}
    for dirpath, dirnames, names in os.walk(ws):
        dirnames[:] = [d for d in dirnames if not (Path(dirpath) == ws and d == ".coxswain")]
        for n in names:
            p = Path(dirpath) / n
            out[str(p.relative_to(ws))] = p.read_text()
    return out


def four_turns(api: Api, name: str) -> dict[str, Any]:
    s = api.create(name)
    for text, tools in TURNS:
        evs = run_turn(api, s["id"], said(text, {"tools": tools}, {"text": "done"}))
        assert [e["outcome"] for e in evs if e["type"] == "turn.end"] == ["completed"], evs
        assert all(e["ok"] for e in evs if e["type"] == "tool.result"), evs
    assert files(Path(s["workspace"])) == AFTER[4]
    return api.session(s["id"])


def history(api: Api, sid: str, text: str) -> list[str]:
    """Run a turn whose model answers with the turn messages it was sent (oldest first)."""
    evs = run_turn(api, sid, said(text, {"history": True}))
    msg = next(e for e in evs if e["type"] == "assistant.msg")
    assert msg["text"].startswith("history: "), msg
    return list(json.loads(msg["text"].removeprefix("history: ")))


def turn_texts(evs: list[dict[str, Any]]) -> list[str]:
    starts = {e["message_id"] for e in evs if e["type"] == "turn.start"}
    return [e["text"].splitlines()[0] for e in evs if e["type"] == "user.msg" and e["message_id"] in starts]


def rewind(api: Api, sid: str, to_turn: int, scope: str) -> dict[str, Any]:
    r = api.http.post(f"/v1/sessions/{sid}/rewind", json={"to_turn": to_turn, "scope": scope})
    assert r.status_code == 200, r.text
    return dict(r.json())


# ------------------------------------------------------------------ fork


def test_fork_at_turn_two_of_four(stack: Stack, api: Api) -> None:
    src = four_turns(api, "fork-src")
    sid, ws = src["id"], Path(src["workspace"])
    before = api.all_events(sid)

    r = api.http.post(f"/v1/sessions/{sid}/fork", json={"at_turn": 2})
    assert r.status_code == 201, r.text
    fork = r.json()
    fid, fws = fork["id"], Path(fork["workspace"])
    assert fid != sid and fws != ws and fws.parent == ws.parent and fws.name == "fork-src-fork-1"
    assert fork["title"] == f"{src['title']} (fork)" and fork["model"] == src["model"] and not fork["busy"]
    assert fid in [s["id"] for s in api.http.get("/v1/sessions").json()]

    # the files as they were after turn 2: the shell's f is x again, c.txt (made in turn 3) absent,
    # b.txt (removed by a command in turn 4) back
    assert files(fws) == AFTER[2]
    # the source is untouched: files, log
    assert files(ws) == AFTER[4]
    assert api.all_events(sid) == before

    evs = api.all_events(fid)
    forked = [e for e in evs if e["type"] == "session.forked"]
    assert len(forked) == 1 and forked[0]["from_sid"] == sid and forked[0]["at_turn"] == 2
    assert forked[0]["through_seq"] == next(e["seq"] for e in before if e["type"] == "turn.end" and
                                            e["turn_id"] == [x for x in before if x["type"] == "turn.start"][1]["turn_id"])
    assert sorted(forked[0]["restored_files"]) == ["a.txt", "b.txt", "c.txt", "f"]
    assert turn_texts(evs) == ["turn one", "turn two"]
    assert [e["seq"] for e in evs] == list(range(1, len(evs) + 1)) and all(e["sid"] == fid for e in evs)

    # what the model is sent in the fork: turns 1-2 and the new one
    assert history(api, fid, "what does the fork see") == ["turn one", "turn two", "what does the fork see"]
    # and the source's model still has all four
    assert history(api, sid, "what does the source see") == ["turn one", "turn two", "turn three", "turn four",
                                                             "what does the source see"]

    # a second fork takes the next free name; a fork of a busy session at an ended turn works
    started = api.send(sid, said("slow", {"text": "slow", "delay_ms": 4000}))
    assert started.status_code == 202
    assert api.session(sid)["busy"]
    r = api.http.post(f"/v1/sessions/{sid}/fork", json={"at_turn": 1})
    assert r.status_code == 201, r.text
    assert Path(r.json()["workspace"]).name == "fork-src-fork-2"
    assert files(Path(r.json()["workspace"])) == AFTER[1]
    # the running turn (6) cannot be forked at
    r = api.http.post(f"/v1/sessions/{sid}/fork", json={"at_turn": 6})
    assert r.status_code == 409 and r.json()["error"] == "busy", r.text
    api.wait_idle(sid, timeout=30)


# ------------------------------------------------------------------ rewind


def test_rewind_files_conversation_both(stack: Stack, api: Api) -> None:
    s = four_turns(api, "rewind-src")
    sid, ws = s["id"], Path(s["workspace"])

    # files only: the files of turn 2, every one put back recorded
    out = rewind(api, sid, 2, "files")
    assert out["scope"] == "files" and sorted(out["restored_files"]) == ["a.txt", "b.txt", "c.txt", "f"]
    assert files(ws) == AFTER[2]
    evs = api.all_events(sid)
    ev = evs[-1]
    assert ev["type"] == "session.rewound" and ev["to_turn"] == 2 and ev["scope"] == "files"
    assert sorted(e["path"] for e in evs if e["type"] == "file.written" and e.get("via") == "rewind") == \
        sorted(out["restored_files"])
    # the rewind is a write like any other: one undo puts every file back
    r = api.http.post(f"/v1/sessions/{sid}/undo")
    assert r.status_code == 200, r.text
    assert sorted(f["path"] for f in r.json()["files"]) == sorted(out["restored_files"])
    assert files(ws) == AFTER[4]
    rewind(api, sid, 2, "files")
    assert files(ws) == AFTER[2]
    # the conversation goes on from the full history (turn 5)
    assert history(api, sid, "after files") == ["turn one", "turn two", "turn three", "turn four", "after files"]

    # conversation only: the files stay; the next request holds turns 1-2 and what follows
    on_disk = files(ws)
    out = rewind(api, sid, 2, "conversation")
    assert out["restored_files"] == [] and files(ws) == on_disk
    assert history(api, sid, "after conversation") == ["turn one", "turn two", "after conversation"]
    # turn numbers are never reused: that was turn 6, and the transcript turn 6 saw can come back
    assert history(api, sid, "and then") == ["turn one", "turn two", "after conversation", "and then"]

    # both, to turn 1
    rewind(api, sid, 1, "both")
    assert files(ws) == AFTER[1]
    assert history(api, sid, "after both") == ["turn one", "after both"]
    # back to the end of turn 6 (a turn a rewind had left out): its transcript comes back
    rewind(api, sid, 6, "conversation")
    assert history(api, sid, "back again") == ["turn one", "turn two", "after conversation", "back again"]


def test_rewind_refused_while_busy_and_bad_input(stack: Stack, api: Api) -> None:
    s = api.create("rewind-bad")
    sid, ws = s["id"], Path(s["workspace"])
    run_turn(api, sid, said("only turn", {"tools": [write("a.txt", "1")]}, {"text": "done"}))
    last = api.session(sid)["last_seq"]
    listed = len(api.http.get("/v1/sessions").json())

    def refused(path: str, body: Any, status: int, code: str, client: Api = api, to: str = sid) -> None:
        r = client.http.post(f"/v1/sessions/{to}/{path}", json=body)
        assert r.status_code == status and r.json()["error"] == code, (path, body, r.status_code, r.text)
        assert r.json()["detail"]

    refused("rewind", {"to_turn": 2, "scope": "both"}, 422, "invalid")
    refused("rewind", {"to_turn": 0, "scope": "both"}, 422, "invalid")
    refused("rewind", {"to_turn": 1, "scope": "everything"}, 422, "invalid")
    refused("rewind", {"to_turn": 1}, 422, "invalid")
    refused("rewind", {"to_turn": 1, "scope": "files", "extra": 1}, 422, "invalid")
    refused("fork", {"at_turn": 2}, 422, "invalid")
    refused("fork", {"at_turn": -1}, 422, "invalid")
    refused("fork", {}, 422, "invalid")
    refused("fork", {"at_turn": 1}, 404, "not_found", to="s_nosuchsession")
    refused("rewind", {"to_turn": 1, "scope": "files"}, 404, "not_found", to="s_nosuchsession")
    with stack.client(token=OTHER_TOKEN) as other:
        refused("fork", {"at_turn": 1}, 404, "not_found", client=other)
        refused("rewind", {"to_turn": 1, "scope": "both"}, 404, "not_found", client=other)

    # busy: a rewind waits for the turn to end (409), nothing recorded
    assert api.send(sid, said("slow", {"text": "slow", "delay_ms": 3000})).status_code == 202
    refused("rewind", {"to_turn": 1, "scope": "conversation"}, 409, "busy")
    api.wait_idle(sid, timeout=30)
    evs = api.all_events(sid)
    assert not [e for e in evs if e["type"] in ("session.rewound", "session.forked")]
    assert len(api.http.get("/v1/sessions").json()) == listed
    assert files(ws) == {"a.txt": "1"}
    assert [e["seq"] for e in evs if e["seq"] <= last] == list(range(1, last + 1))
    assert not [p for p in ws.parent.iterdir() if p.name.startswith("rewind-bad-fork")]


def test_a_fork_rewinds_its_own_turns_only(stack: Stack, api: Api) -> None:
    src = four_turns(api, "fork-of-fork")
    r = api.http.post(f"/v1/sessions/{src['id']}/fork", json={"at_turn": 3})
    assert r.status_code == 201, r.text
    fid, fws = r.json()["id"], Path(r.json()["workspace"])
    run_turn(api, fid, said("in the fork", {"tools": [write("a.txt", "forked"), cmd("echo z > f")]},
                            {"text": "done"}))
    at_fork = {"a.txt": "three", "b.txt": "b1", "c.txt": "new", "f": "y\n"}
    assert files(fws) != at_fork
    # the fork's own turn 3 (copied) is where its store begins: files back to it work
    out = rewind(api, fid, 3, "both")
    assert sorted(out["restored_files"]) == ["a.txt", "f"]
    assert files(fws) == at_fork
    # an earlier copied turn's files are in the source: refused, clearly; the conversation is fine
    r = api.http.post(f"/v1/sessions/{fid}/rewind", json={"to_turn": 1, "scope": "files"})
    assert r.status_code == 422 and src["id"] in r.json()["detail"], r.text
    assert files(fws) == at_fork
    rewind(api, fid, 1, "conversation")
    assert history(api, fid, "fork history") == ["turn one", "fork history"]


def test_there_is_no_fork_of_the_root_workspace(stack: Stack, api: Api) -> None:
    """The root itself is never a workspace (tests/stack/test_workspaces.py): no session there to fork."""
    r = api.http.post("/v1/sessions", json={"workspace": "."})
    assert r.status_code == 422 and r.json()["error"] == "workspace_invalid", r.text
    assert not (stack.root / "workspace-fork-1").exists()


# ------------------------------------------------------------------ a fork raced by link swaps

SECRET = "stack-admin-password-never-in-a-fork"
SWAP_CMD = r"""python3 - <<'PY'
import ctypes, ctypes.util, os, time
STATE = "{state}"
libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
def exchange(a, b):  # renameat2(RENAME_EXCHANGE): the two names swap atomically
    if libc.renameat2(-100, a.encode(), -100, b.encode(), 2) != 0:
        raise OSError(ctypes.get_errno(), "renameat2")
os.symlink(STATE, "d.link")
os.symlink(STATE + "/credentials.json", "f.link")
os.symlink(STATE, "deep/a.link")
open("swapping", "w").close()
n, deadline = 0, time.monotonic() + 60
while not os.path.exists("stop") and time.monotonic() < deadline:
    exchange("d", "d.link"); exchange("f", "f.link"); exchange("deep/a", "deep/a.link")
    os.rename("d", "d.real"); os.symlink(STATE, "d.tmp"); os.rename("d.tmp", "d")
    os.unlink("d"); os.rename("d.real", "d")
    n += 1
print("swaps", n)
PY"""


def no_host_path(stack: Stack, text: str) -> None:
    for p in (stack.tmp, stack.root, stack.root.resolve()):
        assert str(p) not in text, text


def test_a_fork_raced_by_a_command_swapping_links_copies_nothing_from_outside(stack: Stack, api: Api) -> None:
    state = stack.tmp / "state-outside"  # stands for the stack's state folder: outside every workspace
    (state / "nats").mkdir(parents=True, exist_ok=True)
    (state / "credentials.json").write_text(json.dumps({"admin": SECRET}))
    (state / "nats" / "store.dat").write_text(SECRET * 20)
    s = api.create("fork-race")
    sid, ws = s["id"], Path(s["workspace"])
    setup = "mkdir -p d deep/a/b && for i in $(seq 1 60); do echo inside $i > d/x$i; done && " \
            "echo plain > f && echo inner > deep/a/b/inner.txt"
    evs = run_turn(api, sid, said("set up", {"tools": [cmd(setup)]}, {"text": "done"}))
    assert all(e["ok"] for e in evs if e["type"] == "tool.result"), evs
    # turn 2: a command that keeps swapping d, f and deep/a for links to the state folder
    r = api.send(sid, said("swap", {"tools": [cmd(SWAP_CMD.format(state=state))]}, {"text": "done"}))
    assert r.status_code == 202, r.text
    deadline = time.monotonic() + 60
    while not (ws / "swapping").exists():
        assert time.monotonic() < deadline, api.all_events(sid)
        time.sleep(0.05)
    forks = []
    try:
        for _ in range(6):
            r = api.http.post(f"/v1/sessions/{sid}/fork", json={"at_turn": 1})
            if r.status_code != 201:
                no_host_path(stack, r.text)
            assert r.status_code == 201, r.text
            forks.append(Path(r.json()["workspace"]))
    finally:
        (ws / "stop").touch()
        api.wait_idle(sid, timeout=60)
    end = [e for e in api.all_events(sid) if e["type"] == "tool.result"][-1]
    swaps = re.search(r"swaps (\d+)", json.dumps(end))
    assert end["ok"] and swaps and int(swaps.group(1)) >= 10, end  # the forks ran while links were swapped
    for fws in forks:
        for dirpath, dirnames, names in os.walk(fws, followlinks=False):
            for n in dirnames + names:
                p = Path(dirpath) / n
                if p.is_symlink():
                    assert os.readlink(p).startswith(str(state)), p  # a link, its text only
                elif p.is_file():
                    assert SECRET not in p.read_text(errors="replace"), p
                    assert n not in ("credentials.json", "store.dat"), p
                else:
                    assert p.is_dir() and n != "nats", p
        # the model in the fork: read_file of the swapped names never reaches outside
        fs = next(x for x in api.http.get("/v1/sessions").json() if x["workspace"] == str(fws))
        evs = run_turn(api, fs["id"], said("read", {"tools": [
            {"name": "read_file", "args": {"path": "f"}},
            {"name": "read_file", "args": {"path": "d/x1"}},
            {"name": "read_file", "args": {"path": "deep/a/b/inner.txt"}}]}, {"text": "done"}))
        assert SECRET not in json.dumps(evs), evs


def test_a_failed_fork_says_what_failed_without_host_paths(stack: Stack, api: Api) -> None:
    s = api.create("fork-deep")
    sid, ws = s["id"], Path(s["workspace"])
    deep = "/".join(["n"] * 140)  # past the copy's depth bound (128)
    run_turn(api, sid, said("deep", {"tools": [cmd(f"mkdir -p {deep} && echo x > {deep}/leaf")]}, {"text": "done"}))
    assert (ws / deep / "leaf").exists()
    r = api.http.post(f"/v1/sessions/{sid}/fork", json={"at_turn": 1})
    assert r.status_code == 413 and r.json()["error"] == "too_large", r.text
    assert "128 deep" in r.json()["detail"] and "'n/n/n" in r.json()["detail"], r.text
    no_host_path(stack, r.text)
    assert "'/" not in r.json()["detail"]  # the entry relative to the workspace
    assert not [p for p in ws.parent.iterdir() if p.name.startswith("fork-deep-fork")]  # nothing left behind


def test_a_fifo_made_by_a_command_hangs_neither_a_fork_nor_a_read_nor_a_write(stack: Stack, api: Api) -> None:
    s = api.create("fork-fifo")
    sid, ws = s["id"], Path(s["workspace"])
    evs = run_turn(api, sid, said("fifo", {"tools": [cmd("mkfifo pipe AGENTS.md && echo ok > plain")]},
                                  {"text": "done"}))
    assert all(e["ok"] for e in evs if e["type"] == "tool.result"), evs
    # nobody ever writes the FIFOs: an open that waited for a writer would never return
    r = api.http.post(f"/v1/sessions/{sid}/fork", json={"at_turn": 1}, timeout=30)
    assert r.status_code == 201, r.text
    fws = Path(r.json()["workspace"])
    assert (fws / "plain").read_text() == "ok\n" and not (fws / "pipe").exists() and not (fws / "AGENTS.md").exists()
    evs = run_turn(api, sid, said("read it", {"tools": [{"name": "read_file", "args": {"path": "pipe"}},
                                                       write("pipe", "over a fifo")]}, {"text": "done"}), timeout=30)
    ends = [e for e in evs if e["type"] == "turn.end"]
    assert [e["outcome"] for e in ends] == ["completed"], evs
    results = [e for e in evs if e["type"] == "tool.result"]
    assert len(results) == 2 and not results[0]["ok"], results
    assert str(ws) not in json.dumps(results), results
