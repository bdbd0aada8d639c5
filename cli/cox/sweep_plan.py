"""What ``cox sweep`` is to do and what it has done: the task file, the results file, the
journal beside it, and which runs a resumed sweep re-attaches to. No I/O to the gateway here.

**Resuming.** A task is run at most once per model. ``RESULTS.jsonl`` holds one line per finished
(id, model); ``RESULTS.jsonl.journal`` records, fsynced, the sweep's nonce (its first line), an
*intent* before each ``POST /v1/runs`` and the session it made (*started*) after. Every POST
carries a ``client_id`` derived from the nonce, the task id and the model (:func:`client_id`), so
the server makes at most one run per unit however often it is sent. A sweep started again skips
what has a result, re-attaches to the started sessions, and for an intent with no session (the
sweep died between the POST and the journal write, or the POST's answer was lost) sends the POST
again: the server answers the run the first one made (200, ``replay``), or makes it if it never
did. An intent without a ``client_id`` (a journal an older cox sweep wrote) is looked up among the
principal's runs (``GET /v1/runs``) instead: :func:`reconcile` takes the run on the task's model
and workspace (``<template>-run-<n>``, or the task's own folder), with the task's prompt as its
first message and settings, created nearest the intent, and not already some other task's.

**Workspaces.** A task with a ``template`` runs in the server's fresh copy of it. A task without
one runs in a folder of its own named for the sweep, the task and the model
(:func:`own_workspace`: ``sweep-<results file>-<hash of its path>-<id>-<model>``), made by the
run, so that tasks never share files and a sweep's folders are found by name.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

Key = tuple[str, str]
"""A unit of a sweep: (task id, model)."""
SKEW_MS = 10 * 60 * 1000
"""How far a run's ``created`` (the server's clock) may lie before its intent (the sweep's clock)."""
MAX_ERRORS = 20
"""A bad task file reports this many of its bad lines, then stops counting."""


class SweepFileError(Exception):
    """A task, results or journal file that cannot be used: every message names file and line."""

    def __init__(self, messages: list[str]) -> None:
        super().__init__("\n".join(messages))
        self.messages = messages


class Task(BaseModel):
    """One line of the task file."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    id: str = Field(min_length=1, max_length=200)
    prompt: str = Field(min_length=1)
    template: str | None = Field(None, min_length=1, max_length=4096)
    model: str | None = Field(None, min_length=1)
    check: str | None = Field(None, min_length=1)
    max_turns: int | None = Field(None, ge=1)


FIELDS = ", ".join(Task.model_fields)


def _problem(err: dict[str, Any]) -> str:
    where = ".".join(str(x) for x in err.get("loc", ())) or "the task"
    kind = err.get("type", "")
    if kind == "missing":
        return f"{where}: missing (a task has {FIELDS})"
    if kind == "extra_forbidden":
        return f"{where}: unknown field (a task has {FIELDS})"
    return f"{where}: {err.get('msg', 'invalid')}"


def parse_tasks(text: str, name: str = "TASKS.jsonl") -> list[Task]:
    """The tasks of a JSONL text (blank lines skipped), or :class:`SweepFileError` listing every
    bad line (up to :data:`MAX_ERRORS`) as ``name:LINE: what is wrong``."""
    tasks: list[Task] = []
    errors: list[str] = []
    first_line: dict[str, int] = {}
    for n, raw in enumerate(text.splitlines(), 1):
        if not raw.strip():
            continue
        try:
            data = json.loads(raw)
        except ValueError as exc:
            errors.append(f"{name}:{n}: not JSON ({exc})")
            continue
        if not isinstance(data, dict):
            errors.append(f"{name}:{n}: a task is a JSON object {{id, prompt, ...}}, not {type(data).__name__}")
            continue
        try:
            task = Task.model_validate(data)
        except ValidationError as exc:
            errors.extend(f"{name}:{n}: {_problem(dict(e))}" for e in exc.errors())
            continue
        if task.id in first_line:
            errors.append(f"{name}:{n}: id {task.id!r} is already the id of line {first_line[task.id]}")
            continue
        first_line[task.id] = n
        tasks.append(task)
    if not tasks and not errors:
        errors.append(f"{name}: no tasks (one JSON object per line: {{id, prompt, template?, model?, check?, max_turns?}})")
    if errors:
        cut = errors[:MAX_ERRORS] + ([f"... and {len(errors) - MAX_ERRORS} more"] if len(errors) > MAX_ERRORS else [])
        raise SweepFileError(cut)
    return tasks


def load_tasks(path: Path) -> list[Task]:
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise SweepFileError([f"{path}: cannot read it ({exc.strerror or exc})"]) from exc
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise SweepFileError([f"{path}:{line}: not UTF-8"]) from exc
    return parse_tasks(text, str(path))


def parse_models(arg: str | None) -> list[str] | None:
    """``--models a,b``: the names, in order, without blanks or repeats."""
    if arg is None:
        return None
    names = [m.strip() for m in arg.split(",") if m.strip()]
    if not names:
        raise SweepFileError(["--models: no model named (e.g. --models script,claude)"])
    return list(dict.fromkeys(names))


@dataclass(frozen=True)
class Unit:
    """A task on one model: what one run of the sweep is."""

    task: Task
    model: str

    @property
    def key(self) -> Key:
        return (self.task.id, self.model)

    def workspace(self, tag: str) -> str | None:
        """The folder this unit runs in when it has no template (None: the template's copy)."""
        return None if self.task.template is not None else own_workspace(tag, self)


_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")


def _slug(text: str, width: int) -> str:
    """``text`` as a folder-name part: safe characters only, and a hash of it when it had others
    (or was longer), so two different texts never give one name."""
    slug = _UNSAFE.sub("_", text).strip("._") or "x"
    if slug == text and len(slug) <= width:
        return slug
    return f"{slug[:width]}-{hashlib.sha256(text.encode()).hexdigest()[:6]}"


def sweep_tag(out: Path) -> str:
    """The prefix of this sweep's own workspaces: its results file's name and a hash of its path
    (the same sweep resumed has the same tag; another results file, another one)."""
    digest = hashlib.sha256(str(out.resolve()).encode()).hexdigest()[:6]
    return f"sweep-{_slug(out.stem, 24)}-{digest}"


def own_workspace(tag: str, unit: Unit) -> str:
    return f"{tag}-{_slug(unit.task.id, 60)}-{_slug(unit.model, 40)}"


def plan(tasks: list[Task], models: list[str] | None, default_model: str, known: Iterable[str]) -> list[Unit]:
    """Every (task, model) to run, in file order: each task on each of ``--models``, else on its
    own ``model``, else on the server's default. A model the server does not offer is an error."""
    units = [Unit(t, m) for t in tasks for m in (models or [t.model or default_model])]
    offered = set(known)
    unknown = sorted({u.model for u in units} - offered)
    if unknown:
        raise SweepFileError([f"unknown model {m!r}: the server offers {', '.join(sorted(offered))}" for m in unknown])
    return units


# ---------------------------------------------------------------- durable JSON lines

def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The objects of a JSON-lines file this sweep wrote (none when it does not exist). A last
    line cut short by a crash is dropped, and cut from the file so the next append starts clean;
    any other bad line is an error (the file is not ours, or was edited)."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise SweepFileError([f"{path}: cannot read it ({exc.strerror or exc})"]) from exc
    keep = raw[: raw.rfind(b"\n") + 1]
    out: list[dict[str, Any]] = []
    for n, line in enumerate(keep.splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except ValueError as exc:
            raise SweepFileError([f"{path}:{n}: not a line cox sweep wrote ({exc})"]) from exc
        if not isinstance(obj, dict):
            raise SweepFileError([f"{path}:{n}: not a line cox sweep wrote (not an object)"])
        out.append(obj)
    if len(keep) != len(raw):
        with open(path, "r+b") as f:
            f.truncate(len(keep))
            os.fsync(f.fileno())
    return out


class Appender:
    """Appends JSON lines, each flushed and fsynced before :meth:`add` returns."""

    def __init__(self, path: Path) -> None:
        fresh = not path.exists()
        self.path = path
        self.file = open(path, "a", encoding="utf-8")  # held open for the sweep's life
        if fresh:
            # the new name must outlive a crash too, not only the bytes
            fd = os.open(path.parent, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)

    def add(self, obj: dict[str, Any]) -> None:
        self.file.write(json.dumps(obj, ensure_ascii=False, separators=(", ", ": ")) + "\n")
        self.file.flush()
        os.fsync(self.file.fileno())

    def close(self) -> None:
        self.file.close()


def journal_path(out: Path) -> Path:
    return out.with_name(out.name + ".journal")


def sweep_line(nonce: str) -> dict[str, Any]:
    """The journal's line naming this sweep: the nonce its runs' ``client_id`` are derived from."""
    return {"event": "sweep", "nonce": nonce}


def new_nonce() -> str:
    return secrets.token_hex(16)


def nonce_of(journal: list[dict[str, Any]]) -> str | None:
    """The nonce of the journal's (first) sweep line; None for a fresh journal, or one an older
    cox sweep wrote."""
    return next((str(j["nonce"]) for j in journal if j.get("event") == "sweep" and j.get("nonce")), None)


def client_id(nonce: str, unit: Unit) -> str:
    """The ``client_id`` of the run of ``unit`` in the sweep of ``nonce``: the same on every
    attempt of this sweep (so a POST sent again answers the run the first one made), another in a
    sweep whose results file and journal were removed to start afresh."""
    digest = hashlib.sha256(f"{nonce}\n{unit.task.id}\n{unit.model}".encode()).hexdigest()
    return f"sw-{digest[:48]}"


def intent(unit: Unit, at_ms: int, cid: str | None = None) -> dict[str, Any]:
    line: dict[str, Any] = {"event": "intent", "id": unit.task.id, "model": unit.model, "at": at_ms}
    if cid is not None:
        line["client_id"] = cid
    return line


def started(unit: Unit, session_id: str, workspace: str | None) -> dict[str, Any]:
    return {"event": "started", "id": unit.task.id, "model": unit.model, "session_id": session_id,
            "workspace": workspace}


# ---------------------------------------------------------------- resuming

@dataclass
class Resume:
    """What earlier attempts of this sweep left: finished results, sessions to re-attach to, and
    intents whose session (if their POST made one) is not known yet."""

    done: dict[Key, dict[str, Any]] = field(default_factory=dict)
    attach: dict[Key, str] = field(default_factory=dict)
    unsure: dict[Key, int] = field(default_factory=dict)

    def claimed(self) -> set[str]:
        """Every session this sweep knows to be some task's."""
        return {str(r["session_id"]) for r in self.done.values() if r.get("session_id")} | set(self.attach.values())


def resume(results: list[dict[str, Any]], journal: list[dict[str, Any]]) -> Resume:
    r = Resume()
    for res in results:
        r.done[(str(res["id"]), str(res["model"]))] = res
    for j in journal:
        key = (str(j.get("id")), str(j.get("model")))
        if key in r.done:
            continue
        if j.get("event") == "intent":
            # An intent with a client_id needs no look-up: its POST sent again answers the run it
            # made, if it made one. One without (an older cox sweep's) is looked up.
            if key not in r.attach and not j.get("client_id"):
                r.unsure[key] = int(j.get("at") or 0)
        elif j.get("event") == "started":
            r.attach[key] = str(j["session_id"])
            r.unsure.pop(key, None)
    return r


def workspace_fits(unit: Unit, tag: str, workspace: str) -> bool:
    """Could the run of ``unit`` have this workspace (the absolute path the server names it by)?
    A template's copy is ``<template>-run-<n>`` beside it; a task without one has its own folder."""
    name = own_workspace(tag, unit) if unit.task.template is None else unit.task.template.strip("/")
    suffix = "" if unit.task.template is None else r"-run-\d+"
    return re.search(r"(?:^|/)" + re.escape(name) + suffix + "$", workspace) is not None


def run_fits(unit: Unit, tag: str, session: dict[str, Any], confirm: str, first_text: str | None) -> bool:
    """Is this session (with its ``run``) what the POST of ``unit`` would have made?"""
    run = session.get("run") or {}
    return (session.get("model") == unit.model and workspace_fits(unit, tag, str(session.get("workspace", "")))
            and run.get("unattended") is True and run.get("confirm") == confirm
            and (unit.task.max_turns is None or run.get("max_turns") == unit.task.max_turns)
            and first_text == unit.task.prompt)


def reconcile(unsure: dict[Unit, int], sessions: list[dict[str, Any]], first_texts: Mapping[str, str | None],
              claimed: set[str], confirm: str, tag: str) -> dict[Key, str]:
    """The session each unsure intent made, for those that made one (see the module docstring).

    ``sessions`` are the principal's runs, ``first_texts`` the text of each one's first
    ``user.msg``, ``claimed`` the sessions known to be other tasks'. Earlier intents choose
    first; each takes the fitting run created nearest its time, and no run is taken twice, so of
    two identical tasks whose intents are both unsure each gets one run."""
    taken = set(claimed)
    found: dict[Key, str] = {}
    for unit, at in sorted(unsure.items(), key=lambda kv: (kv[1], kv[0].key)):
        fits = [s for s in sessions
                if str(s["id"]) not in taken and int(s.get("created") or 0) >= at - SKEW_MS
                and run_fits(unit, tag, s, confirm, first_texts.get(str(s["id"])))]
        if not fits:
            continue
        best = min(fits, key=lambda s: (abs(int(s.get("created") or 0) - at), str(s["id"])))
        found[unit.key] = str(best["id"])
        taken.add(str(best["id"]))
    return found


def candidates(unsure: dict[Unit, int], sessions: list[dict[str, Any]], claimed: set[str], tag: str) -> Iterator[str]:
    """The sessions whose first message :func:`reconcile` needs to see (it is not in the session
    object): the unclaimed runs on a model, and in a workspace, some unsure intent could have."""
    for s in sessions:
        sid = str(s["id"])
        if sid in claimed:
            continue
        if any(s.get("model") == u.model and workspace_fits(u, tag, str(s.get("workspace", ""))) for u in unsure):
            yield sid
