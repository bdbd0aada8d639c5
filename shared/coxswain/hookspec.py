"""Hooks in the Claude Code ``hooks.json`` shape (docs/api.md, "Hooks"): what a hooks file holds.

    {"hooks": {"PreToolUse": [{"matcher": "run_command|write_file",
                               "hooks": [{"type": "command", "command": "...", "timeout": 30}]}],
               "PostToolUse": [...], "UserPromptSubmit": [...], "Stop": [...], "PreCompact": [...]}}

A matcher is a regular expression matched against the whole tool name (``run_command``, an MCP
tool's ``server__tool``); ``*`` or an empty matcher matches every tool. Events without a tool
(``UserPromptSubmit``, ``Stop``, ``PreCompact``) ignore it. Only ``command`` hooks exist. An
unknown event name or field is refused: a hook that is silently not run is worse than none.
"""

from __future__ import annotations

import json
import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

HookEventName = Literal["PreToolUse", "PostToolUse", "UserPromptSubmit", "Stop", "PreCompact"]
HOOK_EVENTS: tuple[str, ...] = ("PreToolUse", "PostToolUse", "UserPromptSubmit", "Stop", "PreCompact")
TOOL_EVENTS = frozenset({"PreToolUse", "PostToolUse"})
MAX_FILE_BYTES = 256 * 1024


class HookCommand(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: Literal["command"] = "command"
    command: str = Field(min_length=1, max_length=8192)
    timeout: float | None = Field(None, gt=0, le=3600)
    """Seconds before the hook is killed (and fails closed); else ``[hooks] timeout_s``."""


class HookMatcher(BaseModel):
    model_config = ConfigDict(extra="forbid")

    matcher: str = ""
    hooks: list[HookCommand] = Field(default_factory=list)

    @field_validator("matcher")
    @classmethod
    def _regex(cls, v: str) -> str:
        if v not in ("", "*"):
            try:
                re.compile(v)
            except re.error as exc:
                raise ValueError(f"the matcher {v!r} is not a regular expression: {exc}") from exc
        return v

    def matches(self, tool: str | None) -> bool:
        """Whether this matcher's hooks run for ``tool`` (None: an event without a tool)."""
        if tool is None or self.matcher in ("", "*"):
            return True
        return re.fullmatch(self.matcher, tool) is not None


class HooksSpec(BaseModel):
    """The ``hooks`` object: event name -> matchers."""

    model_config = ConfigDict(extra="forbid")

    PreToolUse: list[HookMatcher] = Field(default_factory=list)
    PostToolUse: list[HookMatcher] = Field(default_factory=list)
    UserPromptSubmit: list[HookMatcher] = Field(default_factory=list)
    Stop: list[HookMatcher] = Field(default_factory=list)
    PreCompact: list[HookMatcher] = Field(default_factory=list)

    def of(self, event: str) -> list[HookMatcher]:
        matchers: list[HookMatcher] = getattr(self, event)
        return matchers

    def merged(self, other: HooksSpec) -> HooksSpec:
        return HooksSpec(**{e: [*self.of(e), *other.of(e)] for e in HOOK_EVENTS})

    def empty(self) -> bool:
        return not any(m.hooks for e in HOOK_EVENTS for m in self.of(e))


class HooksFile(BaseModel):
    """A whole ``hooks.json`` (other top-level keys, as in a Claude settings file, are ignored)."""

    model_config = ConfigDict(extra="ignore")

    hooks: HooksSpec = Field(default_factory=HooksSpec)


class BadHooks(ValueError):
    """A hooks file that cannot be read as one: the message says where and why."""


def parse(raw: bytes | str, where: str) -> HooksSpec:
    """The hooks of a ``hooks.json`` text; raises :class:`BadHooks` naming ``where``."""
    if len(raw) > MAX_FILE_BYTES:
        raise BadHooks(f"{where} is larger than {MAX_FILE_BYTES} bytes")
    try:
        data = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadHooks(f"{where} is not JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise BadHooks(f"{where} must hold a JSON object with a \"hooks\" object")
    try:
        return HooksFile.model_validate(data).hooks
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()[:5])
        raise BadHooks(f"{where} is not a valid hooks file: {problems}") from exc
