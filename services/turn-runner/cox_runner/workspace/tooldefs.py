"""The model's tools as pydantic-ai offers them to a model: name, description, JSON schema
(docs/api.md, "Tools the model has"; how they run is :mod:`cox_runner.workspace.tools`).

Apart from :mod:`~cox_runner.workspace.tools` because it imports pydantic-ai: a runner that has
run no turn holds none of it (``tests/fast/test_runner_footprint.py``).
"""

from __future__ import annotations

from typing import Any

from pydantic_ai.tools import ToolDefinition


def _obj(props: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {"type": "object", "properties": props, "required": required, "additionalProperties": False}


TOOLS: list[ToolDefinition] = [
    ToolDefinition(
        name="read_file",
        description="Read a text file in the workspace. For a big file give offset (the first line, from 1) "
                    "and limit (how many lines); the answer says which lines it shows and how many there are.",
        parameters_json_schema=_obj(
            {"path": {"type": "string"}, "offset": {"type": "integer", "minimum": 1},
             "limit": {"type": "integer", "minimum": 1}},
            ["path"],
        ),
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
        name="edit_file",
        description="Change part of a file in the workspace: replace the exact text old (whitespace and "
                    "indentation included) by new. old must occur exactly once; to replace several "
                    "occurrences give count, the exact number of them. The previous content is kept and "
                    "can be restored.",
        parameters_json_schema=_obj(
            {"path": {"type": "string"}, "old": {"type": "string"}, "new": {"type": "string"},
             "count": {"type": "integer", "minimum": 1}},
            ["path", "old", "new"],
        ),
    ),
    ToolDefinition(
        name="find_files",
        description="Find files in the workspace by glob pattern: '*.py' matches names at any depth; a "
                    "pattern with '/' matches paths from the workspace root ('src/**/*.ts', "
                    "'docs/*.{md,txt}'). Files ignored by .gitignore are left out.",
        parameters_json_schema=_obj({"pattern": {"type": "string"}}, ["pattern"]),
    ),
    ToolDefinition(
        name="search_text",
        description="Search the text of the files in the workspace (or in path, a folder or a file) for a "
                    "Python regular expression, line by line. Answers path:line: text for each matching line. "
                    "Files ignored by .gitignore and binary files are left out.",
        parameters_json_schema=_obj({"pattern": {"type": "string"}, "path": {"type": "string"}}, ["pattern"]),
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
        name="start_program",
        description="Start a long-running program (a dev server, a watcher, a REPL) in the sandbox, in the "
                    "workspace folder, and return its program_id at once; it keeps running after this turn. "
                    "Commands of this session reach it on the sandbox's own loopback (127.0.0.1). Read what "
                    "it writes with read_program, send it input with write_program, end it with stop_program. "
                    "pty: run it on a terminal (for REPLs and prompts). network: as for run_command.",
        parameters_json_schema=_obj(
            {"command": {"type": "string"}, "name": {"type": "string"}, "network": {"type": "boolean"},
             "pty": {"type": "boolean"}},
            ["command"],
        ),
    ),
    ToolDefinition(
        name="read_program",
        description="Read what a program wrote since the last read (or from byte offset since), and whether "
                    "it exited. wait_s: wait up to that many seconds for new output first.",
        parameters_json_schema=_obj(
            {"program_id": {"type": "string"}, "wait_s": {"type": "number", "minimum": 0, "maximum": 60},
             "since": {"type": "integer", "minimum": 0}},
            ["program_id"],
        ),
    ),
    ToolDefinition(
        name="write_program",
        description="Send text to a running program's input (end a line with \n). The person may be asked.",
        parameters_json_schema=_obj({"program_id": {"type": "string"}, "text": {"type": "string"}},
                                    ["program_id", "text"]),
    ),
    ToolDefinition(
        name="stop_program",
        description="Stop a running program (it and everything it started are killed).",
        parameters_json_schema=_obj({"program_id": {"type": "string"}}, ["program_id"]),
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
