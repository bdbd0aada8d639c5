"""Real HTTP model servers for tests: an OpenAI-compatible chat-completions endpoint and an
Anthropic messages endpoint, both streaming SSE the way the real ones do, run by uvicorn on a
free port in a thread of the test process.

They are strict where the real APIs are: a request whose assistant tool calls are not each
answered by a tool result (before anything else) is refused with 400, as OpenAI and Anthropic
refuse it, so a runner that ever shows a model a call without its result fails the turn.

What they answer is chosen per conversation, like the ``script`` model: the latest user message
holding a tag ``[case:NAME]`` picks ``cases[NAME]``, and the n-th response after it is
``cases[NAME][n]`` (past the end: ``"fake done"``). A request that asks for a title gets
``TITLE``. Every request body is kept in ``requests`` for the test to inspect.

Long turns: a case named in ``stateful`` answers its n-th request (whatever the transcript
holds, since compaction shortens it) with ``cases[NAME][n]``. A compaction's summary request
(its instructions say ``COMPACT_MARK``) gets ``SUMMARY``, or ``summary_error`` as an HTTP status.
With ``window`` set, a request whose text (system, messages, tool arguments) is over ``window``
tokens (4 characters each) is refused with 400 ``context_length_exceeded``, as real servers do.

Vision: image parts are read off the wire (:func:`image_parts`: OpenAI ``image_url`` data URLs,
Anthropic base64 ``image`` blocks). With ``vision = False`` the server is a text-only model: a
request holding an image is refused with 400 and kept in ``refused``, as such a model refuses it.
"""

from __future__ import annotations

import asyncio
import base64
import json
import re
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from cox.servers import free_port

CASE_RE = re.compile(r"\[case:([\w-]+)\]")
TITLE = "Fake Title From The Model"
TITLE_MARK = "Give this conversation a title"
COMPACT_MARK = "You are compacting a conversation"
SUMMARY = "FAKE SUMMARY: the agent read big.txt many times."


@dataclass
class Reply:
    """One model response: text, tool calls (name, arguments as a JSON string), finish reason."""

    text: str | None = None
    tools: list[tuple[str, str]] = field(default_factory=list)
    finish: str | None = None
    """Provider wording: OpenAI stop|length|tool_calls, Anthropic end_turn|max_tokens|tool_use."""
    delay: float = 0.0
    error: int | None = None
    """Answer with this HTTP status and an error body instead."""
    fails: int = 0
    """Answer the first ``fails`` requests for this reply with 429 (``Retry-After: retry_after``)."""
    retry_after: float = 0.05

    @staticmethod
    def calls(*calls: tuple[str, dict[str, Any]], text: str | None = None, finish: str | None = None,
              delay: float = 0.0) -> Reply:
        return Reply(text, [(n, json.dumps(a)) for n, a in calls], finish, delay)


class FakeModels:
    def __init__(self) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.cases: dict[str, list[Reply]] = {}
        self.requests: list[dict[str, Any]] = []
        self.refused: list[str] = []
        self._failed: dict[int, int] = {}
        self.stateful: set[str] = set()
        self.window: int | None = None
        self.summary_error: int | None = None
        self.vision = True
        """False: a request holding an image part is refused (400), as a text-only model does."""
        self.over_window: list[int] = []
        """Requests refused for being over ``window`` (their token counts)."""
        self._n = 0
        app = Starlette(routes=[
            Route("/v1/chat/completions", self.openai, methods=["POST"]),
            Route("/v1/messages", self.anthropic, methods=["POST"]),
        ])
        # Kept idle longer than the SDKs' httpx pools keep a connection (5 s), as the gateway does
        # (gateway.keep_alive_s): equal timers race, and the loser's request is reset unread.
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning",
                                                    lifespan="off", timeout_keep_alive=75))
        self.thread = threading.Thread(target=self.server.run, name="fake-models", daemon=True)

    def openai_provider(self) -> str:
        """This server as the ``fake-openai`` provider of a stack's config: its ``[[model.providers]]``
        table (keys may follow it)."""
        return f"""[[model.providers]]
name = "fake-openai"
kind = "openai"
base_url = "{self.url}/v1"
model = "fake-model"
api_key = "sk-test-not-a-key\""""

    def __enter__(self) -> FakeModels:
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            if time.monotonic() > deadline:
                raise RuntimeError("fake model server did not start")
            time.sleep(0.01)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(10)

    def for_case(self, case: str, kind: str = "openai") -> list[dict[str, Any]]:
        """The requests (not title requests) of one case, in order."""
        return [r for r in self.requests if r.get("_case") == case and r.get("_kind") == kind
                and not r.get("_title") and not r.get("_summary")]

    def images(self, case: str | None = None) -> list[tuple[str, bytes]]:
        """Every image part the server received (of one case): (media type, bytes), in order."""
        return [img for r in self.requests if case is None or r.get("_case") == case
                for img in image_parts(r, str(r.get("_kind")))]

    def _no_vision(self, kind: str, body: dict[str, Any]) -> Response | None:
        if self.vision or not image_parts(body, kind):
            return None
        self.refused.append("image sent to a model without vision")
        return _error(kind, 400, "this model does not support image input")

    def summaries(self) -> list[dict[str, Any]]:
        return [r for r in self.requests if r.get("_summary")]

    def _special(self, kind: str, system: str, body: dict[str, Any],
                 case: str | None) -> tuple[Reply | None, Response | None]:
        """A summary request, a request over the window, or the next reply of a stateful case."""
        if COMPACT_MARK in system:
            self.requests.append({**body, "_kind": kind, "_case": None, "_summary": True})
            if self.summary_error:
                return None, _error(kind, self.summary_error, "summary refused by the test")
            return Reply(SUMMARY), None
        if self.window is not None and TITLE_MARK not in system:
            size = _tokens(system, body.get("messages", []))
            if size > self.window:
                self.over_window.append(size)
                return None, _error(kind, 400, f"context_length_exceeded: {size} tokens is over the window "
                                               f"of {self.window}")
        if case in self.stateful:
            n = len(self.for_case(case, kind))
            replies = self.cases.get(case, [])
            return (replies[n] if n < len(replies) else Reply("fake done")), None
        return None, None

    def _id(self, prefix: str) -> str:
        self._n += 1
        return f"{prefix}{self._n:06d}"

    # ------------------------------------------------------------------ shared
    def _pick(self, user_texts: list[str], responses_after: list[int]) -> tuple[str | None, Reply]:
        for text, n in zip(reversed(user_texts), reversed(responses_after), strict=True):
            m = CASE_RE.search(text)
            if m:
                replies = self.cases.get(m.group(1), [])
                return m.group(1), replies[n] if n < len(replies) else Reply("fake done")
        return None, Reply("fake done")

    # ------------------------------------------------------------------ OpenAI chat completions
    async def openai(self, request: Request) -> Response:
        body = await request.json()
        if (refusal := self._no_vision("openai", body)) is not None:
            return refusal
        msgs = body.get("messages", [])
        problem = _openai_unanswered(msgs)
        if problem:
            self.refused.append(problem)
            return JSONResponse({"error": {"message": problem, "type": "invalid_request_error",
                                           "param": "messages", "code": None}}, status_code=400)
        system = " ".join(_text(m.get("content")) for m in msgs if m.get("role") in ("system", "developer"))
        users, after = [], []
        for m in msgs:
            if m.get("role") == "user":
                users.append(_text(m.get("content")))
                after.append(0)
            elif m.get("role") == "assistant" and after:
                after[-1] += 1
        after = [sum(after[i:]) for i in range(len(after))]
        is_title = TITLE_MARK in system
        case, reply = (None, Reply(TITLE)) if is_title else self._pick(users, after)
        if is_title:
            case = next((c.group(1) for u in users if (c := CASE_RE.search(u))), None)
        special, answer = self._special("openai", system, body, case)
        if answer is not None:
            return answer
        if special is not None and special.text == SUMMARY:
            reply = special
        else:
            reply = special or reply
            self.requests.append({**body, "_kind": "openai", "_case": case, "_title": is_title})
        if reply.fails and self._failed.get(id(reply), 0) < reply.fails:
            self._failed[id(reply)] = self._failed.get(id(reply), 0) + 1
            return JSONResponse({"error": {"message": "rate limited by the test", "type": "rate_limit_error",
                                           "param": None, "code": None}}, status_code=429,
                                headers={"Retry-After": f"{reply.retry_after:g}"})
        if reply.error:
            return JSONResponse({"error": {"message": "refused by the test", "type": "invalid_request_error",
                                           "param": None, "code": None}}, status_code=reply.error)
        model = body.get("model", "fake-model")
        finish = reply.finish or ("tool_calls" if reply.tools else "stop")
        cid = self._id("chatcmpl-")
        calls = [(self._id("call_"), n, a) for n, a in reply.tools]
        usage = {"prompt_tokens": 50, "completion_tokens": 7, "total_tokens": 57}
        if not body.get("stream"):
            message: dict[str, Any] = {"role": "assistant", "content": reply.text}
            if calls:
                message["tool_calls"] = [{"id": i, "type": "function", "function": {"name": n, "arguments": a}}
                                         for i, n, a in calls]
            return JSONResponse({"id": cid, "object": "chat.completion", "created": int(time.time()), "model": model,
                                 "choices": [{"index": 0, "message": message, "finish_reason": finish}],
                                 "usage": usage})

        def chunk(delta: dict[str, Any], finish_reason: str | None = None) -> str:
            c = {"id": cid, "object": "chat.completion.chunk", "created": int(time.time()), "model": model,
                 "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}]}
            return f"data: {json.dumps(c)}\n\n"

        async def stream() -> AsyncIterator[str]:
            yield chunk({"role": "assistant", "content": ""})
            words = re.findall(r"\S+\s*", reply.text or "")
            for w in words:
                if reply.delay:
                    await asyncio.sleep(reply.delay / max(1, len(words)))
                yield chunk({"content": w})
            if reply.delay and not words:
                await asyncio.sleep(reply.delay)
            for i, (call_id, name, args) in enumerate(calls):
                yield chunk({"tool_calls": [{"index": i, "id": call_id, "type": "function",
                                             "function": {"name": name, "arguments": ""}}]})
                half = len(args) // 2
                for piece in (args[:half], args[half:]):
                    yield chunk({"tool_calls": [{"index": i, "function": {"arguments": piece}}]})
            yield chunk({}, finish)
            tail = {"id": cid, "object": "chat.completion.chunk", "created": int(time.time()), "model": model,
                    "choices": [], "usage": usage}
            yield f"data: {json.dumps(tail)}\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(stream(), media_type="text/event-stream")

    # ------------------------------------------------------------------ Anthropic messages
    async def anthropic(self, request: Request) -> Response:
        body = await request.json()
        if (refusal := self._no_vision("anthropic", body)) is not None:
            return refusal
        msgs = body.get("messages", [])
        problem = _anthropic_unanswered(msgs)
        if problem:
            self.refused.append(problem)
            return JSONResponse({"type": "error", "error": {"type": "invalid_request_error", "message": problem}},
                                status_code=400)
        system = body.get("system")
        system_text = system if isinstance(system, str) else " ".join(_text(b) for b in system or [])
        users, after = [], []
        for m in msgs:
            if m.get("role") == "user":
                for t in _blocks_text(m.get("content")):
                    users.append(t)
                    after.append(0)
            elif m.get("role") == "assistant" and after:
                after[-1] += 1
        after = [sum(after[i:]) for i in range(len(after))]
        is_title = TITLE_MARK in system_text
        case, reply = (None, Reply(TITLE)) if is_title else self._pick(users, after)
        special, answer = self._special("anthropic", system_text, body, case)
        if answer is not None:
            return answer
        if special is not None and special.text == SUMMARY:
            reply = special
        else:
            reply = special or reply
            self.requests.append({**body, "_kind": "anthropic", "_case": case, "_title": is_title})
        model = body.get("model", "claude-fake")
        stop = reply.finish or ("tool_use" if reply.tools else "end_turn")
        mid = self._id("msg_")
        calls = [(self._id("toolu_"), n, a) for n, a in reply.tools]
        if not body.get("stream"):
            content: list[dict[str, Any]] = [{"type": "text", "text": reply.text}] if reply.text else []
            content += [{"type": "tool_use", "id": i, "name": n, "input": json.loads(a)} for i, n, a in calls]
            return JSONResponse({"id": mid, "type": "message", "role": "assistant", "content": content,
                                 "model": model, "stop_reason": stop, "stop_sequence": None,
                                 "usage": {"input_tokens": 40, "output_tokens": 6}})

        def event(kind: str, data: dict[str, Any]) -> str:
            return f"event: {kind}\ndata: {json.dumps({'type': kind, **data})}\n\n"

        async def stream() -> AsyncIterator[str]:
            yield event("message_start", {"message": {
                "id": mid, "type": "message", "role": "assistant", "content": [], "model": model,
                "stop_reason": None, "stop_sequence": None, "usage": {"input_tokens": 40, "output_tokens": 1}}})
            index = 0
            if reply.text:
                yield event("content_block_start", {"index": 0, "content_block": {"type": "text", "text": ""}})
                for w in re.findall(r"\S+\s*", reply.text):
                    if reply.delay:
                        await asyncio.sleep(reply.delay / 4)
                    yield event("content_block_delta", {"index": 0, "delta": {"type": "text_delta", "text": w}})
                yield event("content_block_stop", {"index": 0})
                index = 1
            for i, (call_id, name, args) in enumerate(calls, start=index):
                yield event("content_block_start", {"index": i, "content_block": {
                    "type": "tool_use", "id": call_id, "name": name, "input": {}}})
                yield event("content_block_delta", {"index": i, "delta": {"type": "input_json_delta",
                                                                          "partial_json": args}})
                yield event("content_block_stop", {"index": i})
            yield event("message_delta", {"delta": {"stop_reason": stop, "stop_sequence": None},
                                          "usage": {"output_tokens": 12}})
            yield event("message_stop", {})

        return StreamingResponse(stream(), media_type="text/event-stream")


def _error(kind: str, status: int, message: str) -> Response:
    if kind == "openai":
        return JSONResponse({"error": {"message": message, "type": "invalid_request_error", "param": None,
                                       "code": "context_length_exceeded" if status == 400 else None}},
                            status_code=status)
    return JSONResponse({"type": "error", "error": {"type": "invalid_request_error", "message": message}},
                        status_code=status)


def _tokens(system: str, msgs: list[dict[str, Any]]) -> int:
    """The request's size as the fake counts it: its text, 4 characters a token."""
    chars = len(system)
    for m in msgs:
        content = m.get("content")
        chars += len(_text(content))
        if isinstance(content, list):  # Anthropic blocks: tool_use input, tool_result content
            for b in content:
                if isinstance(b, dict) and b.get("type") == "tool_use":
                    chars += len(json.dumps(b.get("input")))
                elif isinstance(b, dict) and b.get("type") == "tool_result":
                    chars += len(_text(b.get("content")))
        for c in m.get("tool_calls") or []:
            chars += len(c["function"].get("arguments") or "")
    return chars // 4


def image_parts(body: dict[str, Any], kind: str) -> list[tuple[str, bytes]]:
    """The image parts of a request as the wire carries them: (media type, decoded bytes)."""
    out: list[tuple[str, bytes]] = []
    for m in body.get("messages", []):
        content = m.get("content")
        for part in content if isinstance(content, list) else []:
            if not isinstance(part, dict):
                continue
            if kind == "openai" and part.get("type") == "image_url":
                url = str((part.get("image_url") or {}).get("url", ""))
                head, _, data = url.partition(",")
                if head.startswith("data:") and head.endswith(";base64"):
                    out.append((head[5:-7], base64.b64decode(data)))
            elif kind == "anthropic" and part.get("type") == "image":
                src = part.get("source") or {}
                if src.get("type") == "base64":
                    out.append((str(src.get("media_type")), base64.b64decode(src.get("data", ""))))
    return out


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(_text(c) for c in content)
    if isinstance(content, dict):
        return str(content.get("text") or "")
    return ""


def _blocks_text(content: Any) -> list[str]:
    if isinstance(content, str):
        return [content]
    return [str(b.get("text", "")) for b in content or [] if isinstance(b, dict) and b.get("type") == "text"]


def _openai_unanswered(msgs: list[dict[str, Any]]) -> str | None:
    """OpenAI's rule: an assistant message with tool_calls must be followed by a tool message for
    each call id, before any other message."""
    waiting: set[str] = set()
    for i, m in enumerate(msgs):
        role = m.get("role")
        if role == "tool":
            if m.get("tool_call_id") not in waiting:
                return f"messages[{i}]: tool message for {m.get('tool_call_id')} answers no open tool call"
            waiting.discard(m["tool_call_id"])
            continue
        if waiting:
            return f"messages[{i}]: tool_call_ids {sorted(waiting)} did not have response messages"
        if role == "assistant":
            waiting = {c["id"] for c in m.get("tool_calls") or []}
    if waiting:
        return f"tool_call_ids {sorted(waiting)} did not have response messages"
    return None


def _anthropic_unanswered(msgs: list[dict[str, Any]]) -> str | None:
    """Anthropic's rule: each tool_use block must have a tool_result in the very next message."""
    for i, m in enumerate(msgs):
        if m.get("role") != "assistant" or isinstance(m.get("content"), str):
            continue
        uses = {b["id"] for b in m.get("content") or [] if b.get("type") == "tool_use"}
        if not uses:
            continue
        nxt = msgs[i + 1] if i + 1 < len(msgs) else None
        results = set()
        if nxt and nxt.get("role") == "user" and isinstance(nxt.get("content"), list):
            results = {b.get("tool_use_id") for b in nxt["content"] if b.get("type") == "tool_result"}
        if not uses <= results:
            return f"messages.{i}: tool_use ids {sorted(uses - results)} have no tool_result right after"
    return None
