"""Workspace I/O: the tools on the workspace's files and commands, the folder walk, the command
sandbox (bubblewrap) with its resource limits and egress proxy, and the MCP tool servers."""
