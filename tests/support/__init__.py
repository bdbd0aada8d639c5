"""What the tests share: whole stacks (``stack``), servers in containers (``containers``), the
check helpers, fake providers, MCP test servers (``mcp_servers/``). Nothing here is a test."""

from pathlib import Path

SUPPORT = Path(__file__).resolve().parent
ROOT = SUPPORT.parents[1]
"""The repository's root."""
ARTIFACTS = ROOT / "tests" / "artifacts"
"""Where tests leave what a person may want to look at (screenshots, transcripts); not in git."""
MCP_SERVERS = SUPPORT / "mcp_servers"
