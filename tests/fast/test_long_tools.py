"""Long turns, the workspace side, without a server: edit_file's exact replacement, find_files,
search_text (bounded, .gitignore respected, .git and the store never shown), read_file's paging,
guard's policy for the new tools, and reading AGENTS.md. Real files in a temporary folder."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from cox_guard import policy
from cox_runner import instructions
from cox_runner.workspace import tooldefs, tools, walk
from coxswain import textedit
from coxswain.config import ApprovalConfig, Settings
from coxswain.errors import Invalid
from coxswain.models import CallSpec, GuardRequest, GuardResult

# ---------------------------------------------------------------- edit_file


def test_an_edit_replaces_one_exact_occurrence() -> None:
    e = textedit.apply_edit("a = 1\nb = 2\nc = 3\n", "b = 2", "b = 20")
    assert e.ok and e.content == "a = 1\nb = 20\nc = 3\n" and e.count == 1 and e.lines == [2]
    assert e.summary("x.py") == "Edited x.py: replaced 1 occurrence (line 2)."


def test_an_edit_that_matches_several_times_says_how_many_and_where() -> None:
    text = "x = 1\ny = 2\nx = 1\n\nx = 1\n"
    e = textedit.apply_edit(text, "x = 1", "x = 9", path="f.py")
    assert not e.ok and e.content is None and e.count == 3 and e.lines == [1, 3, 5]
    assert e.error is not None and "3 times" in e.error and "lines 1, 3, 5" in e.error and "count=3" in e.error
    every = textedit.apply_edit(text, "x = 1", "x = 9", count=3)
    assert every.content == "x = 9\ny = 2\nx = 9\n\nx = 9\n" and every.summary("f").startswith("Edited f: replaced 3")
    wrong = textedit.apply_edit(text, "x = 1", "x = 9", count=2, path="f.py")
    assert not wrong.ok and wrong.error is not None and "3 times" in wrong.error and "not 2" in wrong.error


def test_an_edit_that_matches_nowhere_changes_nothing() -> None:
    e = textedit.apply_edit("def f():\n    return 1\n", "def f():\n  return 1", "x", path="m.py")
    assert not e.ok and e.count == 0 and e.error is not None and "not found in m.py" in e.error
    one = textedit.apply_edit("a\n", "a", "b", count=2)
    assert not one.ok and one.error is not None and "1 time " in one.error and "not 2" in one.error


def test_edits_that_mean_nothing_are_refused() -> None:
    assert textedit.apply_edit("abc", "", "x").error is not None
    assert textedit.apply_edit("abc", "b", "b").error is not None
    assert textedit.apply_edit("abc", "b", "c", count=0).error is not None


def test_occurrences_do_not_overlap() -> None:
    assert textedit.occurrences("aaaa", "aa") == [0, 2]
    assert textedit.apply_edit("aaaa", "aa", "b", count=2).content == "bb"
    assert textedit.apply_edit("aaa", "aa", "b").content == "ba"  # one non-overlapping occurrence


def test_an_edit_matches_windows_line_endings() -> None:
    e = textedit.apply_edit("one\r\ntwo\r\nthree\r\n", "one\ntwo", "1\n2")
    assert e.content == "1\r\n2\r\nthree\r\n"


def test_edit_bytes_refuses_what_it_cannot_edit_faithfully() -> None:
    assert "no file" in (textedit.edit_bytes(None, "a", "b", path="n.txt").error or "")
    assert "not UTF-8" in (textedit.edit_bytes(b"\xff\xfe a", "a", "b").error or "")
    big = b"a" * (textedit.MAX_EDIT_BYTES + 1)
    assert "larger than" in (textedit.edit_bytes(big, "a", "b").error or "")
    assert textedit.edit_bytes("é = 1\n".encode(), "1", "2").content == "é = 2\n"


def test_edit_file_reads_the_workspace_and_writes_nothing(tmp_path: Path) -> None:
    (tmp_path / "m.py").write_text("x = 1\n")
    e = tools.edit_file(tmp_path, "m.py", "x = 1", "x = 2")
    assert e.content == "x = 2\n"
    assert (tmp_path / "m.py").read_text() == "x = 1\n"
    assert not tools.edit_file(tmp_path, "missing.py", "a", "b").ok


# ---------------------------------------------------------------- find_files and search_text


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    files = {
        ".gitignore": "build/\n*.log\n!keep.log\nnode_modules/\n",
        "README.md": "hello world\n",
        "a.log": "ignored log with hello\n",
        "keep.log": "kept log with hello\n",
        "src/app.py": "def hello():\n    return 'hello'\n",
        "src/util/helpers.py": "HELLO = 1\nimport os\n",
        "src/.gitignore": "generated.py\n",
        "src/generated.py": "hello = 'generated'\n",
        "build/out.py": "hello = 'built'\n",
        "node_modules/pkg/index.js": "hello()\n",
        ".git/config": "hello = git\n",
        ".coxswain/v1": "hello from the store\n",
        ".env": "TOKEN=hello\n",
        "docs/guide.txt": "Hello\n",
    }
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    (tmp_path / "bin.dat").write_bytes(b"hello\0\x01\x02")
    outside = tmp_path.parent / f"{tmp_path.name}-outside"
    outside.mkdir(exist_ok=True)
    (outside / "secret.py").write_text("hello = 'outside'\n")
    (tmp_path / "link").symlink_to(outside)
    (tmp_path / "link.py").symlink_to(outside / "secret.py")
    return tmp_path


def test_find_files_respects_gitignore_and_never_shows_git_or_the_store(ws: Path) -> None:
    out = tools.find_files(ws, "*", 10_000).splitlines()
    assert "README.md" in out and "keep.log" in out and "src/app.py" in out and "src/util/helpers.py" in out
    for hidden in ("a.log", "build/out.py", "node_modules/pkg/index.js", "src/generated.py", ".git/config",
                   ".coxswain/v1", ".env", "link.py"):
        assert hidden not in out, hidden
    assert not any("outside" in line or line.startswith("link") for line in out)


def test_find_files_patterns(ws: Path) -> None:
    assert tools.find_files(ws, "*.py", 10_000).splitlines() == ["src/app.py", "src/util/helpers.py"]
    assert tools.find_files(ws, "**/*.py", 10_000).splitlines() == ["src/app.py", "src/util/helpers.py"]
    assert tools.find_files(ws, "src/*.py", 10_000).splitlines() == ["src/app.py"]
    assert tools.find_files(ws, "./src/**/h?lpers.py", 10_000).splitlines() == ["src/util/helpers.py"]
    assert tools.find_files(ws, "*.{md,txt}", 10_000).splitlines() == ["README.md", "docs/guide.txt"]
    assert tools.find_files(ws, "[Rk]*", 10_000).splitlines() == ["README.md", "keep.log"]
    assert tools.find_files(ws, "*.rs", 10_000).startswith("(no files match")
    assert tools.find_files(ws, "nope/*.py", 10_000).startswith("(no files match")
    for bad in ("", "/etc/*", "../*", "src/../../x"):
        with pytest.raises(ValueError):
            tools.find_files(ws, bad, 10_000)


def test_find_files_in_an_ignored_folder_named_on_purpose(ws: Path) -> None:
    assert tools.find_files(ws, "node_modules/**/*.js", 10_000).splitlines() == ["node_modules/pkg/index.js"]
    with pytest.raises(ValueError, match="never searched"):
        tools.find_files(ws, ".git/*", 10_000)


def test_find_files_is_bounded(tmp_path: Path) -> None:
    for i in range(30):
        (tmp_path / f"f{i:02}.txt").write_text("x")
    out = tools.find_files(tmp_path, "*.txt", 10_000, max_results=10).splitlines()
    assert out[:10] == [f"f{i:02}.txt" for i in range(10)] and out[10] == "[... 20 more files match; narrow the pattern]"
    assert len(out) == 11
    stopped = walk.walk(tmp_path, "", max_entries=5)
    assert stopped.truncated and len(stopped.files) == 5


def test_search_text_finds_lines_with_their_numbers(ws: Path) -> None:
    out = tools.search_text(ws, r"hello", "", 10_000).splitlines()
    assert out == ["README.md:1: hello world", "keep.log:1: kept log with hello",
                   "src/app.py:1: def hello():", "src/app.py:2:     return 'hello'"]
    assert tools.search_text(ws, r"(?i)^hello", "src", 10_000).splitlines() == ["src/util/helpers.py:1: HELLO = 1"]
    assert tools.search_text(ws, "os$", "src/util/helpers.py", 10_000) == "src/util/helpers.py:2: import os"
    assert tools.search_text(ws, "absent", "", 10_000) == "(no matches for 'absent' in .)"


def test_search_text_named_ignored_paths_are_searched_but_never_git_or_the_store(ws: Path) -> None:
    assert tools.search_text(ws, "hello", "build", 10_000) == "build/out.py:1: hello = 'built'"
    assert tools.search_text(ws, "hello", "a.log", 10_000) == "a.log:1: ignored log with hello"
    for never in (".git", ".git/config", ".coxswain", ".env"):
        with pytest.raises(ValueError, match="never searched"):
            tools.search_text(ws, "hello", never, 10_000)
    with pytest.raises(Invalid):
        tools.search_text(ws, "hello", "no-such-folder", 10_000)


def test_search_text_is_bounded(tmp_path: Path) -> None:
    (tmp_path / "many.txt").write_text("".join(f"match {i}\n" for i in range(50)))
    out = tools.search_text(tmp_path, "match", "", 10_000, max_matches=5).splitlines()
    assert out[:5] == [f"many.txt:{i + 1}: match {i}" for i in range(5)]
    assert out[5].startswith("[stopped at 5 matching lines") and len(out) == 6
    long_line = "a" * 5000 + "NEEDLE" + "b" * 5000
    (tmp_path / "many.txt").write_text(long_line + "\n")
    (line,) = tools.search_text(tmp_path, "NEEDLE", "", 10_000, max_line=100).splitlines()
    shown = line.split(": ", 1)[1]
    assert "NEEDLE" in shown and shown.startswith("...") and shown.endswith("...") and len(shown) == 106
    (tmp_path / "huge.txt").write_bytes(b"NEEDLE\n" * (tools.MAX_SEARCH_FILE_BYTES // 7 + 1))
    out2 = tools.search_text(tmp_path, "NEEDLE", "", 10_000)
    assert "huge.txt:" not in out2 and "1 file(s) over" in out2
    clipped = tools.search_text(tmp_path, "NEEDLE", "", 1024, max_line=5000)
    assert "more characters not shown" in clipped


def test_search_text_refuses_a_bad_regex(ws: Path) -> None:
    with pytest.raises(ValueError, match="invalid regular expression"):
        tools.search_text(ws, "(unclosed", "", 1000)


def test_search_text_skips_binary_files_and_links(ws: Path) -> None:
    out = tools.search_text(ws, "hello", "", 10_000)
    assert "bin.dat" not in out and "outside" not in out and "link" not in out


def test_gitignore_rules_deeper_files_and_negation(tmp_path: Path) -> None:
    (tmp_path / ".gitignore").write_text("*.tmp\n")
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / ".gitignore").write_text("!keep.tmp\n")
    for rel in ("x.tmp", "a/x.tmp", "a/keep.tmp"):
        (tmp_path / rel).write_text("t")
    assert walk.walk(tmp_path).files == [".gitignore", "a/.gitignore", "a/keep.tmp"]
    assert walk.ignored(tmp_path, "a/x.tmp", False) and not walk.ignored(tmp_path, "a/keep.tmp", False)


# ---------------------------------------------------------------- read_file paging


def test_read_file_without_paging_is_unchanged_when_it_fits(tmp_path: Path) -> None:
    (tmp_path / "s.txt").write_text("one\ntwo\n")
    assert tools.read_file(tmp_path, "s.txt", 1000) == "one\ntwo\n"


def test_read_file_pages_by_lines(tmp_path: Path) -> None:
    (tmp_path / "n.txt").write_text("".join(f"line {i}\n" for i in range(1, 101)))
    out = tools.read_file(tmp_path, "n.txt", 10_000, offset=10, lines=3)
    assert out == "[lines 10-12 of 100; read on with offset=13]\nline 10\nline 11\nline 12\n"
    tail = tools.read_file(tmp_path, "n.txt", 10_000, offset=99)
    assert tail == "[lines 99-100 of 100]\nline 99\nline 100\n"
    assert tools.read_file(tmp_path, "n.txt", 10_000, lines=1) == "[lines 1-1 of 100; read on with offset=2]\nline 1\n"
    with pytest.raises(ValueError, match=r"past the end: n\.txt has 100 lines"):
        tools.read_file(tmp_path, "n.txt", 10_000, offset=101)


def test_read_file_cuts_a_big_file_at_whole_lines_and_says_where(tmp_path: Path) -> None:
    (tmp_path / "big.txt").write_text("".join(f"{i:04}" + "x" * 95 + "\n" for i in range(1, 1001)))  # 100 chars a line
    out = tools.read_file(tmp_path, "big.txt", 2000)
    head, body = out.split("\n", 1)
    shown = body.splitlines()
    assert head == f"[lines 1-{len(shown)} of 1000; read on with offset={len(shown) + 1}]"
    assert 10 <= len(shown) <= 20 and len(out) <= 2000 and shown[-1].startswith(f"{len(shown):04}")
    (tmp_path / "one.txt").write_text("y" * 5000)
    one = tools.read_file(tmp_path, "one.txt", 1024)
    assert one.startswith("[lines 1-1 of 1]\n") and "more characters of this line" in one and len(one) < 1300


def test_read_file_argument_checks() -> None:
    assert tools.check_args("read_file", {"path": "a", "offset": 2, "limit": 10}) is None
    assert tools.check_args("read_file", {"path": "a", "offset": 0}) == "argument 'offset' must be at least 1"
    assert tools.check_args("read_file", {"path": "a", "limit": True}) == "argument 'limit' has the wrong type"
    assert tools.check_args("edit_file", {"path": "a", "old": "x", "new": "y", "count": 0}) is not None
    assert tools.check_args("edit_file", {"path": "a", "old": "x"}) == "missing argument 'new'"
    assert tools.check_args("search_text", {"pattern": "x", "path": 3}) == "argument 'path' has the wrong type"
    assert tools.check_args("find_files", {"pattern": "*.py"}) is None
    assert "edit_file" in tools.ACTIONS and not {"find_files", "search_text"} & tools.ACTIONS


def test_every_tool_schema_agrees_with_the_argument_specs() -> None:
    for t in tooldefs.TOOLS:
        schema = t.parameters_json_schema
        required = {k for k, _ in tools.REQUIRED[t.name]}
        optional = {k for k, _ in tools.OPTIONAL.get(t.name, ())}
        assert set(schema["required"]) == required, t.name
        assert set(schema["properties"]) == required | optional, t.name


# ---------------------------------------------------------------- guard


def _check(tmp_path: Path, name: str, args: dict[str, object], standing: list[str] | None = None,
           writes: str = "allow") -> GuardResult:
    (tmp_path / "ws").mkdir(exist_ok=True)
    settings = Settings(root=tmp_path, approval=ApprovalConfig(writes=writes))
    return policy.check(settings, GuardRequest(sid="s_1", workspace=str(tmp_path / "ws"),
                                               call=CallSpec(call_id="c", name=name, args=args),
                                               standing=standing or []))


def test_guard_allows_an_edit_with_its_preview(tmp_path: Path) -> None:
    (tmp_path / "ws").mkdir()
    (tmp_path / "ws" / "m.py").write_text("a = 1\nb = 2\n")
    g = _check(tmp_path, "edit_file", {"path": "m.py", "old": "b = 2", "new": "b = 3"})
    assert (g.verdict, g.actor, g.path, g.security) == ("allow", "setting", "m.py", False)
    assert g.preview is not None and g.preview["added"] == 1 and g.preview["removed"] == 1
    lines = [ln["text"] for h in g.preview["hunks"] for ln in h["lines"] if ln["op"] != " "]
    assert lines == ["b = 2", "b = 3"]
    assert (tmp_path / "ws" / "m.py").read_text() == "a = 1\nb = 2\n"


def test_guard_refuses_an_edit_that_does_not_apply(tmp_path: Path) -> None:
    (tmp_path / "ws").mkdir()
    (tmp_path / "ws" / "m.py").write_text("x\ny\nx\n")
    g = _check(tmp_path, "edit_file", {"path": "m.py", "old": "x", "new": "z"})
    assert g.verdict == "refuse" and "2 times" in g.reason and "lines 1, 3" in g.reason
    assert _check(tmp_path, "edit_file", {"path": "m.py", "old": "x", "new": "z", "count": 2}).verdict == "allow"
    assert _check(tmp_path, "edit_file", {"path": "gone.py", "old": "x", "new": "z"}).verdict == "refuse"


def test_guard_checks_an_edit_like_a_write(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    (ws / ".github" / "workflows").mkdir(parents=True)
    (ws / ".github" / "workflows" / "ci.yml").write_text("run: test\n")
    (ws / "conf.py").write_text("key = None\nother = 1\nAWS = 'AKIAIOSFODNN7EXAMPLE'\n")
    prot = _check(tmp_path, "edit_file", {"path": ".github/workflows/ci.yml", "old": "test", "new": "deploy"})
    assert (prot.verdict, prot.security) == ("ask", True) and "protected" in prot.reason and prot.preview
    cred = _check(tmp_path, "edit_file", {"path": "conf.py", "old": "key = None",
                                          "new": "key = 'AKIAIOSFODNN7EXAMPLF'"})
    assert (cred.verdict, cred.security) == ("ask", True) and "credential" in cred.reason
    # a credential already in the file, not in the new text, does not make an edit a security confirm
    plain = _check(tmp_path, "edit_file", {"path": "conf.py", "old": "other = 1", "new": "other = 2"})
    assert (plain.verdict, plain.security) == ("allow", False)
    asked = _check(tmp_path, "edit_file", {"path": "conf.py", "old": "other = 1", "new": "other = 2"}, writes="ask")
    assert (asked.verdict, asked.actor, asked.security) == ("ask", "setting", False)
    standing = _check(tmp_path, "edit_file", {"path": "conf.py", "old": "other = 1", "new": "other = 2"},
                      standing=["write:conf.py"], writes="ask")
    assert (standing.verdict, standing.actor) == ("allow", "standing")
    assert _check(tmp_path, "edit_file", {"path": "../x.py", "old": "a", "new": "b"}).verdict == "refuse"
    assert _check(tmp_path, "edit_file", {"path": ".env", "old": "a", "new": "b"}).verdict == "refuse"


def test_guard_allows_finding_and_searching_inside_the_workspace(tmp_path: Path) -> None:
    find = _check(tmp_path, "find_files", {"pattern": "**/*.py"})
    assert (find.verdict, find.path) == ("allow", "")
    search = _check(tmp_path, "search_text", {"pattern": "x", "path": "src"})
    assert (search.verdict, search.path) == ("allow", "src")
    assert _check(tmp_path, "search_text", {"pattern": "x"}).verdict == "allow"
    assert _check(tmp_path, "search_text", {"pattern": "x", "path": "../.."}).verdict == "refuse"
    assert _check(tmp_path, "search_text", {"pattern": "x", "path": ".ssh"}).verdict == "refuse"


# ---------------------------------------------------------------- AGENTS.md


def test_agents_md_is_read_bounded_with_its_hash(tmp_path: Path) -> None:
    import hashlib

    assert instructions.read_agents_md(tmp_path) is None
    (tmp_path / "AGENTS.md").write_text("Use tabs.\n")
    text, sha = instructions.read_agents_md(tmp_path) or ("", "")
    assert text == "Use tabs.\n" and sha == hashlib.sha256(b"Use tabs.\n").hexdigest()
    (tmp_path / "AGENTS.md").write_text("é" * 40)  # 80 bytes: a cut at 11 falls inside a character
    cut = instructions.read_agents_md(tmp_path, max_bytes=11)
    assert cut is not None and cut[0].startswith("é" * 5 + "\n[... AGENTS.md is longer than 11 bytes")
    assert "\ufffd" not in cut[0]


def test_agents_md_that_is_a_link_is_not_read(tmp_path: Path) -> None:
    (tmp_path / "elsewhere.md").write_text("secret")
    os.symlink(tmp_path / "elsewhere.md", tmp_path / "AGENTS.md")
    assert instructions.read_agents_md(tmp_path) is None
