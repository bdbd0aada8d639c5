"""Workspace I/O: the tools on the workspace's files and commands, the folder walk, the command
sandbox (bubblewrap) with its resource limits and egress proxy, and the MCP tool servers.

Layers, top to bottom (as in :mod:`cox_runner`):

1. Tools and tool servers
   - ``tools``: the model's tools: their arguments' check and how the workspace ones run.
   - ``tooldefs``: the tools' definitions as offered to the model (pydantic-ai's ``ToolDefinition``).
   - ``mcp_servers``: a session's MCP tool servers.
2. The sandbox
   - ``sandbox``: every command, hook and MCP stdio server inside bubblewrap: fail closed, the
     probe, the workspace handed to the sandbox user.
3. bubblewrap's command line
   - ``bwrap``: the mounts, namespaces and capabilities of a sandboxed process; what ``/etc`` hides.
4. Its leaves
   - ``egress``: the egress proxy, the only way a command granted the network reaches it.
   - ``limits``: resource limits per command (rlimits, cgroups).
   - ``walk``: walking a workspace for ``find_files`` and ``search_text``.
"""
