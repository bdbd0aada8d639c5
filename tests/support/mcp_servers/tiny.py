"""A tiny MCP server for tests/stack/test_mcp.py, written with the official ``mcp`` package.

``python tiny.py`` serves stdio; ``python tiny.py http PORT`` serves streamable HTTP on
127.0.0.1:PORT (path ``/mcp``). Tools: ``echo`` (answers its text), ``slow`` (sleeps, then
answers), ``write`` (writes a file in its working folder, the workspace), ``die`` (the server
exits at once, as a crash would). ``TINY_START_DELAY`` (seconds) delays its start.
``TINY_FETCH=1`` adds ``fetch`` (GET a URL with urllib, which honours the proxy variables).
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from pathlib import Path

from mcp.server.mcpserver import MCPServer

server = MCPServer("tiny")


@server.tool()
def echo(text: str) -> str:
    """Answer with the text given."""
    return f"echo: {text}"


@server.tool()
async def slow(seconds: float) -> str:
    """Wait this many seconds, then answer."""
    await asyncio.sleep(seconds)
    return f"slept {seconds:g}s"


@server.tool()
def write(path: str, content: str) -> str:
    """Write content to a file (relative to the working folder)."""
    Path(path).write_text(content)
    return f"wrote {path} in {os.getcwd()}"


@server.tool()
def die() -> str:
    """Exit the server process at once."""
    os._exit(3)


if os.environ.get("TINY_FETCH"):
    @server.tool()
    def fetch(url: str) -> str:
        """GET a URL; answer the status and body, or the error with its body."""
        import urllib.error
        import urllib.request

        try:
            with urllib.request.urlopen(url, timeout=10) as r:
                return f"{r.status} {r.read(2000).decode(errors='replace')}"
        except urllib.error.HTTPError as e:
            return f"{e.code} {e.read(2000).decode(errors='replace')}"
        except OSError as e:
            return f"error {e}"


if __name__ == "__main__":
    # A slow start (seconds), for the tests of a start that takes too long or is stopped.
    time.sleep(float(os.environ.get("TINY_START_DELAY") or 0))
    if len(sys.argv) > 2 and sys.argv[1] == "http":
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
    else:
        server.run()
