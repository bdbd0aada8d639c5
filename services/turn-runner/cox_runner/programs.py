"""Programs: long-running processes of a session in the command sandbox (docs/design.md, "Programs").

``start_program`` (or a person's ``!&command``) starts one like a command (the same bwrap, the same
limits box, the same scrubbed environment), but the turn does not wait for it: it lives with the
session on the runner that started it, until it exits or is stopped (``stop_program``, a person,
Stop with ``{programs: true}``, ``[sandbox] program_idle_s``, idle archiving, or its runner).

- A session's programs and (as root) its commands share one network namespace of their own
  (:class:`~cox_runner.workspace.sandbox.NetNs`: its own loopback, none of the host's), so a
  command reaches the session's dev server on ``127.0.0.1``. A program or command granted the
  network keeps a namespace of its own: its egress forwarder must serve it alone.
- What a program writes is kept bounded (the last :data:`KEEP_FACTOR` times ``[runner]
  output_limit`` bytes); ``read_program`` answers at most ``output_limit`` bytes from where the
  model read last, and what fell out of the window is counted, never shown.
- What it changes in the workspace is versioned like a command's: a snapshot when it starts and
  after each read; the changes since are kept at each read and at its end.
- While a session has programs here, this runner holds the session's *program lock*
  (``<session>:plock``, renewed like a lease): a send to the idle session starts its turn here
  (``cox_send`` takes the lease in this runner's name and the admitting runner rings this one).
  A turn that starts elsewhere (the lock lapsed: this runner died or stalled) finds the programs
  the session lists gone, records them ``program.stopped`` by ``runner`` and tells the model.
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import json
import os
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from coxswain import events as ev
from coxswain import keys
from coxswain.errors import Conflict, CoxError, logged
from coxswain.ids import new_id
from coxswain.models import PROGRAM_TAIL_CHARS
from coxswain.proc import dies_with_me

from . import cmdversions
from .deps import Deps
from .errors import SandboxUnavailable
from .workspace import egress, limits, tools
from .workspace.egress import Request
from .workspace.sandbox import NetNs

KEEP_FACTOR = 4
"""A program's output kept: this many times ``[runner] output_limit`` bytes (the newest)."""
MAX_WAIT_S = 60.0
MAX_INPUT_BYTES = 65536
PLOCK = keys.PROGRAM_LOCK
TICK_S = 1.0
WRITE_TIMEOUT_S = 10.0


@dataclass
class Program:
    program_id: str
    sid: str
    name: str
    command: str
    workspace: Path
    network: bool
    pty: bool
    by: str
    started_ms: int
    box: limits.Box
    keep: int
    proc: asyncio.subprocess.Process | None = None
    master: int | None = None
    buf: bytearray = field(default_factory=bytearray)
    total: int = 0
    cursor: int = 0
    touched: float = field(default_factory=time.monotonic)
    code: int | None = None
    stopped_by: str | None = None
    snap: str | None = None
    requests: list[Request] = field(default_factory=list)
    exits: contextlib.AsyncExitStack = field(default_factory=contextlib.AsyncExitStack)
    output: asyncio.Event = field(default_factory=asyncio.Event)
    done: asyncio.Event = field(default_factory=asyncio.Event)
    ended: asyncio.Event = field(default_factory=asyncio.Event)
    """Its end is recorded (events, versions)."""
    published: int = -1
    """``total`` when the tail was last written to the session hash."""
    tasks: list[asyncio.Task[Any]] = field(default_factory=list)

    def add(self, block: bytes) -> None:
        self.total += len(block)
        self.buf += block
        if len(self.buf) > self.keep:
            del self.buf[:len(self.buf) - self.keep]
        self.output.set()

    @property
    def first(self) -> int:
        """The offset of the oldest byte still kept."""
        return self.total - len(self.buf)

    def tail(self, chars: int = PROGRAM_TAIL_CHARS) -> str:
        return self.buf[-chars * 2:].decode("utf-8", errors="replace")[-chars:]

    def info(self) -> dict[str, Any]:
        return {"program_id": self.program_id, "name": self.name, "command": self.command, "network": self.network,
                "pty": self.pty, "started": self.started_ms, "by": self.by, "tail": self.tail()}

    @property
    def running(self) -> bool:
        return not self.done.is_set()


@dataclass
class Read:
    text: str
    exited: bool
    code: int | None


class Programs:
    """This runner's programs, by session, and each session's network namespace."""

    def __init__(self, deps: Deps) -> None:
        self.deps = deps
        self.log = deps.log
        self._by_sid: dict[str, dict[str, Program]] = {}
        self._netns: dict[str, NetNs] = {}
        self._netns_lock: dict[str, asyncio.Lock] = {}
        self._boxes: dict[str, limits.Box] = {}
        self.books = ProgramBooks(deps, self)

    # ---------------------------------------------------------------- queries
    def of(self, sid: str) -> dict[str, Program]:
        return self._by_sid.get(sid, {})

    def running(self, sid: str) -> list[Program]:
        return [p for p in self.of(sid).values() if p.running]

    def find(self, sid: str, ref: str) -> Program | None:
        """The program ``ref`` names: its id, or its name (the newest program of that name)."""
        progs = self.of(sid)
        if ref in progs:
            return progs[ref]
        named = [p for p in progs.values() if p.name == ref]
        return named[-1] if named else None

    @contextlib.contextmanager
    def joined(self, sid: str) -> Iterator[int | None]:
        """A descriptor of the session's network namespace while it has one here (a copy the
        caller's command is started with, closed after: the namespace may close meanwhile)."""
        ns = self._netns.get(sid)
        fd = os.dup(ns.fd) if ns is not None and ns.alive else None
        try:
            yield fd
        finally:
            if fd is not None:
                os.close(fd)

    def sessions(self) -> list[str]:
        return list(self._by_sid)

    # ---------------------------------------------------------------- start
    def refusal(self, sid: str) -> str | None:
        """Why one more program may not start in ``sid`` now, or None."""
        cfg = self.deps.settings.sandbox
        n = len(self.running(sid))
        if cfg.max_programs == 0:
            return "programs are off here ([sandbox] max_programs = 0)"
        if n >= cfg.max_programs:
            return (f"this session already runs {n} programs, the most it may ([sandbox] max_programs = "
                    f"{cfg.max_programs}); stop one with stop_program first")
        return None

    async def _session_netns(self, sid: str, workspace: Path) -> int | None:
        sb = self.deps.sandbox
        if not sb.shares_net:
            return None
        lock = self._netns_lock.setdefault(sid, asyncio.Lock())
        async with lock:
            ns = self._netns.get(sid)
            if ns is not None and ns.alive:
                return ns.fd
            if ns is not None:
                await ns.close()
            box = await asyncio.to_thread(limits.of(sb).box, "net")
            try:
                ns = await sb.open_netns(workspace, box.argv)
            except BaseException:
                await box.close()
                raise
            self._netns[sid] = ns
            self._boxes[sid] = box
            return ns.fd

    async def start(self, sid: str, workspace: Path, command: str, *, name: str | None, network: bool, pty: bool,
                    by: str, snap: str | None) -> Program:
        """Start ``command``; raises :class:`SandboxUnavailable` when it cannot be confined."""
        deps = self.deps
        sb = deps.sandbox
        await sb.prepare(workspace)
        networked = sb.networked(network)
        shared = None if networked else await self._session_netns(sid, workspace)
        netns = os.dup(shared) if shared is not None else None  # ours until the spawn, whatever ends meanwhile
        try:
            return await self._start(sid, workspace, command, name=name, network=network, pty=pty, by=by,
                                     snap=snap, networked=networked, netns=netns)
        finally:
            if netns is not None:
                os.close(netns)

    async def _start(self, sid: str, workspace: Path, command: str, *, name: str | None, network: bool, pty: bool,
                     by: str, snap: str | None, networked: bool, netns: int | None) -> Program:
        deps = self.deps
        sb = deps.sandbox
        box = await asyncio.to_thread(limits.of(sb).box, "prog")
        pid = new_id("p")
        p = Program(program_id=pid, sid=sid, name=(name or (command.split() or ["program"])[0])[:80],
                    command=command, workspace=workspace, network=network, pty=pty, by=by,
                    started_ms=int(time.time() * 1000), box=box,
                    keep=KEEP_FACTOR * deps.settings.runner.output_limit, snap=snap)
        try:
            sock = None
            if networked:
                grant = await p.exits.enter_async_context(sb.egress.grant(p.requests))
                sock = grant.socket
            joined = netns if sb.confined else None
            argv = box.argv(sb.argv(workspace, command, network, egress=sock, netns=joined))
            await self._spawn(p, argv, joined)
        except BaseException:
            await p.exits.aclose()
            await box.close()
            await self._maybe_close_netns(sid)
            raise
        self._by_sid.setdefault(sid, {})[pid] = p
        p.tasks.append(asyncio.create_task(self._watch(p)))
        await self.books.hold(sid)
        return p

    async def _spawn(self, p: Program, argv: list[str], netns: int | None) -> None:
        env = tools.command_env(p.workspace)
        pass_fds = (netns,) if netns is not None else ()
        preexec = dies_with_me() if self.deps.sandbox.needs_preexec else None
        if p.pty:
            master, slave = os.openpty()
            try:
                p.proc = await asyncio.create_subprocess_exec(
                    *argv, cwd=str(p.workspace), stdin=slave, stdout=slave, stderr=slave, start_new_session=True,
                    env=env, pass_fds=pass_fds, preexec_fn=preexec)
            except BaseException:
                os.close(master)
                raise
            finally:
                os.close(slave)
            p.master = master
            os.set_blocking(master, False)
        else:
            p.proc = await asyncio.create_subprocess_exec(
                *argv, cwd=str(p.workspace), stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT, start_new_session=True, env=env, pass_fds=pass_fds,
                preexec_fn=preexec)

    async def _pump(self, p: Program) -> None:
        if p.master is not None:
            loop = asyncio.get_running_loop()
            fd = p.master
            got = asyncio.Event()
            loop.add_reader(fd, got.set)
            try:
                while True:
                    await got.wait()
                    got.clear()
                    try:
                        block = os.read(fd, 65536)
                    except BlockingIOError:
                        continue
                    except OSError:  # EIO: every end of the terminal closed
                        return
                    if not block:
                        return
                    p.add(block)
            finally:
                loop.remove_reader(fd)
        assert p.proc is not None and p.proc.stdout is not None
        while True:
            block = await p.proc.stdout.read(65536)
            if not block:
                return
            p.add(block)

    async def _watch(self, p: Program) -> None:
        """Wait for the program's end (its tree killed after it), then record it."""
        assert p.proc is not None
        pump = asyncio.create_task(self._pump(p))
        watcher = asyncio.create_task(p.box.watch())
        waiting = asyncio.ensure_future(p.proc.wait())
        try:
            await asyncio.wait({waiting, watcher}, return_when=asyncio.FIRST_COMPLETED)
            if not waiting.done():  # a sandbox limit killed the box
                await asyncio.to_thread(p.box.kill)
                await tools.stop_group(p.proc)
            await waiting
            await asyncio.to_thread(p.box.kill)  # what it left behind in its box
            with contextlib.suppress(BaseException):
                await asyncio.wait_for(pump, 2)
        finally:
            watcher.cancel()
            pump.cancel()
            p.code = p.proc.returncode
            p.done.set()
            p.output.set()
            if p.master is not None:
                with contextlib.suppress(OSError):
                    os.close(p.master)
                p.master = None
            await p.exits.aclose()
            await p.box.close()
            await self.deps.sandbox.settle(p.workspace)
        try:
            await self.books.record_end(p)
        except Exception as exc:  # noqa: BLE001 - Redis or versions gone: the log says so
            self.log.warning("program.end_unrecorded", sid=p.sid, program_id=p.program_id, error=logged(exc))
        finally:
            p.ended.set()
            self.of(p.sid).pop(p.program_id, None)
            if not self.of(p.sid):
                self._by_sid.pop(p.sid, None)
            await self._maybe_close_netns(p.sid)
            await self.books.release(p.sid)

    async def _maybe_close_netns(self, sid: str) -> None:
        if self.running(sid):
            return
        ns = self._netns.pop(sid, None)
        box = self._boxes.pop(sid, None)
        if ns is not None:
            await ns.close()
        if box is not None:
            await box.close()
        self._netns_lock.pop(sid, None)

    def listing(self, sid: str) -> tuple[str, str, str, str]:
        """The state write that records the session's running programs (the session object's ``programs``)."""
        progs = [q.info() for q in self.running(sid)]
        for q in self.running(sid):
            q.published = q.total
        return ("hset", "", "programs", json.dumps(progs, ensure_ascii=False) if progs else "")

    async def read(self, p: Program, *, since: int | None, wait_s: float) -> Read:
        p.touched = time.monotonic()
        start = p.cursor if since is None else since
        if wait_s > 0 and p.total <= start and p.running:
            p.output.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(p.output.wait(), min(wait_s, MAX_WAIT_S))
        limit = self.deps.settings.runner.output_limit
        total, first = p.total, p.first
        begin = min(max(start, first), total)
        dropped = max(0, first - start) if start < total else 0
        part = bytes(p.buf[begin - first:begin - first + limit])
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        text = decoder.decode(part, final=begin + len(part) >= total)
        shown = len(part) - len(decoder.getstate()[0])
        end = begin + shown
        p.cursor = end if since is None else max(p.cursor, end)
        state = "running" if p.running else f"exited with code {p.code}" if p.stopped_by is None else \
            f"stopped ({p.stopped_by})"
        head = f"[program {p.program_id} ({p.name}): {state}; output bytes {begin}-{end} of {total}]"
        notes: list[str] = []
        if dropped:
            notes.append(f"[{dropped} earlier bytes were not kept: the program wrote more than is kept]")
        if end < total:
            notes.append(f"[{total - end} more bytes: read again (since={end})]")
        body = text if text else "(no new output)"
        return Read("\n".join([head, *notes[:1], body, *notes[1:]]), not p.running, p.code)

    async def write(self, p: Program, text: str) -> str:
        p.touched = time.monotonic()
        if not p.running:
            return f"Error: program {p.program_id} is not running (exit code {p.code})."
        data = text.encode("utf-8", errors="surrogatepass")
        if len(data) > MAX_INPUT_BYTES:
            return f"Error: input to a program may hold {MAX_INPUT_BYTES} bytes; this has {len(data)}."
        try:
            if p.master is not None:
                await asyncio.wait_for(_write_fd(p.master, data), WRITE_TIMEOUT_S)
            else:
                assert p.proc is not None and p.proc.stdin is not None
                p.proc.stdin.write(data)
                await asyncio.wait_for(p.proc.stdin.drain(), WRITE_TIMEOUT_S)
        except TimeoutError:
            return f"Error: program {p.program_id} did not take its input within {WRITE_TIMEOUT_S:g}s."
        except (OSError, ConnectionError, RuntimeError) as exc:
            return f"Error: the input could not be written ({exc})."
        return f"Wrote {len(data)} bytes to program {p.program_id}."

    async def stop(self, p: Program, by: str, wait: bool = True) -> None:
        """Kill the program's whole tree; its end is recorded as ``program.stopped`` by ``by``."""
        if p.running and p.stopped_by is None:
            p.stopped_by = by
            await asyncio.shield(asyncio.to_thread(p.box.kill))
            if p.proc is not None:
                await tools.stop_group(p.proc)
        if wait:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(p.ended.wait()), 15)

    async def stop_session(self, sid: str, by: str) -> int:
        progs = self.running(sid)
        await asyncio.gather(*(self.stop(p, by) for p in progs))
        return len(progs)

    async def stop_all(self, by: str = "runner") -> None:
        await asyncio.gather(*(self.stop_session(sid, by) for sid in self.sessions()))

class ProgramBooks:
    """What is recorded about this runner's programs, and the program lock: a program's end
    (events, versions), the lock held and renewed, the periodic pass (idle programs, the listed
    tails, idle archiving), and the programs another runner listed that are gone."""

    def __init__(self, deps: Deps, programs: Programs) -> None:
        self.deps = deps
        self.log = deps.log
        self.programs = programs

    async def record_end(self, p: Program) -> None:
        evs: list[ev._Event] = [*egress.network_events({"sid": p.sid, "turn_id": None}, p.requests, None)]
        async with self.version_token(p.sid) as token:
            if token is not None and p.snap is not None:
                kept = await cmdversions.changes(self.deps.clients, self.log, p.sid, str(p.workspace), token, p.snap,
                                                 None, f"{p.program_id}-end")
                evs += kept.events
            end: ev._Event = ev.ProgramExited(sid=p.sid, program_id=p.program_id, code=p.code) \
                if p.stopped_by is None else \
                ev.ProgramStopped(sid=p.sid, program_id=p.program_id, by=p.stopped_by, code=p.code)
            evs.append(end)
            self.programs.of(p.sid).pop(p.program_id, None)
            await self.deps.store.fns.emit(sid=p.sid, token="", owner=self.deps.owner, ops=[self.programs.listing(p.sid)],
                                           events=[ev.body(e) for e in evs])
        self.log.info("program.end", sid=p.sid, program_id=p.program_id, code=p.code, by=p.stopped_by)

    async def versions_after_read(self, p: Program, token: int, turn_id: str | None,
                                  call_id: str) -> list[ev._Event]:
        """What the program changed since its last snapshot, kept; a new snapshot taken."""
        if p.snap is None:
            return []
        kept = await cmdversions.changes(self.deps.clients, self.log, p.sid, str(p.workspace), token, p.snap,
                                         turn_id, call_id)
        p.snap = await cmdversions.snapshot(self.deps.clients, self.log, p.sid, str(p.workspace), token)
        return kept.events

    # ---------------------------------------------------------------- read, write, stop
    @contextlib.asynccontextmanager
    async def version_token(self, sid: str) -> AsyncIterator[int | None]:
        """A fencing token to version a program's end under: the lease this runner holds for the
        session (a turn, an operation), else the idle session's own lease taken like a person's
        write (released after); None when another runner holds it (the end goes unversioned)."""
        deps = self.deps
        d = deps.leases.get(sid)
        if d is not None:
            yield int(d.token)
            return
        from . import drive  # the drive imports the turn loop, which imports this module
        from .leases import Drive

        try:
            res = await deps.store.fns.op_begin(sid=sid, principal="", runner=deps.owner,
                                                lease_ms=deps.settings.runner.lease_ms, op="program")
        except (Conflict, CoxError) as exc:
            self.log.warning("program.unversioned", sid=sid, reason=getattr(exc, "detail", str(exc)))
            yield None
            return
        op = Drive(sid=sid, token=str(res["token"]))
        deps.leases.hold(op)
        try:
            yield int(op.token)
        finally:
            deps.leases.release(op)
            op.disarm()
            with contextlib.suppress(Exception):
                await drive.finish_op(deps, op)

    # ---------------------------------------------------------------- the program lock, the periodic pass
    async def hold(self, sid: str) -> None:
        base = keys.session(sid)
        await self.deps.redis.set(base + PLOCK, self.deps.owner, px=self.deps.settings.runner.lease_ms)

    async def release(self, sid: str) -> None:
        if self.programs.running(sid):
            return
        base = keys.session(sid)
        with contextlib.suppress(Exception):
            if await self.deps.redis.get(base + PLOCK) == self.deps.owner:
                await self.deps.redis.delete(base + PLOCK)

    async def tick(self) -> None:
        """Every second: renew the program locks, stop idle programs, refresh the listed tails,
        stop what a person's Stop asked for."""
        deps = self.deps
        idle = deps.settings.sandbox.program_idle_s
        now = time.monotonic()
        for sid in self.programs.sessions():
            progs = self.programs.running(sid)
            if not progs:
                continue
            base = keys.session(sid)
            async with deps.redis.pipeline(transaction=False) as pipe:
                pipe.set(base + PLOCK, deps.owner, px=deps.settings.runner.lease_ms)
                pipe.exists(base)
                _, exists = await pipe.execute()
            if not exists:  # the session is gone (archived, or its hash deleted): its programs too
                await self.programs.stop_session(sid, "archive")
                continue
            for p in progs:
                if idle and now - p.touched > idle and p.stopped_by is None:
                    self.log.info("program.idle", sid=sid, program_id=p.program_id)
                    p.tasks.append(asyncio.create_task(self.programs.stop(p, "idle")))
            if any(p.published != p.total for p in self.programs.running(sid)):
                with contextlib.suppress(CoxError):
                    await deps.store.fns.emit(sid=sid, token="", owner=deps.owner, ops=[self.programs.listing(sid)],
                                              events=[])
        await self._archive_idle()

    async def _archive_idle(self) -> None:
        """Idle archiving stops a session's programs: once the session has been idle for
        ``[sessions] idle_days`` (the archiver then takes it, with no program left)."""
        days = self.deps.settings.sessions.idle_days
        if days <= 0:
            return
        cutoff = time.time() * 1000 - days * 86_400_000
        for sid in self.programs.sessions():
            score = await self.deps.redis.zscore(keys.active(keys.bucket(sid)), sid)
            if score is not None and float(score) < cutoff:
                await self.programs.stop_session(sid, "archive")

    # ---------------------------------------------------------------- another runner's programs
    async def gone(self, sid: str, listed: str | None) -> list[dict[str, Any]]:
        """The programs the session lists that do not run here (their runner died, or this is
        another runner): they are gone."""
        if not listed:
            return []
        try:
            items = json.loads(listed)
        except ValueError:
            return []
        mine = self.programs.of(sid)
        return [i for i in items if isinstance(i, dict) and i.get("program_id") not in mine]



async def _write_fd(fd: int, data: bytes) -> None:
    loop = asyncio.get_running_loop()
    view = memoryview(data)
    while view:
        try:
            n = os.write(fd, view)
        except BlockingIOError:
            ready = asyncio.Event()
            loop.add_writer(fd, ready.set)
            try:
                await ready.wait()
            finally:
                loop.remove_writer(fd)
            continue
        view = view[n:]


__all__ = ["Program", "Programs", "Read", "SandboxUnavailable"]
