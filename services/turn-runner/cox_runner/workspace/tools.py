"""The tools the model has (docs/api.md, "Tools the model has"): their arguments' check and how the
workspace ones run (their definitions for the model: :mod:`.tooldefs`).

Policy is not decided here (that is guard's, via ``gate``); these functions do the I/O once a
call is allowed, through :mod:`coxswain.safefs` so every path is opened beneath the workspace.
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import os
import re
import signal
import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import uvloop

from coxswain import readpolicy, safefs, textedit
from coxswain.errors import Invalid
from coxswain.proc import dies_with_me

from . import limits, walk
from .egress import Request
from .sandbox import Sandbox

REQUIRED: dict[str, tuple[tuple[str, type | tuple[type, ...]], ...]] = {
    "read_file": (("path", str),),
    "list_dir": (("path", str),),
    "write_file": (("path", str), ("content", str)),
    "edit_file": (("path", str), ("old", str), ("new", str)),
    "find_files": (("pattern", str),),
    "search_text": (("pattern", str),),
    "run_command": (("command", str),),
    "start_program": (("command", str),),
    "read_program": (("program_id", str),),
    "write_program": (("program_id", str), ("text", str)),
    "stop_program": (("program_id", str),),
    "respond": (("text", str),),
    "plan_write": (("steps", list),),
    "plan_step": (("step", int),),
}
OPTIONAL: dict[str, tuple[tuple[str, type | tuple[type, ...]], ...]] = {
    "read_file": (("offset", int), ("limit", int)),
    "edit_file": (("count", int),),
    "search_text": (("path", str),),
    "run_command": (("timeout_s", (int, float)), ("network", bool)),
    "start_program": (("name", str), ("network", bool), ("pty", bool)),
    "read_program": (("wait_s", (int, float)), ("since", int)),
}
TOOL_NAMES = frozenset(REQUIRED)
"""The tools' names (every tool has an argument it requires, so a row above); their definitions,
offered to the model, are :data:`.tooldefs.TOOLS`."""
AT_LEAST_ONE: dict[str, tuple[str, ...]] = {"read_file": ("offset", "limit"), "edit_file": ("count",)}
"""Integer arguments that must be at least 1 when given."""
ACTIONS = frozenset({"write_file", "edit_file", "run_command", "start_program", "write_program"})
PROGRAM_TOOLS = frozenset({"start_program", "read_program", "write_program", "stop_program"})
WRITES = frozenset({"write_file", "edit_file"})
"""Tools that write a file through the fenced, versioned write (a staged write settles with their result)."""
READ_ONLY = readpolicy.READS
"""Tools that read the workspace and change nothing: decided by :mod:`coxswain.readpolicy`."""


def check_args(name: str, args: Any) -> str | None:
    """Why the arguments do not fit the tool, or None when they do."""
    if name not in TOOL_NAMES:
        return f"unknown tool {name!r}; the tools are {', '.join(sorted(TOOL_NAMES))}"
    if not isinstance(args, dict):
        return "arguments must be a JSON object"
    for key, typ in REQUIRED[name]:
        if key not in args:
            return f"missing argument {key!r}"
        if not isinstance(args[key], typ) or (typ is int and isinstance(args[key], bool)):
            return f"argument {key!r} has the wrong type"
    for key, typ in OPTIONAL.get(name, ()):
        value = args.get(key)
        if value is not None and (not isinstance(value, typ) or (typ is not bool and isinstance(value, bool))):
            return f"argument {key!r} has the wrong type"
    if name == "plan_write" and not all(isinstance(s, str) for s in args["steps"]):
        return "steps must be strings"
    if name == "read_program" and ((args.get("wait_s") or 0) < 0 or (args.get("since") or 0) < 0):
        return "wait_s and since may not be negative"
    for key in AT_LEAST_ONE.get(name, ()):
        if args.get(key) is not None and args[key] < 1:
            return f"argument {key!r} must be at least 1"
    return None


def clip(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return text[:limit] + f"\n[... {len(text) - limit} more characters not shown]"


def clip_output(kept: bytes, total: int, limit: int) -> str:
    """A command's output: at most ``limit`` bytes of it (cut at a character boundary) and, if
    it wrote more, how many bytes were not shown, counted in bytes (``total`` is all it wrote)."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    part = kept[:limit]
    text = decoder.decode(part, final=len(part) == len(kept))
    shown = len(part) - len(decoder.getstate()[0])  # a character cut in two is not shown
    if total > shown:
        text += f"\n[... {total - shown} more bytes of output not shown ({total} in all)]"
    return text


MAX_READ_BYTES = 20_000_000
"""read_file reads at most this much of a file to page through it by lines."""


def split_lines(text: str) -> list[str]:
    """The lines of ``text``, each with its ``\\n`` (the last may lack one); numbered from 1 as
    :func:`coxswain.textedit.line_of` numbers them."""
    parts = text.split("\n")
    lines = [p + "\n" for p in parts[:-1]]
    if parts[-1]:
        lines.append(parts[-1])
    return lines


def read_file(root: Path, rel: str, limit: int, offset: int | None = None, lines: int | None = None) -> str:
    """The file's text, at most ``limit`` characters of it.

    Without ``offset``/``lines`` a file that fits is answered as it is. Otherwise the answer is
    whole lines, from line ``offset`` (1-based, default 1), at most ``lines`` of them (the tool's
    ``limit`` argument), as many as fit in ``limit`` characters, under a first line that says
    which lines these are, how many the file has and where to read on.
    """
    paging = offset is not None or lines is not None
    data = safefs.read(root, rel, max_bytes=MAX_READ_BYTES + 1 if paging else limit + 1)
    if data is None:
        raise FileNotFoundError(f"no file {rel!r}")
    if not paging:
        if len(data) <= limit:
            return data.decode("utf-8", errors="replace")
        data = safefs.read(root, rel, max_bytes=MAX_READ_BYTES + 1) or b""
    partial = len(data) > MAX_READ_BYTES
    all_lines = split_lines(data[:MAX_READ_BYTES].decode("utf-8", errors="replace"))
    total = len(all_lines)
    of = f"at least {total}" if partial else str(total)
    if total == 0:
        return "[the file is empty]"
    start = offset or 1
    if start > total:
        raise ValueError(f"offset {start} is past the end: {rel} has {of} lines")
    end = total if lines is None else min(total, start - 1 + lines)
    budget = max(limit - 120, 200)
    shown: list[str] = []
    used = 0
    for line in all_lines[start - 1:end]:
        if used + len(line) > budget:
            if not shown:  # one line longer than the whole budget: show its start
                shown.append(line[:budget] + f"[... {len(line) - budget} more characters of this line]\n")
            break
        shown.append(line)
        used += len(line)
    last = start + len(shown) - 1
    more = f"; read on with offset={last + 1}" if last < total else ""
    return f"[lines {start}-{last} of {of}{more}]\n" + "".join(shown)


def edit_file(root: Path, rel: str, old: str, new: str, count: int | None = None) -> textedit.Edit:
    """``edit_file``'s new content for the file as it is now (or why there is none). Writes
    nothing: the caller writes ``content`` like write_file (the previous content kept first)."""
    current = safefs.read(root, rel, max_bytes=textedit.MAX_EDIT_BYTES + 1)
    return textedit.edit_bytes(current, old, new, count, rel)


MAX_FIND_RESULTS = 500
MAX_SEARCH_MATCHES = 200
MAX_SEARCH_LINE = 300
MAX_SEARCH_FILE_BYTES = 2_000_000
MAX_BRACE_EXPANSIONS = 64


def _expand_braces(pattern: str) -> list[str]:
    """``a.{md,txt}`` -> ``a.md``, ``a.txt`` (not nested; at most MAX_BRACE_EXPANSIONS)."""
    m = re.search(r"\{([^{}]*,[^{}]*)\}", pattern)
    if m is None:
        return [pattern]
    out: list[str] = []
    for alt in m[1].split(","):
        out.extend(_expand_braces(pattern[:m.start()] + alt + pattern[m.end():]))
        if len(out) > MAX_BRACE_EXPANSIONS:
            raise ValueError(f"the pattern expands to more than {MAX_BRACE_EXPANSIONS} patterns")
    return out


def _glob_regex(glob: str) -> str:
    out: list[str] = []
    i, n = 0, len(glob)
    while i < n:
        c = glob[i]
        if glob.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
        elif glob.startswith("**", i):
            out.append(".*")
            i += 2
        elif c == "*":
            out.append("[^/]*")
            i += 1
        elif c == "?":
            out.append("[^/]")
            i += 1
        elif c == "[" and "]" in glob[i + 2:]:
            j = glob.index("]", i + 2)
            body = glob[i + 1:j]
            neg = body[:1] in ("!", "^")
            body = body[1:] if neg else body
            out.append("[" + ("^" if neg else "") + body.replace("\\", "\\\\") + "]")
            i = j + 1
        else:
            out.append(re.escape(c))
            i += 1
    return "".join(out)


def glob_matcher(pattern: str) -> tuple[re.Pattern[str], bool]:
    """A regular expression for a find_files pattern, and whether it matches the whole path (a
    pattern with ``/``) rather than the file name at any depth."""
    pat = _normal(pattern)
    if not pat:
        raise ValueError("the pattern is empty")
    if pat.startswith("/") or ".." in pat.split("/"):
        raise ValueError("the pattern must be relative to the workspace, without '..'")
    pats = _expand_braces(pat)
    whole = any("/" in p for p in pats)
    if whole:  # a name-only alternative next to a path one matches at any depth
        pats = [p if "/" in p else "**/" + p for p in pats]
    return re.compile("(?:" + "|".join(_glob_regex(p) for p in pats) + r")\Z"), whole


def _normal(pattern: str) -> str:
    pat = pattern.strip()
    while pat.startswith("./"):
        pat = pat[2:]
    return pat


def _literal_prefix(pattern: str) -> str:
    """The folders a path pattern names literally before its first wildcard: where to start."""
    folders = _normal(pattern).split("/")[:-1]
    out: list[str] = []
    for part in folders:
        if any(ch in part for ch in "*?[{"):
            break
        out.append(part)
    return "/".join(out)


def _start_folder(root: Path, start: str, store_dir: str) -> bool:
    """Whether the folder ``start`` may be walked with the rules above it applied (False: it is
    ignored itself, and was named on purpose, so those rules do not apply)."""
    if start and walk.never(start, store_dir):
        raise ValueError(f"{start} is never searched (.git, the versions store, the credential denylist)")
    return not walk.ignored(root, start, True)


def find_files(root: Path, pattern: str, limit: int, store_dir: str = ".coxswain",
               max_results: int = MAX_FIND_RESULTS) -> str:
    """The workspace's files that match ``pattern`` (see the tool's description), one per line."""
    rx, whole = glob_matcher(pattern)
    start = _literal_prefix(pattern) if whole else ""
    try:
        use_ignore = _start_folder(root, start, store_dir)
        found = walk.walk(root, start, store_dir, use_ignore=use_ignore)
    except Invalid:
        if not start:
            raise
        return f"(no files match {pattern!r}: there is no folder {start!r})"
    hits = [f for f in found.files if rx.match(f if whole else f.rsplit("/", 1)[-1])]
    notes: list[str] = []
    if len(hits) > max_results:
        notes.append(f"[... {len(hits) - max_results} more files match; narrow the pattern]")
    if found.truncated:
        notes.append(f"[the search stopped after {found.seen} entries; some files were not looked at]")
    if not hits:
        return "\n".join([f"(no files match {pattern!r})", *notes])
    return clip("\n".join([*hits[:max_results], *notes]), limit)


def _window(line: str, at: int, width: int) -> str:
    if len(line) <= width:
        return line
    begin = max(0, min(at - width // 3, len(line) - width))
    return ("..." if begin else "") + line[begin:begin + width] + ("..." if begin + width < len(line) else "")


def search_text(root: Path, pattern: str, rel: str, limit: int, store_dir: str = ".coxswain",
                max_matches: int = MAX_SEARCH_MATCHES, max_line: int = MAX_SEARCH_LINE) -> str:
    """``path:line: text`` for every line of the files beneath ``rel`` (a folder, ``""`` for the
    workspace, or one file) that the regular expression ``pattern`` matches.

    Bounded: at most ``max_matches`` lines, each cut to ``max_line`` characters around the match,
    files over MAX_SEARCH_FILE_BYTES and binary ones (a NUL in their first 8 KiB) skipped, at most
    ``limit`` characters in all. A file named on purpose is searched even if ignored.
    """
    try:
        rx = re.compile(pattern)
    except re.error as exc:
        raise ValueError(f"invalid regular expression {pattern!r}: {exc}") from None
    rel = rel.strip("/")
    if rel in (".", ""):
        rel = ""
    if rel and walk.never(rel, store_dir):
        raise ValueError(f"{rel} is never searched (.git, the versions store, the credential denylist)")
    fd = walk.open_file(root, rel) if rel else None
    if fd is not None:
        os.close(fd)
        files, truncated = [rel], False
    else:
        found = walk.walk(root, rel, store_dir, use_ignore=_start_folder(root, rel, store_dir))
        files, truncated = found.files, found.truncated
    out: list[str] = []
    big = 0
    full = False
    for path in files:
        fd = walk.open_file(root, path)
        if fd is None:
            continue
        with os.fdopen(fd, "rb") as fh:
            data = fh.read(MAX_SEARCH_FILE_BYTES + 1)
        if len(data) > MAX_SEARCH_FILE_BYTES:
            big += 1
            continue
        if b"\0" in data[:8192]:
            continue
        for n, line in enumerate(data.decode("utf-8", errors="replace").split("\n"), 1):
            m = rx.search(line)
            if m is None:
                continue
            if len(out) >= max_matches:
                full = True
                break
            out.append(f"{path}:{n}: {_window(line.rstrip(chr(13)), m.start(), max_line)}")
        if full:
            break
    notes: list[str] = []
    if full:
        notes.append(f"[stopped at {max_matches} matching lines; narrow the pattern or the path]")
    if big:
        notes.append(f"[{big} file(s) over {MAX_SEARCH_FILE_BYTES} bytes were not searched]")
    if truncated:
        notes.append("[the search stopped early: the folder holds too many files; give a narrower path]")
    if not out:
        return "\n".join([f"(no matches for {pattern!r} in {rel or '.'})", *notes])
    return clip("\n".join([*out, *notes]), limit)


def list_dir(root: Path, rel: str) -> str:
    entries = safefs.listdir(root, rel)
    lines = [f"{e.name}/" if e.kind == "dir" else f"{e.name} -> (link)" if e.kind == "link"
             else f"{e.name}  ({e.size} bytes)" for e in entries]
    return "\n".join(lines) if lines else "(empty folder)"


SAFE_ENV_KEYS = ("LANG", "LC_ALL", "TZ")
SANDBOX_PATH = "/usr/local/bin:/usr/bin:/bin:/usr/local/sbin:/usr/sbin:/sbin"
"""A command's ``PATH``: the system folders only, never the runner's (which may name folders of
the operator's, like a venv or ``~/.cargo/bin``, that the sandbox does not even show)."""


def command_env(workspace: Path) -> dict[str, str]:
    """A scrubbed environment: no keys or tokens of the runner leak into the model's commands, and
    ``PATH`` is the system one."""
    env = {k: os.environ[k] for k in SAFE_ENV_KEYS if k in os.environ}
    env.update(PATH=SANDBOX_PATH, HOME=str(workspace), TERM="dumb", PWD=str(workspace), GIT_TERMINAL_PROMPT="0")
    return env


@dataclass
class CommandResult:
    exit_code: int | None
    output: str
    timed_out: bool = False
    cancelled: bool = False
    limit: str | None = None
    """The ``[sandbox]`` limit the command passed (it was killed), e.g. ``max_processes``."""


async def run_command(workspace: Path, command: str, timeout_s: float, limit: int, sandbox: Sandbox,
                      network: bool = False, *, requests: list[Request] | None = None,
                      netns: int | None = None) -> CommandResult:
    """Run ``command`` with bash in the sandbox, in its own process group and its own cgroups
    (:mod:`cox_runner.workspace.limits`); a limit reached, a time-out or a cancel kills the whole tree.
    Raises :class:`~cox_runner.errors.SandboxUnavailable` (nothing runs) when the sandbox
    cannot start. Granted the network, it gets a proxy socket of its own for its run; every
    connection it asked for is appended to ``requests`` (to record as ``network.request``).
    ``netns``: the session's own network namespace (its programs run there), for a command
    without the network."""
    await sandbox.prepare(workspace)
    limiter = limits.of(sandbox)
    box = await asyncio.to_thread(limiter.box, "cmd")
    try:
        if not sandbox.networked(network):
            joined = netns if sandbox.confined else None
            argv = box.argv(sandbox.argv(workspace, command, network, netns=joined))
            return await _run_boxed(workspace, argv, timeout_s, limit, sandbox, box,
                                    pass_fds=(joined,) if joined is not None else ())
        async with sandbox.egress.grant(requests if requests is not None else []) as grant:
            argv = box.argv(sandbox.argv(workspace, command, network, egress=grant.socket))
            return await _run_boxed(workspace, argv, timeout_s, limit, sandbox, box)
    finally:
        await box.close()  # the whole tree is dead before the walk below
        # Nothing it made stays setuid/setgid on the host (and, as root, all of it is the
        # sandbox user's): also after a time-out, a limit or a Stop.
        await sandbox.settle(workspace)


class Child:
    """A command started by the standard library's spawn and watched from the event loop (its
    output a stream, its exit a pidfd): the parts of :class:`asyncio.subprocess.Process` a command
    needs. uvloop's own spawn forks the whole runner where Python's uses vfork: 10-30 ms more per
    command (a ``true``: 6 ms against 16-26 ms, more the larger the runner's heap)."""

    def __init__(self, popen: subprocess.Popen[bytes], stdout: asyncio.StreamReader,
                 transports: list[asyncio.BaseTransport], exited: asyncio.Future[int],
                 stdin: asyncio.StreamWriter | None = None, stderr: asyncio.StreamReader | None = None) -> None:
        self.popen = popen
        self.pid = popen.pid
        self.stdout = stdout
        self.stdin = stdin
        self.stderr = stderr
        self._transports = transports
        self._exited = exited

    @property
    def returncode(self) -> int | None:
        return self.popen.returncode

    async def wait(self) -> int:
        return await asyncio.shield(self._exited)

    def close(self) -> None:
        """The pipes' ends here (their readers have seen their end, or gave up)."""
        for t in self._transports:
            t.close()


def _pipe_file(loop: asyncio.AbstractEventLoop, fd: int, mode: str) -> Any:
    """A file object of a pipe's end for the loop's pipe transport, which closes the descriptor
    once. uvloop closes it twice: libuv closes it, then uvloop closes the file object it was
    given, by then perhaps a descriptor another thread has just opened under the same number (a
    file a tool reads, a cgroup file, another command's pipe or pidfd: a command then ran until
    its time-out, its exit never seen). So uvloop gets a file object that does not own the
    descriptor; asyncio's own loop closes only the file object, which must own it."""
    return os.fdopen(fd, mode, buffering=0, closefd=not isinstance(loop, uvloop.Loop))


async def spawn(argv: list[str], *, cwd: str, env: dict[str, str], pass_fds: tuple[int, ...] = (),
                preexec_fn: Any = None, stdin: bool = False, stderr_apart: bool = False) -> Child:
    """``argv`` in a session of its own, stdout and stderr one pipe (or two: ``stderr_apart``),
    stdin from /dev/null (or a pipe: ``stdin``, :attr:`Child.stdin`)."""
    loop = asyncio.get_running_loop()
    mine: list[int] = []  # this end of each pipe
    theirs: list[int] = []  # the child's end, closed here once it is started
    try:
        r, w = os.pipe()
        mine.append(r)
        theirs.append(w)
        er = ew = ir = iw = -1
        if stderr_apart:
            er, ew = os.pipe()
            mine.append(er)
            theirs.append(ew)
        if stdin:
            ir, iw = os.pipe()
            mine.append(iw)
            theirs.append(ir)
        # A vfork and an exec, about a ms: as asyncio's own spawn does, on the loop.
        popen = subprocess.Popen(argv, cwd=cwd, env=env, stdin=ir if stdin else subprocess.DEVNULL,  # noqa: ASYNC220
                                 stdout=w, stderr=ew if stderr_apart else subprocess.STDOUT,
                                 start_new_session=True, pass_fds=pass_fds, preexec_fn=preexec_fn)
    except BaseException:
        for fd in mine:
            os.close(fd)
        raise
    finally:
        for fd in theirs:
            os.close(fd)
    transports: list[asyncio.BaseTransport] = []

    async def reading(fd: int) -> asyncio.StreamReader:
        reader = asyncio.StreamReader(limit=2 ** 16, loop=loop)
        transport, _ = await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader, loop=loop),
                                                    _pipe_file(loop, fd, "rb"))
        transports.append(transport)
        return reader

    out = await reading(r)
    err = await reading(er) if stderr_apart else None
    writer = None
    if stdin:
        wt, wp = await loop.connect_write_pipe(
            lambda: asyncio.StreamReaderProtocol(asyncio.StreamReader(loop=loop), loop=loop),
            _pipe_file(loop, iw, "wb"))
        transports.append(wt)
        writer = asyncio.StreamWriter(wt, wp, None, loop)
    exited: asyncio.Future[int] = loop.create_future()

    def reaped(code: int) -> None:
        if not exited.done():
            exited.set_result(code)

    try:
        pidfd = os.pidfd_open(popen.pid)
    except OSError:  # pragma: no cover - a kernel before 5.3: a thread waits for it
        def waiter() -> None:
            loop.call_soon_threadsafe(reaped, popen.wait())

        threading.Thread(target=waiter, name=f"wait-{popen.pid}", daemon=True).start()
    else:
        def on_exit() -> None:
            loop.remove_reader(pidfd)
            os.close(pidfd)
            reaped(popen.wait())  # it has exited: no wait here

        loop.add_reader(pidfd, on_exit)
    return Child(popen, out, transports, exited, stdin=writer, stderr=err)


async def _run_boxed(workspace: Path, argv: list[str], timeout_s: float, limit: int, sandbox: Sandbox,
                     box: limits.Box, pass_fds: tuple[int, ...] = ()) -> CommandResult:
    proc = await spawn(
        argv, cwd=str(workspace), pass_fds=pass_fds, env=command_env(workspace),
        # setpriv (or else this hook) gives the command PR_SET_PDEATHSIG, and bwrap's
        # --die-with-parent takes its sandbox down with it; without a preexec hook Python can
        # spawn with vfork, which is several ms cheaper from a large process.
        preexec_fn=dies_with_me() if sandbox.needs_preexec else None,
    )
    try:
        return await _watch(proc, timeout_s, limit, box)
    finally:
        proc.close()


async def _watch(proc: Child, timeout_s: float, limit: int, box: limits.Box) -> CommandResult:
    chunks: list[bytes] = []
    size = 0

    async def pump() -> None:
        nonlocal size
        assert proc.stdout is not None
        while True:
            block = await proc.stdout.read(65536)
            if not block:
                return
            if size < limit * 4:
                chunks.append(block)
            size += len(block)

    reader = asyncio.create_task(pump())
    work: asyncio.Future[Any] = asyncio.ensure_future(asyncio.gather(reader, proc.wait()))
    watcher: asyncio.Future[Any] = asyncio.create_task(box.watch())
    timed_out = False
    try:
        done, _ = await asyncio.wait({work, watcher}, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
        if not done:
            timed_out = True
        if work not in done:
            await asyncio.to_thread(box.kill)
            await stop_group(proc)
    except asyncio.CancelledError:
        await asyncio.shield(asyncio.to_thread(box.kill))
        await stop_group(proc)
        reader.cancel()
        work.cancel()  # retrieved below: never "exception was never retrieved" at a runner's stop
        with contextlib.suppress(BaseException):
            await reader
        with contextlib.suppress(BaseException):
            await work
        raise
    finally:
        watcher.cancel()
    with contextlib.suppress(BaseException):
        await asyncio.wait_for(reader, 2)
    kept = b"".join(chunks)
    text = clip_output(kept, size, limit)
    code = proc.returncode
    hit = box.limit or box.exceeded() or (None if timed_out else box.note_exit(code, kept[-65536:]))
    if hit is not None:
        text += "\n" + limits.killed_note(hit, box.cfg)
    elif timed_out:
        text += f"\n[timed out after {timeout_s:g}s; the command was killed]"
    return CommandResult(exit_code=code, output=text, timed_out=timed_out, limit=hit)


class Running(Protocol):
    """What :func:`stop_group` needs of a started process: a :class:`Child`, or an
    :class:`asyncio.subprocess.Process` (a program)."""

    @property
    def pid(self) -> int: ...

    @property
    def returncode(self) -> int | None: ...

    async def wait(self) -> int: ...


async def stop_group(proc: Running) -> None:
    """SIGTERM to the process's group (its own session), SIGKILL after 2 s; waits for its end."""
    if proc.returncode is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        await asyncio.wait_for(proc.wait(), 2)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        with contextlib.suppress(BaseException):
            await asyncio.wait_for(proc.wait(), 2)
