"""The rules judge reads a command's options the way its program does (no server needed).

Issue 21, finding 2: the judge auto-allowed commands that run programs or write files through
abbreviations of long options (``sort --comp=sh``) and flags it never heard of (``git grep -O``).
Every command in :data:`RED_TEAM` was allowed by the judge before; each must now go to the person.
The rest tries variants per program: every prefix of every dangerous option, unknown options,
quoting, ``--``, git's global options, environment assignments, shell expansions.
"""

from __future__ import annotations

import pytest

from cox_judge import options, programs, rules
from cox_judge.options import Spec

RED_TEAM = [
    "git grep --no-index -O'touch /tmp/pwned' foo",   # runs the command as the pager
    "git grep --open-files-in-pager=sh foo",
    "sort --comp=sh f",                              # --compress-program: runs the lines as shell
    "sed --in-pl s/a/b/ f",                          # --in-place
    "sed --i s/a/b/ f",
    "sort --out=f g",                                # --output
    "git log --outp=f",                              # --output
    "git show --ext",                                # --ext-diff
    "git diff --textc",                              # --textconv
]

ORDINARY = [
    "git status", "git status -sb", "git status --porcelain=v1", "git log --oneline -5", "git log -n 3 --stat",
    "git log --format=%H --author alice -- src", "git log -p -1 HEAD~2", "git diff --stat", "git diff --cached -w",
    "git diff HEAD~1 -- a.py", "git log -- --output=x", "grep -- --output=x f", "git show HEAD:README.md", "git show --stat --no-ext-diff HEAD",
    "git blame -L 1,5 f", "git rev-parse --show-toplevel", "git rev-parse --abbrev-ref HEAD", "git ls-files -z",
    "git ls-tree -r HEAD", "git cat-file -p HEAD", "git grep -n foo -- '*.py'", "git grep -in -e foo",
    "git branch -a", "git branch --list 'feat*'", "git tag -l 'v*'", "git remote -v", "git describe --tags",
    "git shortlog -sn", "git -P log -1", "git --no-pager diff", "git --version", "git log @{u}",
    "ls -la", "ls -lah --color=never src", "ls --almost", "ls *", "cat f", "cat -A f", "cat *.py",
    "grep -rn foo .", "grep -E 'a|b' f", "grep --ignore-c foo f", "grep -e foo -e bar f", "grep foo *", "egrep x f",
    "sort f", "sort -k2,2n -t, f", "sort -rn f | uniq -c", "sort --numeric f", "sort -- --output=x",
    "sed -n 1,10p f", "sed -n '$p' f", "sed 's/a/b/g' f", "sed -E 's/(a)/\\1/' f", "sed -e 1d -e 's|a|b|' f",
    "sed --expression=5q f", "sed -n -- p f",
    "head -n 5 f", "head -5 f", "head -n -5 f", "tail -n +3 f", "tail -f log", "wc -l", "wc -l < f",
    "find . -name '*.py' -type f", "find . -maxdepth 2 -type d -not -path './.git/*'", "find -L . -newer f -print0",
    "jq -r .a f", "jq -rc --arg a b '.[$a]' f", "diff -u a b", "cmp a b", "file f", "file --mime-type f",
    "stat -c %s f", "du -sh .", "df -h", "cut -d, -f1 f", "tr a-z A-Z < f", "date +%F", "date -u -d yesterday +%s",
    "uniq -c f", "uniq -f 1 f", "nl f", "comm -12 a b", "fold -w 80 f", "expand -t 4 f", "seq 1 10", "seq -5 5",
    "column -t f", "rev f", "basename a/b.c .c", "dirname a/b", "realpath .", "readlink -f x", "md5sum f",
    "sha256sum -c sums", "id -u", "uname -a", "whoami", "which git", "pwd", "true", "echo $HOME", "printf '%s\\n' a",
    "test -f x && echo yes", "[ -d x ]", "sleep 1", "python3 --version", "/usr/bin/sort f", "tree -L 2",
    "rg -n foo", "cat <<EOF\nhi $HOME\nEOF", "ls 2>/dev/null", "ls 2>&1 | head",
]


@pytest.mark.parametrize("command", RED_TEAM)
def test_the_red_team_table_goes_to_the_person(command: str) -> None:
    v = rules.judge(command)
    assert not v.ok, v.reason


@pytest.mark.parametrize("command", ORDINARY)
def test_ordinary_read_only_commands_stay_allowed(command: str) -> None:
    v = rules.judge(command)
    assert v.ok, v.reason


def _bad_longs() -> list[tuple[str, Spec, str]]:
    """(program, its table, a dangerous long option) for every dangerous long option of every table."""
    tables = [*programs.GNU.items(), *((f"git {sub}", s) for sub, s in programs.GIT.items()), ("rg", programs.RG)]
    return [(prog, spec, name) for prog, spec in tables for name, (_, key) in spec.long.items() if key in spec.bad]


@pytest.mark.parametrize(("prog", "spec", "name"), _bad_longs(), ids=lambda v: v if isinstance(v, str) else "")
def test_every_abbreviation_of_a_dangerous_option_goes_to_the_person(prog: str, spec: Spec, name: str) -> None:
    takes = spec.long[name][0] != options.NONE
    # A prefix that is itself another option's full name is that option (the exact name wins).
    prefixes = [name[:n] for n in range(1, len(name) + 1)
                if name[:n] == name or spec.long.get(name[:n], (0, spec.long[name][1]))[1] in spec.bad]
    allowed = [f"{prog} {word} f" for p in prefixes for word in [f"--{p}", *([f"--{p}=x", f"--{p} x"] if takes else [])]
               if rules.judge(f"{prog} {word} f").ok]
    assert allowed == []


@pytest.mark.parametrize("prog", sorted(rules.READ_ONLY - programs.ANY_WORDS - {"python", "python3"}))
def test_every_program_sends_an_unknown_option_to_the_person(prog: str) -> None:
    for word in ("--no-such-option-at-all", "-\u00e9"):
        v = rules.judge(f"{prog} {word} f")
        assert not v.ok and any(w in v.reason for w in ("unknown", "not a test", "before the subcommand")), \
            (word, v.reason)
    spec = programs.GNU.get(prog)
    if spec is not None:
        unknown = next(c for c in "jJkKqQyYoOgG%" if c not in spec.short_arity())
        assert not rules.judge(f"{prog} -{unknown} f").ok


@pytest.mark.parametrize("sub", sorted(programs.GIT))
def test_every_git_subcommand_sends_unknown_and_abbreviated_options_to_the_person(sub: str) -> None:
    assert not rules.judge(f"git {sub} --no-such-option").ok
    full = next(n for n in sorted(programs.GIT[sub].long, key=len, reverse=True) if n not in programs.GIT_BAD)
    assert not rules.judge(f"git {sub} --{full[:-1]}").ok, "git's parse-options takes prefixes; the judge none"


@pytest.mark.parametrize("command", [
    # quoting, values, attached and detached forms
    "git show --'ext-diff'", 'git show "--ext-diff"', "git show --ext\\-diff", "git diff --ext-diff=x",
    "git grep -O cmd foo", "git grep -Ocmd foo", "git grep -nO foo", "git grep --open foo", "git grep --o foo",
    "git log --output x", "git log --textconv", "git log --show-signature", "git cat-file --textconv HEAD:f",
    "git cat-file --filters HEAD:f", "git log --author --output=x", "sort -o f g", "sort -of g", "sort -rno f g",
    "sort --output f g", "sort --compress-program sh f", "sort -T /tmp f", "sort --temporary-directory=/tmp f",
    "sort --t=/tmp f", "sort --key --output=x f", "sort f -o out", "sed s/a/b/ f -i", "ls\nsort -o x f",
    "sort --ou''tput=f g", "sort '--output'=f g", "sort -\\o f g", "git -P -c x=y log", "git log --end-of-options -p",
    # sed: in place, script files, and scripts that write, run or read
    "sed -i s/a/b/ f", "sed -i.bak s/a/b/ f", "sed -ni p f", "sed -n -i p f", "sed --in-place=.b s/a/b/ f",
    "sed -f s.sed f", "sed --fi=s.sed f", "sed -n 's/a/b/w out' f", "sed 'e id' f", "sed '1r /etc/passwd' f",
    "sed 'W x' f", "sed -e p -e 'w x' f", "sed --expression='w x' f", "sed --ex='w x' f", "sed -- 'w x' f",
    "sed '1{p}' f", "sed 's/a/b/e' f", "sed -n 'p;w x' f", "sed $'p\\nw x' f", "sed 'p\nw x' f",
    # git before its subcommand, aliases, writers
    "git -p log", "git --paginate log", "git -c core.pager=sh log", "git -ccore.pager=sh log",
    "git --config-env=core.pager=X log", "git --exec-path=/x log", "git --git-dir=x log", "git --work-tree=x status",
    "git -C x log", "git l", "git", "git branch -D x", "git branch -m a b", "git branch x", "git branch -l x",
    "git tag v1", "git branch --contains x y", "git tag -d v1", "git remote add x y", "git remote show origin", "git commit -m x",
    "git status --porc", "git log --onel",
    # find's actions
    "find . -exec rm {} +", "find . -execdir id \\;", "find . -ok rm {} \\;", "find . -okdir rm {} \\;",
    "find . -delete", "find -L . -delete", "find . -name x -o -delete", "find . -fprint out", "find . -fprint0 o",
    "find . -fprintf o %p", "find . -fls o", "find . -frobnicate", "find . -name -delete",
    # other writers and runners
    "date -s 2020-01-01", "date --set=now", "date --se=now", "date 0101", "file -C -m x", "file --comp -m x",
    "file -z f", "file --unc f", "file -p f", "file --no-s f", "diff -l a b", "diff --pag a b", "uniq a b",
    "rg --pre=sh x", "rg --pre sh x", "rg -z x", "rg --search-zip x", "rg --hostname-bin=x x", "rg --pr=sh x",
    "tree -o f", "tree -R", "python3 -c 'print(1)'", "python x.py", "jq --frob . f",
    # programs that run programs, are not known read-only, or are not the system's
    "less f", "more f", "xargs rm", "env ls", "nice ls", "timeout 5 ls", "awk '{print}' f", "perl -e 1",
    "tee f", "./sort f", "bin/ls", "/tmp/ls", "/usr/bin/../../tmp/ls", "//usr/bin/ls", "sed -V x f",
    # environment assignments before a command
    "GIT_EXTERNAL_DIFF=x git diff", "PAGER=x git log", "GIT_PAGER=x git log", "LESSOPEN='|x %s' cat f",
    "LD_PRELOAD=x ls",
    # what the shell expands or writes
    "ls > f", "ls >> f", "cat <> f", "ls &> f", "ls $(id)", "ls `id`", 'ls "$(id)"', "cat <(id)", "ls >(cat)",
    "echo ${X:-$(id)}", 'echo "${X:-`id`}"', "cat <<< $(id)", "cat < `id`", "cat <<EOF\n$(id)\nEOF",
    "cat < /dev/tcp/127.0.0.1/80", "echo --output=x; sort $_", 'echo x; sort "$_"', "sort $X f",
    "sort $'\\x2d\\x2doutput=x' f", "sort *", "sort [-]*", "uniq *", "sed -n p *", "find . -name *.py",
    "git diff *", "sort {--output=f,x}", "sort --{o,}utput=f", "ls &", "(ls)", "if true; then ls; fi",
    "f() { ls; }", "X=1 ls",
])
def test_variants_go_to_the_person(command: str) -> None:
    v = rules.judge(command)
    assert not v.ok, v.reason


@pytest.mark.parametrize(("command", "said"), [
    ("sort --comp=sh f", "--compress-program"),
    ("git show --ext", "--ext abbreviates --ext-diff"),
    ("git grep -Ocmd foo", "--open-files-in-pager"),
    ("sed --s -n p f", "ambiguous"),
    ("sed --in-pl s/a/b/ f", "in place"),
    ("echo x; sort $_", "$_"),
    ("git -c core.pager=sh log", "before the subcommand"),
])
def test_the_reason_names_what_the_option_is(command: str, said: str) -> None:
    assert said in rules.judge(command).reason


def test_getopt_matching_is_glibcs() -> None:
    sort = programs.GNU["sort"]
    assert options.resolve(sort, "comp") == ("compress-program", options.REQUIRED)
    assert options.resolve(sort, "check") == ("check", options.OPTIONAL), "an exact name wins"
    assert isinstance(options.resolve(sort, "s"), options.Refusal), "--s: sort, stable"
    head = programs.GNU["head"]
    assert options.resolve(head, "q") == ("q", options.NONE) and options.resolve(head, "si") == ("q", options.NONE)
    grep = programs.GNU["grep"]
    assert options.resolve(grep, "col") == ("color", options.OPTIONAL), "--color and --colour are one option"
    parsed = options.parse(sort, ["-rnk2", "-t,", "--", "-o", "x"])
    assert isinstance(parsed, options.Parsed)
    assert [(o.key, o.value) for o in parsed.options] == [("r", None), ("n", None), ("k", "2"), ("t", ",")]
    assert parsed.operands == ["-o", "x"], "after -- every word is an operand"
    sed = options.parse(programs.GNU["sed"], ["-ni.bak", "p"])
    assert isinstance(sed, options.Parsed) and [(o.key, o.value) for o in sed.options] == [("n", None), ("i", ".bak")]
