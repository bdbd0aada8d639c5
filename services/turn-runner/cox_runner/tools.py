"""The tools the model has (API.md): their definitions and how the workspace ones run.

Policy is not decided here (that is guard's, via ``gate``); these functions do the I/O once a
call is allowed, through :mod:`coxswain.safefs` so every path is opened beneath the workspace.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic_ai.tools import ToolDefinition

from coxswain import safefs
from coxswain.proc import die_with_parent

from .sandbox import Sandbox


def _obj(props: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {"type": "object", "properties": props, "required": required, "additionalProperties": False}


TOOLS: list[ToolDefinition] = [
    ToolDefinition(
        name="read_file", description="Read a text file in the workspace.",
        parameters_json_schema=_obj({"path": {"type": "string"}}, ["path"]),
    ),
    ToolDefinition(
        name="list_dir", description="List a folder in the workspace ('.' for the root).",
        parameters_json_schema=_obj({"path": {"type": "string"}}, ["path"]),
    ),
    ToolDefinition(
        name="write_file",
        description="Create or replace a file in the workspace with the given content. "
                    "The previous content is kept and can be restored.",
        parameters_json_schema=_obj({"path": {"type": "string"}, "content": {"type": "string"}}, ["path", "content"]),
    ),
    ToolDefinition(
        name="run_command",
        description="Run a shell command in the workspace folder and return its output. It runs in a "
                    "sandbox that sees only the workspace (and the system, read-only), without network. "
                    "Set network to true only when the command needs the network (downloads, "
                    "package installs): the person is asked to allow it.",
        parameters_json_schema=_obj(
            {"command": {"type": "string"}, "timeout_s": {"type": "number", "minimum": 1, "maximum": 3600},
             "network": {"type": "boolean"}},
            ["command"],
        ),
    ),
    ToolDefinition(
        name="respond",
        description="Say something to the person (answer a question, report progress) without ending the turn.",
        parameters_json_schema=_obj({"text": {"type": "string"}}, ["text"]),
    ),
    ToolDefinition(
        name="plan_write", description="Write (or rewrite) the plan for this task as numbered steps.",
        parameters_json_schema=_obj({"steps": {"type": "array", "items": {"type": "string"}, "minItems": 1}}, ["steps"]),
    ),
    ToolDefinition(
        name="plan_step", description="Mark a plan step (numbered from 1) as done.",
        parameters_json_schema=_obj({"step": {"type": "integer", "minimum": 1}}, ["step"]),
    ),
]
TOOL_NAMES = frozenset(t.name for t in TOOLS)
REQUIRED: dict[str, tuple[tuple[str, type | tuple[type, ...]], ...]] = {
    "read_file": (("path", str),),
    "list_dir": (("path", str),),
    "write_file": (("path", str), ("content", str)),
    "run_command": (("command", str),),
    "respond": (("text", str),),
    "plan_write": (("steps", list),),
    "plan_step": (("step", int),),
}
OPTIONAL: dict[str, tuple[tuple[str, type | tuple[type, ...]], ...]] = {
    "run_command": (("timeout_s", (int, float)), ("network", bool)),
}
ACTIONS = frozenset({"write_file", "run_command"})


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
    return None


def clip(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return text[:limit] + f"\n[... {len(text) - limit} more characters not shown]"


def read_file(root: Path, rel: str, limit: int) -> str:
    data = safefs.read(root, rel, max_bytes=limit + 1)
    if data is None:
        raise FileNotFoundError(f"no file {rel!r}")
    text = data.decode("utf-8", errors="replace")
    return clip(text, limit)


def list_dir(root: Path, rel: str) -> str:
    entries = safefs.listdir(root, rel)
    lines = [f"{e.name}/" if e.kind == "dir" else f"{e.name} -> (link)" if e.kind == "link"
             else f"{e.name}  ({e.size} bytes)" for e in entries]
    return "\n".join(lines) if lines else "(empty folder)"


SAFE_ENV_KEYS = ("PATH", "LANG", "LC_ALL", "TZ", "TMPDIR")


def command_env(workspace: Path) -> dict[str, str]:
    """A scrubbed environment: no keys or tokens of the runner leak into the model's commands."""
    env = {k: os.environ[k] for k in SAFE_ENV_KEYS if k in os.environ}
    env.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin")
    env.update(HOME=str(workspace), TERM="dumb", PWD=str(workspace), GIT_TERMINAL_PROMPT="0")
    return env


@dataclass
class CommandResult:
    exit_code: int | None
    output: str
    timed_out: bool = False
    cancelled: bool = False


async def run_command(workspace: Path, command: str, timeout_s: float, limit: int, sandbox: Sandbox,
                      network: bool = False) -> CommandResult:
    """Run ``command`` with bash in the sandbox, in its own process group; cancel kills the whole
    group. Raises :class:`~cox_runner.errors.SandboxUnavailable` (nothing runs) when the sandbox
    cannot start."""
    await sandbox.ready()
    argv = sandbox.argv(workspace, command, network)
    proc = await asyncio.create_subprocess_exec(
        *argv, cwd=str(workspace), stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT, start_new_session=True,
        env=command_env(workspace), preexec_fn=die_with_parent,
    )
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
    try:
        await asyncio.wait_for(asyncio.shield(asyncio.gather(reader, proc.wait())), timeout=timeout_s)
        timed_out = False
    except TimeoutError:
        timed_out = True
        await _kill(proc)
    except asyncio.CancelledError:
        await _kill(proc)
        reader.cancel()
        with contextlib.suppress(BaseException):
            await reader
        raise
    with contextlib.suppress(BaseException):
        await asyncio.wait_for(reader, 2)
    text = b"".join(chunks).decode("utf-8", errors="replace")
    if size > len(text):
        text += f"\n[... {size - len(text)} more bytes of output]"
    text = clip(text, limit)
    code = proc.returncode
    if timed_out:
        text += f"\n[timed out after {timeout_s:g}s; the command was killed]"
    return CommandResult(exit_code=code, output=text, timed_out=timed_out)


async def _kill(proc: asyncio.subprocess.Process) -> None:
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
