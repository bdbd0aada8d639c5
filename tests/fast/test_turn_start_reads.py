"""What a turn start no longer reads: AGENTS.md when it is absent or unchanged, the hooks files
when there are none. Each shortcut says "nothing" only where a full read would have said it."""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from cox_runner import hooks, instructions
from coxswain.config import HooksConfig, Settings


def test_agents_md_is_read_again_only_when_it_changed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    reads: list[str] = []
    real = instructions.read_agents_md

    def counted(root: Path | str, max_bytes: int = instructions.MAX_BYTES) -> tuple[str, str] | None:
        reads.append(str(root))
        return real(root, max_bytes)

    monkeypatch.setattr(instructions, "read_agents_md", counted)
    ws = tmp_path / "ws"
    ws.mkdir()
    assert asyncio.run(instructions.agents_md(ws)) is None and reads == [], "absent: no read at all"
    f = ws / "AGENTS.md"
    f.write_text("be brief")
    old = time.time() - 10
    os.utime(f, (old, old))
    first = asyncio.run(instructions.agents_md(ws))
    assert first is not None and first[0] == "be brief" and len(reads) == 1
    assert asyncio.run(instructions.agents_md(ws)) == first and len(reads) == 1, "unchanged: not read again"
    f.write_text("be thorough")  # same size or not, a new mtime/ctime: read again
    again = asyncio.run(instructions.agents_md(ws))
    assert again is not None and again[0] == "be thorough" and len(reads) == 2
    # Changed just now (within the clock's granularity): read every time until it settles.
    assert asyncio.run(instructions.agents_md(ws)) == again and len(reads) == 3
    f.unlink()
    assert asyncio.run(instructions.agents_md(ws)) is None


def test_a_link_named_agents_md_is_never_read(tmp_path: Path) -> None:
    (tmp_path / "secret").write_text("host file")
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "AGENTS.md").symlink_to(tmp_path / "secret")
    assert asyncio.run(instructions.agents_md(ws)) is None
    assert asyncio.run(instructions.agents_md_hash(ws)) == ""


def _hooks(ws: Path, **cfg: object) -> hooks.Hooks:
    s = Settings(hooks=HooksConfig(**cfg))
    return hooks.Hooks(SimpleNamespace(settings=s), SimpleNamespace(workspace=ws), None, None)  # type: ignore[arg-type]


def test_no_hooks_file_is_known_without_a_read_and_anything_else_goes_to_the_full_load(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    assert _hooks(ws).nothing_to_load(), "no store folder"
    (ws / ".coxswain").mkdir()
    assert _hooks(ws).nothing_to_load(), "a store folder without hooks.json"
    assert _hooks(ws, enabled=False).nothing_to_load()
    assert not _hooks(ws, inline={"Stop": [{"hooks": [{"type": "command", "command": "true"}]}]}).nothing_to_load()
    (ws / ".coxswain" / "hooks.json").write_text(json.dumps({"hooks": {}}))
    assert not _hooks(ws).nothing_to_load(), "a hooks file: read and judged by load"
    assert _hooks(ws, workspace=False).nothing_to_load()
    # A store folder that is a link: load judges it (and refuses it), never the shortcut.
    linked = tmp_path / "linked"
    linked.mkdir()
    (linked / "elsewhere").mkdir()
    (linked / ".coxswain").symlink_to(linked / "elsewhere")
    assert not _hooks(linked).nothing_to_load()
