"""A runner that has run no turn holds no turn machinery (#23: idle RSS ≤ 60 MB, a start in a second).

pydantic-ai and what builds on it (the loop, the transcript, the tools' definitions, the script
model) are ~35 MB of a fresh runner's ~95 MB and most of its import time. A runner serves a
person's actions (create, send's admission, Stop, the log) without them, and imports them off the
event loop when its first drive starts (``drive.load_turns``): imported on the loop, an import that
takes seconds on a loaded machine would hold the lease renewals of every drive it holds.

Each check runs in a fresh interpreter: this pytest process has imported everything already.
"""

from __future__ import annotations

import subprocess
import sys

from tests.support.offloop import imports_off_the_loop

HEAVY = ("pydantic_ai", "pydantic_graph", "griffe", "genai_prices", "mcp", "openai", "anthropic", "rich", "pygments")

IDLE = f"""
import sys
import cox_runner.service
heavy = sorted({{m.split(".")[0] for m in sys.modules}} & set({HEAVY!r}))
print(",".join(heavy))
"""

def _run(code: str) -> str:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout.strip()


def test_an_idle_runner_imports_no_agent_framework_model_sdk_mcp_or_console_renderer() -> None:
    assert _run(IDLE) == "", "imported by `import cox_runner.service`"


def test_the_turn_machinery_is_imported_off_the_event_loop() -> None:
    imports_off_the_loop("from cox_runner import drive", "drive.load_turns()", ("pydantic_ai",), "cox_runner.loop")


def test_the_tool_names_are_the_definitions_names() -> None:
    """The argument check's names (no pydantic-ai) and the definitions offered to the model agree."""
    from cox_runner.workspace import tooldefs, tools

    assert tools.TOOL_NAMES == {t.name for t in tooldefs.TOOLS}
    assert set(tools.OPTIONAL) <= tools.TOOL_NAMES and set(tools.AT_LEAST_ONE) <= tools.TOOL_NAMES
