"""The terminal chat's Textual app: transcript, approvals, what waits, the composer and its keys."""

from __future__ import annotations

import asyncio
import mimetypes
import time
from pathlib import Path
from typing import Any

from rich.text import Text
from textual import on
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.widgets import Footer, Input, Static

from .chat_client import ApiError, ChatApi
from .chat_state import ChatModel, Item, Waiting, mcp_lines, program_lines

HINT_BUSY = "A turn is running: Enter is refused. Ctrl+O queue · Ctrl+S steer · Ctrl+L Lead (join this turn)"
HINT_RUN = ("Refused: a run drives this session (run_active), so nothing was sent. Esc stops the run; "
            "after that a message goes on with the task as a chat. The text is kept.")
REFUSALS = {
    "busy": HINT_BUSY,
    "run_active": HINT_RUN,
    "no_turn": "No turn is running, so there is nothing to Lead: press Enter to send it. The text is kept.",
    "lead_closed": "This turn is finishing and takes no more Leads: Ctrl+O to queue it. The text is kept.",
}
HELP = ("Enter send · Ctrl+O queue · Ctrl+S steer · Ctrl+L Lead · Esc stop · Ctrl+Y/Ctrl+N allow/deny (press twice) · "
        "/allow [msg] /deny [msg] /always [msg] · /drop N · /move N M · /undo · /versions PATH · /diff VID · /restore VID · "
        "/title NEW · /model NAME · /dontask on|off · /fork N · /rewind N [conversation|files|both] · /mcp · "
        "/attach PATH · !cmd runs it · !&cmd starts a program · /programs · /kill N · /stop programs · /clear · /quit")
STATUS = {"proposed": "proposed", "running": "running", "waiting": "waiting for you", "ok": "done",
          "fail": "failed", "denied": "denied by you", "refused": "refused", "skipped": "skipped", "closed": "closed"}
VIA = {"queue": "queued", "steer": "steered", "lead": "Lead", "approval": "with the approval", "run": "sent by the run"}


def run_line(run: dict[str, Any] | None) -> Text:
    """The status line while a run drives the session: its confirm mode, its turns, what Stop does."""
    if not run or run.get("state") != "running":
        return Text("")
    unattended = ", unattended" if run.get("unattended") else ""
    supervised = run.get("confirm") == "person" and not run.get("unattended")
    t = Text("RUN ", style="bold black on yellow")
    t.append(f" a run drives this session (confirm {run.get('confirm')}{unattended}, "
             f"turn {run.get('turns') or 0} of {run.get('max_turns')}): messages are refused until it ends"
             + (" (Ctrl+L: a Lead joins its turn)" if supervised else "") + " · Esc stops the run", style="bold")
    return t
KIND = {"queue": "Queue", "steer": "Steer", "lead": "Lead"}


def args_text(name: str | None, args: Any) -> str:
    if isinstance(args, dict):
        if name == "run_command" and "command" in args:
            return str(args["command"])
        if "path" in args:
            extra = f" ({len(str(args['content']))} chars)" if "content" in args else ""
            return f"{args['path']}{extra}"
    return "" if args is None else str(args)


def render_item(it: Item) -> Text:
    t = Text()
    if it.kind == "user":
        label = f"you ({VIA[it.via]})" if it.via in VIA else "you"
        t.append(f"{label}: ", style="bold cyan")
        t.append(it.text)
    elif it.kind == "assistant":
        t.append("model: ", style="bold green")
        t.append(it.text + ("▍" if it.streaming else ""))
    elif it.kind == "agent":
        t.append("model says: ", style="bold green")
        t.append(it.text)
    elif it.kind == "tool":
        t.append(f"⚙ {it.name or 'tool'} ", style="bold")
        t.append(args_text(it.name, it.args)[:200], style="dim")
        status = STATUS.get(it.status, it.status) + (f" ({it.detail})" if it.detail else "")
        t.append(f"  [{status}]", style="bold red" if it.status == "fail" else "magenta" if it.status == "denied"
                 else "dark_orange" if it.status == "refused" else "yellow"
                 if it.status in ("waiting", "skipped", "closed") else "green")
        for p in it.policy:
            t.append(f"\n    {p}", style="dim")
        if it.answer:
            t.append(f"\n    {it.answer}", style="magenta")
        if it.output:
            lines = it.output.rstrip("\n").splitlines()
            shown = "\n".join("    │ " + ln for ln in lines[:6]) + ("\n    │ …" if len(lines) > 6 else "")
            t.append("\n" + shown, style="dim")
    elif it.kind == "fate":
        t.append(it.text, style="yellow")
    elif it.kind == "system":
        t.append(it.text, style="red" if it.cls == "error" else "magenta")
    else:
        t.append(it.text, style="red dim" if it.cls == "bad" else "dim")
    return t


class ChatApp(App[int]):
    TITLE = "coxswain chat"
    CSS = """
    #head { height: 1; background: $boost; padding: 0 1; }
    #plan { height: auto; max-height: 8; padding: 0 1; color: $text-muted; }
    #transcript { height: 1fr; padding: 0 1; }
    #transcript > Static { margin: 0 0 1 0; }
    #approvals { height: auto; padding: 0 1; }
    #outbox { height: auto; max-height: 10; padding: 0 1; }
    #note { height: auto; padding: 0 1; color: $warning; }
    #run { height: auto; padding: 0 1; }
    """
    BINDINGS = [
        Binding("ctrl+o", "queue", "Queue", priority=True),
        Binding("ctrl+s", "steer", "Steer", priority=True),
        Binding("ctrl+l", "lead", "Lead", priority=True),
        Binding("escape", "stop", "Stop", priority=True),
        Binding("ctrl+y", "answer('allow')", "Allow", priority=True),
        Binding("ctrl+n", "answer('deny')", "Deny", priority=True),
        Binding("ctrl+q", "quit", "Quit", priority=True),
    ]

    def __init__(self, api: ChatApi, sid: str | None = None, workspace: str = "demo", model: str | None = None) -> None:
        super().__init__()
        self.api = api
        self.sid = sid
        self.workspace = workspace
        self.model_name = model
        self.m: ChatModel | None = None
        self.stream_status = "connecting"
        self.widgets: dict[str, Static] = {}
        self.ready = asyncio.Event()
        self.confirm: tuple[str, str, str, float] | None = None
        """A Ctrl+Y/Ctrl+N waiting for its second press: (decision, approval id, message, when)."""
        self.attached: list[dict[str, Any]] = []
        """Files uploaded with ``/attach``, sent with the next message (send, queue or steer)."""

    def compose(self) -> ComposeResult:
        yield Static(id="head")
        yield Static(id="plan")
        yield VerticalScroll(id="transcript")
        yield Static(id="approvals")
        yield Static(id="outbox")
        yield Static(id="run")
        yield Input(id="draft", placeholder="Message: Enter sends · /help")
        yield Static(id="note")
        yield Footer()

    # ------------------------------------------------------------------ startup and stream
    async def on_mount(self) -> None:
        self.query_one("#draft", Input).focus()
        try:
            if not self.sid:
                self.sid = str((await self.api.create(self.workspace, self.model_name))["id"])
            m = ChatModel(self.sid)
            async for ev in self.api.backlog(self.sid, 0):
                m.apply(ev)
            m.apply_session(await self.api.session(self.sid))
        except ApiError as exc:
            self.say(f"Could not open the session: {exc.detail}", error=True)
            self.stream_status = "down"
            return
        m.replaying = False
        m.mark("head", "approvals", "outbox", "plan")
        self.m = m
        self.redraw()
        self.run_worker(self.api.follow(self.sid, m.last_seq, self.on_api_event, self.on_stream_status), group="stream",
                        exclusive=True, exit_on_error=False)
        self.ready.set()
        self.set_interval(1.0, self._tick)

    def _tick(self) -> None:
        """The running turn's time moves on without an event."""
        if self.m is not None and self.m.info.get("busy"):
            self.query_one("#head", Static).update(self.head_text())

    async def on_api_event(self, ev: dict[str, Any]) -> None:
        assert self.m is not None
        self.m.apply(ev)
        self.redraw()
        if "need-session" in self.m.changed:
            self.m.changed.discard("need-session")
            try:
                self.m.apply_session(await self.api.session(self.m.sid))
                self.redraw()
            except ApiError:
                pass

    def on_stream_status(self, status: str) -> None:
        self.stream_status = status
        if self.m is not None:
            self.m.mark("head")
            self.redraw()

    async def on_unmount(self) -> None:
        await self.api.aclose()

    # ------------------------------------------------------------------ drawing
    def redraw(self) -> None:
        m = self.m
        if m is None:
            return
        box = self.query_one("#transcript", VerticalScroll)
        at_end = box.scroll_y >= box.max_scroll_y - 1
        new: list[Static] = []
        for c in sorted(x for x in m.changed if x.startswith("item:")):
            it = m.by_key.get(c[5:])
            if it is None:
                continue
            w = self.widgets.get(it.key)
            if w is None:
                w = Static(render_item(it), classes=f"item {it.kind}")
                w.item_key = it.key  # type: ignore[attr-defined]
                self.widgets[it.key] = w
                new.append(w)
            else:
                w.update(render_item(it))
        if new:
            order = {it.key: i for i, it in enumerate(m.items)}
            new.sort(key=lambda w: order[w.item_key])  # type: ignore[attr-defined]
            box.mount_all(new)
        self.query_one("#head", Static).update(self.head_text())
        self.query_one("#plan", Static).update(self.plan_text())
        self.query_one("#approvals", Static).update(self.approvals_text())
        self.query_one("#outbox", Static).update(self.outbox_text())
        self.query_one("#run", Static).update(run_line(m.info.get("run")))
        m.changed = {c for c in m.changed if c == "need-session"}
        if at_end or new:
            box.scroll_end(animate=False)

    def head_text(self) -> Text:
        assert self.m is not None
        i = self.m.info
        t = Text()
        t.append(str(i.get("title") or "untitled"), style="bold")
        if i.get("title_source") == "manual":
            t.append(" (renamed)", style="dim")
        t.append(f" · {i.get('model')}")
        if i.get("next_model") and i.get("next_model") != i.get("model"):
            t.append(f" (next: {i['next_model']})")
        t.append(" · ")
        t.append("working" if i.get("busy") else "idle", style="bold yellow" if i.get("busy") else "green")
        run = i.get("run")
        if isinstance(run, dict):  # a run: running (the program drives it) or ended (a chat now)
            t.append(f" · run {run.get('state')}" + (f" {run.get('outcome')}" if run.get("state") == "ended" else ""),
                     style="bold yellow" if run.get("state") == "running" else "dim")
        t.append(f" · stream {self.stream_status} · don't ask {'on' if i.get('dont_ask') else 'off'}")
        t.append(f" · {Path(str(i.get('workspace') or '')).name}", style="dim")
        servers = i.get("mcp_servers") or []
        if servers:  # MCP tool servers: how many are ready; a failed or exited one is named
            ready = sum(1 for s in servers if s.get("state") == "ready") if i.get("busy") else 0
            down = [str(s.get("name")) for s in servers if s.get("state") in ("failed", "exited")]
            t.append(f" · MCP {ready}/{len(servers)} ready")
            if down:
                t.append(f" ({', '.join(down)} down: /mcp)", style="bold red")
        t.append_text(self.status_text())
        return t

    def status_text(self) -> Text:
        """The turn at a glance: what it waits for, its time, tool calls and tokens; the session's."""
        assert self.m is not None
        m, t = self.m, Text()
        waiting = m.waiting_for()
        if waiting:
            t.append(f" · waiting for: {waiting}", style="bold yellow")
        if m.turn is not None:
            end = m.turn.get("ended") if not m.info.get("busy") else None
            ms = (end or time.time() * 1000) - (m.turn.get("started") or 0)
            what = "last turn" if end else "turn"
            t.append(f" · {what} {max(0, round(ms / 1000))}s, {m.turn['tools']} tool calls, {int(m.turn['tokens'])} tokens")
            if m.turn["cost"]:
                t.append(f" ${m.turn['cost']:.4f}")
        tot = m.totals
        t.append(f" · session {int(tot['turns'])} turns {int(tot['tokens'])} tokens", style="dim")
        return t

    def plan_text(self) -> Text:
        assert self.m is not None
        plan = self.m.plan
        if not plan or not plan.get("steps"):
            return Text("")
        marks = set(plan.get("marks") or [])
        t = Text("Plan" + (" (carried from an unfinished turn)" if plan.get("carried_from") else "") + ": ", style="bold")
        for n, step in enumerate(plan["steps"], 1):
            t.append(f"{n}. {'✓ ' if n in marks else ''}{step}  ", style="dim" if n in marks else "")
        return t

    def approvals_text(self) -> Text:
        assert self.m is not None
        t = Text()
        for a in self.m.approvals.values():
            if a.get("security"):
                t.append("SECURITY CONFIRM ", style="bold white on red")
            else:
                t.append("APPROVAL NEEDED ", style="bold black on yellow")
            t.append(f" {a.get('name')}: {args_text(a.get('name'), a.get('args'))}\n", style="bold")
            if a.get("reason"):
                t.append(f"  why: {a['reason']}\n")
            j = a.get("judge")
            if j:
                score = f" (score {j.get('score')})" if j.get("score") is not None else ""
                t.append(f"  judge ({j.get('kind')}) said {j.get('verdict')}{score}: {j.get('reason')}\n", style="yellow")
            always = "" if a.get("security") else " · /always [msg]"
            t.append(f"  answer: /allow [msg] · /deny [msg]{always} · Ctrl+Y allow · Ctrl+N deny (the typed text goes with it)\n",
                     style="dim")
        return t

    def outbox_text(self) -> Text:
        assert self.m is not None
        items: list[Waiting] = self.m.waiting()
        if not items:
            return Text("")
        t = Text("Waiting and settled (/drop N, /move N M):\n", style="bold")
        queued = self.m.queued()
        for w in items:
            style = {"queued": "yellow", "pending": "yellow", "applied": "green", "removed": "dim"}.get(w.fate, "red")
            n = f"#{queued.index(w) + 1} " if w in queued else ""
            t.append(f"  {n}[{w.fate}] ", style=style)
            t.append(f"{KIND.get(w.kind, w.kind)}: {(w.text or w.id).splitlines()[0][:120]}\n")
        return t

    def say(self, text: str, error: bool = False) -> None:
        note = self.query_one("#note", Static)
        note.update(Text(text, style="bold red" if error else ""))

    def tell(self, text: str, error: bool = False) -> None:
        """A command's answer as a line in the transcript."""
        if self.m is not None:
            self.m.system(text, "error" if error else "")
            self.redraw()

    # ------------------------------------------------------------------ composer
    @property
    def draft(self) -> Input:
        return self.query_one("#draft", Input)

    def take(self) -> str | None:
        text = self.draft.value
        if not text.strip():
            self.say("Type a message first.", error=True)
            return None
        return text

    def done(self, text: str) -> None:
        if self.draft.value == text:  # only after success: a refused message stays in the box
            self.draft.value = ""

    @on(Input.Submitted, "#draft")
    async def submitted(self, event: Input.Submitted) -> None:
        text = event.value
        if text.startswith("/"):
            await self.command(text)
        elif text.startswith("!") and text[1:].strip():
            await self.shell(text)
        else:
            await self.act("send")

    async def act(self, kind: str) -> None:
        m = self.m
        if m is None:
            return
        text = self.take()
        if text is None:
            return
        if kind == "send" and m.info.get("busy") and m.run_driving() is None:  # a run: the server says run_active
            self.say(HINT_BUSY, error=True)
            return
        try:
            if kind == "lead":
                if self.attached:
                    self.say("A Lead is text only: the attached files go with a message you send, queue or steer "
                             "(/attach - drops them). The text is kept.", error=True)
                    return
                r = await self.api.lead(m.sid, text)
                m.sent(r["lead_id"], "lead", text)
                self.say(f"Lead saved: it joins this turn at its next safe boundary ({r['pending']} pending).")
            else:
                mode = None if kind == "send" else kind
                r = await self.api.send(m.sid, text, mode, [a["attachment_id"] for a in self.attached])
                self.attached = []
                if r["disposition"] == "started":
                    m.local_texts[r["message_id"]] = text
                    self.say("")
                else:
                    m.sent(r["message_id"], "steer" if mode == "steer" else "queue", text)
                    self.say("Steering: the running turn stops and this runs next." if r["disposition"] == "steered"
                             else f"Queued (position {r.get('position')}): it runs when this turn ends.")
            self.done(text)
            self.redraw()
        except ApiError as exc:
            what = "Lead not saved" if kind == "lead" else "Not sent"
            if kind == "lead" and exc.code == "run_active":
                self.say("Refused: this run is not supervised (confirm is not person, or it is unattended), so it takes "
                         "no Lead. Esc stops the run. The text is kept.", error=True)
                return
            self.say(REFUSALS.get(exc.code) or f"{what}: {exc.detail}. The text is kept.", error=True)

    async def action_queue(self) -> None:
        await self.act("queue")

    async def action_steer(self) -> None:
        await self.act("steer")

    async def action_lead(self) -> None:
        await self.act("lead")

    async def action_stop(self) -> None:
        m = self.m
        if m is None:
            return
        # Read before the call: the run's run.end can arrive on the stream before Stop's reply.
        run_driving = m.run_driving() is not None
        try:
            r = await self.api.stop(m.sid)
        except ApiError as exc:
            self.say(f"Stop failed: {exc.detail}", error=True)
            return
        if not r.get("turn_id"):
            self.say("Nothing was running.")
            return
        parts = ["the run ends (run.end stopped)"] if run_driving else []
        if r.get("discarded"):
            parts.append(f"{len(r['discarded'])} queued discarded")
        if r.get("unapplied_leads"):
            parts.append(f"{len(r['unapplied_leads'])} Lead(s) saved but not applied")
        self.say("Stopped." + (" " + "; ".join(parts) + "." if parts else ""))

    async def action_answer(self, decision: str, scope: str = "once", message: str | None = None,
                            from_draft: bool = True) -> None:
        m = self.m
        if m is None:
            return
        if not m.approvals:
            self.say("No approval is waiting.", error=True)
            return
        aid = next(iter(m.approvals))
        text = self.draft.value.strip() if from_draft and message is None else (message or "")
        if from_draft and message is None:
            # A key press while typing must not answer by itself: the first Ctrl+Y/Ctrl+N says what
            # it would do; only the same key again (same approval, same text, within 10 s) answers.
            c = self.confirm
            if c is None or c[:3] != (decision, aid, text) or time.monotonic() - c[3] > 10:
                self.confirm = (decision, aid, text, time.monotonic())
                a = m.approvals[aid]
                key = "Ctrl+Y" if decision == "allow" else "Ctrl+N"
                what = f"{a.get('name')}: {args_text(a.get('name'), a.get('args'))}"
                self.say(f"Press {key} again to {'ALLOW' if decision == 'allow' else 'DENY'} {what}"
                         + (f" with “{text}”" if text else "") + " — or answer with /allow, /deny.", error=True)
                return
            self.confirm = None
        try:
            await self.api.answer(m.sid, aid, decision, scope, text or None)
        except ApiError as exc:
            self.say(f"Answer not taken: {exc.detail}", error=True)
            return
        if from_draft and message is None and text:
            self.draft.value = ""
        self.say(f"{'Allowed' if decision == 'allow' else 'Denied'}" + (f" with “{text}”" if text else "") + ".")

    async def shell(self, text: str) -> None:
        """``!command`` runs it in the session's sandbox now (its output shown, and folded into the
        model's next tool result); ``!&command`` starts it as one of the session's programs."""
        m = self.m
        if m is None:
            return
        background = text.startswith("!&")
        command = text[2:].strip() if background else text[1:].strip()
        try:
            await self.api.observe(m.sid, command, background)
        except ApiError as exc:
            self.say(f"Not run: {exc.detail}. The text is kept.", error=True)
            return
        self.done(text)
        self.say("Started in the background: /programs lists it, /kill N stops it." if background else "")

    async def attach_command(self, rest: str) -> None:
        """``/attach PATH`` uploads a file for the next message; ``/attach`` lists what is attached,
        ``/attach -`` drops it all (an upload the server refused is not kept)."""
        m = self.m
        assert m is not None
        if rest == "-":
            self.attached = []
            self.say("Nothing attached now.")
            return
        if not rest:
            self.say("Attached to the next message: " + ", ".join(f"{a['name']} ({a['size']} bytes)" for a in self.attached)
                     if self.attached else "Nothing attached: /attach PATH adds a file to the next message.")
            return
        path = Path(rest).expanduser()
        try:
            data = await asyncio.to_thread(path.read_bytes)
        except OSError as exc:
            raise ApiError(0, "usage", f"cannot read {rest}: {exc.strerror or exc}") from None
        media_type = mimetypes.guess_type(path.name)[0] or "application/octet-stream"
        a = await self.api.attach(m.sid, path.name, data, media_type)
        self.attached.append(a)
        self.say(f"Attached {a['name']} ({a['media_type']}, {a['size']} bytes): it goes with your next message "
                 f"({len(self.attached)} attached; /attach - drops them).")

    async def program_command(self, name: str, rest: str) -> None:
        """/programs lists the session's running programs; /kill N stops the N-th of that list."""
        m = self.m
        assert m is not None
        m.apply_session(await self.api.session(m.sid))
        progs = list(m.info.get("programs") or [])
        if name == "programs":
            self.tell("\n".join(program_lines(progs)))
            return
        if not rest.isdigit() or not 1 <= int(rest) <= len(progs):
            raise ApiError(0, "usage", f"/kill N, N from 1 to {len(progs)} (/programs lists them)" if progs
                           else "no program is running")
        p = progs[int(rest) - 1]
        await self.api.program_stop(m.sid, str(p["program_id"]))
        self.tell(f"Stopping program {p.get('name')} ({p['program_id']}).")

    async def queue_command(self, name: str, rest: str) -> None:
        """/drop N removes the N-th queued message; /move N M puts it at place M (recorded events)."""
        m = self.m
        assert m is not None
        queued = m.queued()
        try:
            nums = [int(x) for x in rest.split()]
            if len(nums) != (1 if name == "drop" else 2) or not all(1 <= n <= len(queued) for n in nums):
                raise ValueError
        except ValueError:
            raise ApiError(0, "usage",
                           f"/{name} {'N' if name == 'drop' else 'N M'}: N among 1..{len(queued)} queued") from None
        w = queued[nums[0] - 1]
        if name == "drop":
            await self.api.queue_remove(m.sid, w.id)
            self.say(f"Removed “{w.text.splitlines()[0][:80] if w.text else w.id}” from the queue.")
        else:
            ids = [x.id for x in queued]
            ids.remove(w.id)
            ids.insert(nums[1] - 1, w.id)
            await self.api.queue_order(m.sid, ids)
            self.say(f"Moved #{nums[0]} to #{nums[1]}.")
        self.draft.value = ""

    async def turn_command(self, name: str, rest: str) -> None:
        """/fork N opens a new session from the end of turn N (its conversation, its files then);
        /rewind N [conversation|files|both] goes back to it between turns (default both)."""
        m = self.m
        assert m is not None
        words = rest.split()
        usage = "/fork N" if name == "fork" else "/rewind N [conversation|files|both]"
        if not words or not words[0].isdigit() or len(words) > (1 if name == "fork" else 2):
            raise ApiError(0, "usage", usage)
        n = int(words[0])
        if name == "fork":
            s = await self.api.fork(m.sid, n)
            self.draft.value = ""
            await self.open_session(str(s["id"]))
            self.tell(f"This is a fork of {m.sid} at its turn {n}, in {s.get('workspace')} "
                      f"(back to the source: cox chat {m.sid}).")
            return
        scope = words[1] if len(words) > 1 else "both"
        r = await self.api.rewind(m.sid, n, scope)
        files = f"; put back: {', '.join(r['restored_files'])}" if r.get("restored_files") else ""
        self.say(f"Rewound ({r['scope']}) to the end of turn {n}{files}.")
        self.draft.value = ""

    async def open_session(self, sid: str) -> None:
        """Show another session in place of this one (its log, then its live stream)."""
        m = ChatModel(sid)
        async for ev in self.api.backlog(sid, 0):
            m.apply(ev)
        m.apply_session(await self.api.session(sid))
        m.replaying = False
        m.mark("head", "approvals", "outbox", "plan")
        await self.query_one("#transcript", VerticalScroll).remove_children()
        self.widgets.clear()
        self.sid, self.m = sid, m
        self.redraw()
        # exclusive: the old session's stream worker is cancelled
        self.run_worker(self.api.follow(sid, m.last_seq, self.on_api_event, self.on_stream_status), group="stream",
                        exclusive=True, exit_on_error=False)

    # ------------------------------------------------------------------ slash commands
    async def command(self, line: str) -> None:
        m = self.m
        if m is None:
            return
        name, _, rest = line[1:].partition(" ")
        rest = rest.strip()
        try:
            if name in ("allow", "deny", "always"):
                decision = "deny" if name == "deny" else "allow"
                await self.action_answer(decision, "session" if name == "always" else "once", rest, from_draft=False)
                self.draft.value = ""
                return
            if name in ("drop", "move"):
                await self.queue_command(name, rest)
                return
            if name in ("fork", "rewind"):
                await self.turn_command(name, rest)
                return
            if name == "attach":
                await self.attach_command(rest)
                self.draft.value = ""
                return
            if name in ("programs", "kill"):
                await self.program_command(name, rest)
                self.draft.value = ""
                return
            if name == "undo":
                r = await self.api.undo(m.sid)
                self.tell(f"Undid the latest write: {r['path']} put back (+{r['added']} −{r['removed']}).")
            elif name == "versions":
                if not rest:
                    raise ApiError(0, "usage", "/versions PATH")
                r = await self.api.versions(m.sid, rest)
                vs = r.get("versions") or []
                lines = [f"Kept versions of {r.get('path', rest)} (newest first):" if vs else f"No kept versions of {rest}."]
                for v in vs:
                    when = time.strftime("%H:%M:%S", time.localtime(float(v.get("created", 0))))
                    what = "did not exist" if v.get("store") == "absent" else f"{v.get('size')} bytes, {v.get('store')}"
                    undone = " (undone)" if v.get("undone") else ""
                    lines.append(f"  {v['version_id']}  {when}  {v.get('reason')}  {what}{undone}")
                self.tell("\n".join(lines))
            elif name == "diff":
                r = await self.api.diff(m.sid, rest)
                flag = ("too large to compare" if r.get("oversized") else "no difference" if r.get("empty")
                        else "the current file is missing (a deletion)" if r.get("deleted") else "")
                self.tell(f"{r['path']}: {rest} → current (+{r['added']} −{r['removed']})"
                          + (f" — {flag}" if flag else "") + ("\n" + r["diff"].rstrip("\n") if r.get("diff") else ""))
            elif name == "restore":
                r = await self.api.restore(m.sid, rest)
                self.tell(f"Restored {r['path']} from {r['restored_from']} (+{r['added']} −{r['removed']}); "
                          f"the content it replaced is kept as {r['kept']['version_id']}.")
            elif name == "title":
                if not rest:
                    raise ApiError(0, "usage", "/title NEW")
                m.apply_session(await self.api.patch(m.sid, title=rest))
            elif name == "model":
                m.apply_session(await self.api.patch(m.sid, model=rest))
            elif name == "mcp":
                m.apply_session(await self.api.session(m.sid))
                self.tell("\n".join(mcp_lines(m.info.get("mcp_servers") or [])))
            elif name == "dontask":
                m.apply_session(await self.api.patch(m.sid, dont_ask=rest.lower() in ("on", "1", "true", "yes")))
            elif name == "stop" and rest == "programs":
                await self.api.stop_programs(m.sid)
                self.tell("Stopped the turn, if one ran, and the session's programs.")
            elif name == "stop":
                await self.action_stop()
            elif name == "clear":
                m.clear_settled()
            elif name == "quit":
                self.exit(0)
                return
            elif name == "help":
                self.tell(HELP)
            else:
                raise ApiError(0, "usage", f"unknown command /{name}; /help lists them")
        except ApiError as exc:
            self.say(exc.detail, error=True)
            return
        self.draft.value = ""
        self.redraw()
