"""Resuming a sweep without a server: the results and journal files survive a crash mid-line,
what has a result is skipped, recorded sessions are re-attached to, and an intent whose session
was never recorded finds its run among the principal's runs, never another task's."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from cox.sweep_plan import (
    SKEW_MS,
    Appender,
    SweepFileError,
    Task,
    Unit,
    candidates,
    client_id,
    intent,
    nonce_of,
    own_workspace,
    read_jsonl,
    reconcile,
    resume,
    started,
    sweep_line,
    sweep_tag,
    workspace_fits,
)

T0 = 1_800_000_000_000
TAG = "sweep-r-abc123"


def unit(tid: str, prompt: str = "do it", model: str = "script", template: str | None = "repo", **kw: Any) -> Unit:
    return Unit(Task(id=tid, prompt=prompt, template=template, **kw), model)


def session(sid: str, created: int, workspace: str = "repo-run-1", model: str = "script", confirm: str = "person",
            **run: Any) -> dict[str, Any]:
    return {"id": sid, "workspace": workspace, "model": model, "created": created,
            "run": {"state": "running", "confirm": confirm, "unattended": True, "max_turns": 10, "turns": 0, **run}}


def test_lines_are_appended_durably_and_a_torn_last_line_is_cut(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    assert read_jsonl(path) == []
    out = Appender(path)
    out.add({"id": "a", "n": 1})
    out.add({"id": "b", "n": "é"})
    out.close()
    with open(path, "a") as f:
        f.write('{"id": "c", "n"')  # the crash came mid-line
    assert read_jsonl(path) == [{"id": "a", "n": 1}, {"id": "b", "n": "é"}]
    assert path.read_text().endswith("}\n"), "the torn line is cut, so the next append starts a clean line"
    again = Appender(path)
    again.add({"id": "c", "n": 3})
    again.close()
    assert [r["id"] for r in read_jsonl(path)] == ["a", "b", "c"]


def test_a_bad_line_inside_the_file_is_an_error_not_skipped(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    path.write_text('{"id": "a"}\nnot json\n{"id": "b"}\n')
    with pytest.raises(SweepFileError, match=r"r.jsonl:2: not a line cox sweep wrote"):
        read_jsonl(path)
    path.write_text('{"id": "a"}\n[1]\n')
    with pytest.raises(SweepFileError, match=r"r.jsonl:2: .*not an object"):
        read_jsonl(path)


def test_resume_skips_results_attaches_to_started_runs_and_keeps_unsure_intents() -> None:
    a, b, c, d = unit("a"), unit("b"), unit("c"), unit("a", model="claude")
    results = [{"id": "a", "model": "script", "session_id": "s_a", "passed": True}]
    journal = [intent(a, T0), started(a, "s_a", "repo-run-1"),
               intent(b, T0 + 1), started(b, "s_b", "repo-run-2"),
               intent(c, T0 + 2),
               intent(d, T0 + 3)]
    r = resume(results, journal)
    assert set(r.done) == {("a", "script")}
    assert r.attach == {("b", "script"): "s_b"}
    assert r.unsure == {("c", "script"): T0 + 2, ("a", "claude"): T0 + 3}
    assert r.claimed() == {"s_a", "s_b"}
    # an intent written again after its start (a retry) does not make a started run unsure
    assert resume([], [intent(b, T0), started(b, "s_b", None), intent(b, T0 + 9)]).unsure == {}


def test_an_unsure_intent_finds_the_run_it_made_and_nothing_else() -> None:
    u = unit("t1", prompt="fix the bug")
    texts = {"s_old": "fix the bug", "s_other": "another task", "s_mine": "fix the bug", "s_model": "fix the bug",
             "s_ws": "fix the bug", "s_taken": "fix the bug", "s_yolo": "fix the bug"}
    sessions = [
        session("s_old", T0 - SKEW_MS - 1),                        # long before the intent
        session("s_other", T0 + 50),                               # another prompt
        session("s_model", T0 + 40, model="claude"),               # another model
        session("s_ws", T0 + 30, workspace="/srv/root/other-run-1"),  # not a copy of the template
        session("s_taken", T0 + 10),                               # some other task's, known
        session("s_yolo", T0 + 20, confirm="yolo"),                # other settings
        session("s_mine", T0 + 60, workspace="/srv/root/repo-run-12"),
    ]
    assert reconcile({u: T0}, sessions, texts, {"s_taken"}, "person", TAG) == {("t1", "script"): "s_mine"}
    assert set(candidates({u: T0}, sessions, {"s_taken"}, TAG)) == {"s_old", "s_other", "s_yolo", "s_mine"}
    # the run was never made: nothing fits, the task is started again
    assert reconcile({u: T0}, [s for s in sessions if s["id"] != "s_mine"], texts, {"s_taken"}, "person", TAG) == {}


def test_max_turns_and_a_task_without_template_are_matched_too() -> None:
    u = unit("t", template=None, max_turns=3)
    own = u.workspace(TAG)
    assert own == "sweep-r-abc123-t-script"
    texts = {"s1": "do it", "s2": "do it", "s3": "do it"}
    sessions = [session("s1", T0 + 5, workspace=own), session("s2", T0 + 6, workspace="/srv/root/" + own, max_turns=3),
                session("s3", T0 + 6, workspace="/srv/root/x" + own, max_turns=3)]
    assert reconcile({u: T0}, sessions, texts, set(), "person", TAG) == {("t", "script"): "s2"}


def test_workspaces_are_matched_by_their_name_under_the_root() -> None:
    t = unit("t", template="team/app")
    assert workspace_fits(t, TAG, "/srv/root/team/app-run-3") and workspace_fits(t, TAG, "team/app-run-3")
    assert not workspace_fits(t, TAG, "/srv/root/team/myapp-run-3")
    assert not workspace_fits(t, TAG, "/srv/root/team/app-run-3/sub")
    assert not workspace_fits(t, TAG, "/srv/root/team/app-run-x")
    assert workspace_fits(unit("t", template="/srv/root/team/app"), TAG, "/srv/root/team/app-run-1")


def test_a_task_without_template_has_a_folder_of_its_own_per_sweep_and_model(tmp_path: Path) -> None:
    tag = sweep_tag(tmp_path / "results.jsonl")
    assert re.fullmatch(r"sweep-results-[0-9a-f]{6}", tag)
    assert tag == sweep_tag(tmp_path / "." / "results.jsonl"), "the same file resumed: the same folders"
    assert tag != sweep_tag(tmp_path / "other" / "results.jsonl")
    names = {own_workspace(tag, unit(i, template=None, model=m)) for i in ("a/b", "a_b", "a b", "..") for m in ("x", "y")}
    assert len(names) == 8, "ids that slug alike still get folders of their own"
    assert all(re.fullmatch(r"[A-Za-z0-9_.-]+", n) and not n.startswith(".") for n in names), names
    assert unit("a", template="repo").workspace(tag) is None


def test_identical_tasks_in_flight_together_each_get_one_run_nearest_their_intent() -> None:
    first, second, third = unit("a"), unit("b"), unit("c")
    sessions = [session("s_2", T0 + 1010, workspace="repo-run-2"), session("s_1", T0 + 15, workspace="repo-run-1")]
    texts = {"s_1": "do it", "s_2": "do it"}
    found = reconcile({second: T0 + 1000, first: T0, third: T0 + 2000}, sessions, texts, set(), "person", TAG)
    # each run once; the third intent's POST made nothing, so it starts afresh
    assert found == {("a", "script"): "s_1", ("b", "script"): "s_2"}


def test_journal_lines_name_the_unit() -> None:
    u = unit("t9", model="claude")
    assert intent(u, 5) == {"event": "intent", "id": "t9", "model": "claude", "at": 5}
    assert json.loads(json.dumps(started(u, "s_x", "repo-run-3"))) == {
        "event": "started", "id": "t9", "model": "claude", "session_id": "s_x", "workspace": "repo-run-3"}


def test_client_ids_are_fixed_per_sweep_task_and_model_and_valid_ids() -> None:
    a, b = unit("t1"), unit("t2")
    cid = client_id("n1", a)
    assert cid == client_id("n1", unit("t1", prompt="another prompt")), "the task id and model name it"
    assert len({cid, client_id("n1", b), client_id("n2", a), client_id("n1", unit("t1", model="other"))}) == 4
    assert re.fullmatch(r"[A-Za-z0-9_-]{1,64}", cid), cid


def test_an_intent_with_a_client_id_is_posted_again_not_looked_up() -> None:
    a, b = unit("t1"), unit("t2")
    journal = [sweep_line("n1"), intent(a, T0, client_id("n1", a)), intent(b, T0)]
    assert nonce_of(journal) == "n1" and nonce_of([intent(b, T0)]) is None
    r = resume([], journal)
    assert r.unsure == {b.key: T0}, "only the older sweep's intent (no client_id) is looked up"
    assert r.attach == {} and r.done == {}
