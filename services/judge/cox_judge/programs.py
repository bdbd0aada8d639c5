"""The option tables of the programs the rules judge allows, and what makes each one not read-only.

GNU programs (coreutils 9.1, grep 3.8, sed 4.9, diffutils 3.8, file 5.44, util-linux 2.38) read
their options with ``getopt_long``: their tables here are every long option the program has
(coreutils' from its ``long_options[]`` at tag v9.1, hidden ones included; the others from their
``--help`` and the programs' own answers to every prefix), so the judge resolves an abbreviation to
the option the program would. ``tests/fast/test_judge_tables.py`` asks the installed programs, prefix by
prefix, that they agree. Git, find, jq, tree and rg are read with full spellings only.

In a table string (:func:`G`) each word is a long option: ``name`` (no value), ``name=`` (a value),
``name?`` (an optional ``=value``), with ``/k`` for the key it shares with its short option ``-k``
or another alias. ``bad`` maps keys to why that option is never read-only.
"""

from __future__ import annotations

from .options import NONE, OPTIONAL, REQUIRED, Spec


def G(short: str, long: str, bad: dict[str, str] | None = None, *, abbrev: bool = True,
      digits: bool = False) -> Spec:
    table: dict[str, tuple[int, str]] = {}
    for word in long.split():
        name, _, key = word.partition("/")
        arity = NONE
        if name.endswith("?"):
            name, arity = name[:-1], OPTIONAL
        elif name.endswith("="):
            name, arity = name[:-1], REQUIRED
        table[name] = (arity, key or name)
    return Spec(short, table, abbrev=abbrev, digits=digits, bad=bad or {})


RUNS = "runs another program"
WRITES = "writes a file"

GNU: dict[str, Spec] = {
    "ls": G("abcdfghiklmnopqrstuvw:xABCDFGHI:LNQRST:UXZ1", "all/a escape/b directory/d dired/D full-time group-directories-first human-readable/h inode/i kibibytes/k numeric-uid-gid/n no-group/G hide-control-chars/q reverse/r size/s width=/w almost-all/A ignore-backups/B classify?/F file-type si dereference-command-line/H dereference-command-line-symlink-to-dir hide= ignore=/I indicator-style= dereference/L literal/N quote-name/Q quoting-style= recursive/R format= show-control-chars sort= tabsize=/T time= time-style= zero color? hyperlink? block-size= context/Z author help version"),
    "cat": G("benstuvAET", "number-nonblank/b number/n squeeze-blank/s show-nonprinting/v show-ends/E show-tabs/T show-all/A help version"),
    "head": G("c:n:qvz0123456789", "bytes=/c lines=/n -presume-input-pipe quiet/q silent/q verbose/v zero-terminated/z help version"),
    "tail": G("c:n:fFqs:vz0123456789", "bytes=/c follow? lines=/n max-unchanged-stats= -disable-inotify pid= -presume-input-pipe quiet/q retry silent/q sleep-interval=/s verbose/v zero-terminated/z help version"),
    "wc": G("clLmw", "bytes/c chars/m lines/l words/w debug files0-from= max-line-length/L help version"),
    "stat": G("c:fLt", "dereference/L file-system/f format=/c printf= terse/t cached= help version"),
    "du": G("0abd:chHklmst:xB:DLPSX:", "all/a apparent-size block-size=/B bytes/b count-links/l dereference/L dereference-args/D exclude= exclude-from=/X files0-from= human-readable/h inodes si max-depth=/d null/0 no-dereference/P one-file-system/x separate-dirs/S summarize/s total/c threshold=/t time? time-style= help version"),
    "df": G("aB:iF:hHklmPTt:vx:", "all/a block-size=/B inodes/i human-readable/h si/H local/l output? portability/P print-type/T sync no-sync total type=/t exclude-type=/x help version"),
    "sort": G("-bcCdfghik:mMno:rRsS:t:T:uVy:z", "ignore-leading-blanks/b check? compress-program= debug dictionary-order/d ignore-case/f files0-from= general-numeric-sort/g ignore-nonprinting/i key=/k merge/m month-sort/M numeric-sort/n human-numeric-sort/h version-sort/V random-sort/R random-source= sort= output=/o reverse/r stable/s batch-size= buffer-size=/S field-separator=/t temporary-directory=/T unique/u zero-terminated/z parallel= help version",
              {"o": WRITES + " (--output)", "compress-program": RUNS + " (--compress-program)",
               "T": "writes temporary files into a folder it is given (--temporary-directory)"}),
    "uniq": G("-0123456789Dcdf:is:uw:z", "count/c repeated/d all-repeated?/D group? ignore-case/i unique/u skip-fields=/f skip-chars=/s check-chars=/w zero-terminated/z help version"),
    "cut": G("b:c:d:f:nsz", "bytes=/b characters=/c fields=/f delimiter=/d only-delimited/s output-delimiter= complement zero-terminated/z help version"),
    "tr": G("+AcCdst", "complement/c delete/d squeeze-repeats/s truncate-set1/t help version"),
    "date": G("d:f:I::r:Rs:u", "date=/d debug file=/f iso-8601?/I reference=/r resolution rfc-email/R rfc-822/R rfc-2822/R rfc-3339= set=/s uct/u utc/u universal/u help version",
              {"s": "sets the system clock (--set)"}),
    "id": G("agnruzGZ", "context/Z group/g groups/G name/n real/r user/u zero/z help version"),
    "uname": G("asnrvmpio", "all/a kernel-name/s sysname/s nodename/n kernel-release/r release/r kernel-version/v machine/m processor/p hardware-platform/i operating-system/o help version"),
    "basename": G("+as:z", "multiple/a suffix=/s zero/z help version"),
    "dirname": G("z", "zero/z help version"),
    "realpath": G("eLmPqsz", "canonicalize-existing/e canonicalize-missing/m relative-to= relative-base= quiet/q strip/s no-symlinks/s zero/z logical/L physical/P help version"),
    "readlink": G("efmnqsvz", "canonicalize/f canonicalize-existing/e canonicalize-missing/m no-newline/n quiet/q silent/s verbose/v zero/z help version"),
    "md5sum": G("bctwz", "check/c ignore-missing quiet status warn/w strict tag zero/z binary/b text/t help version"),
    "nl": G("h:b:f:v:i:pl:s:w:n:d:", "header-numbering=/h body-numbering=/b footer-numbering=/f starting-line-number=/v line-increment=/i no-renumber/p join-blank-lines=/l number-separator=/s number-width=/w number-format=/n section-delimiter=/d help version"),
    "comm": G("123z", "check-order nocheck-order output-delimiter= total zero-terminated/z help version"),
    "fold": G("bsw:0::1::2::3::4::5::6::7::8::9::", "bytes/b spaces/s width=/w help version"),
    "expand": G("it:0::1::2::3::4::5::6::7::8::9::", "tabs=/t initial/i help version"),
    "seq": G("+f:s:w", "equal-width/w format=/f separator=/s help version", digits=True),
    "sleep": G("", "help version"),
    "whoami": G("", "help version"),
    "grep": G("0123456789A:B:C:D:EFGHIPTUVX:abcd:e:f:hiLlm:noqRrsuvwxyZz", "basic-regexp/G extended-regexp/E fixed-regexp/F fixed-strings/F perl-regexp/P after-context=/A before-context=/B binary-files= byte-offset/b context=/C color? colour?/color count/c devices=/D directories=/d dereference-recursive/R exclude= exclude-from= exclude-dir= file=/f files-with-matches/l files-without-match/L group-separator= help include= ignore-case/i no-ignore-case initial-tab/T label= line-buffered line-number/n line-regexp/x max-count=/m no-filename/h no-group-separator no-messages/s null/Z null-data/z only-matching/o quiet/q recursive/r regexp=/e invert-match/v silent/q text/a binary/U unix-byte-offsets/u version/V with-filename/H word-regexp/w"),
    "sed": G("bsnrzuEe:f:l:i::", "binary/b regexp-extended/r debug in-place?/i expression=/e file=/f line-length=/l null-data/z zero-terminated/z quiet/n posix silent/n sandbox separate/s unbuffered/u version help follow-symlinks",
             {"i": "edits files in place (--in-place)", "f": "reads its script from a file (--file), which the judge cannot see"}),
    "diff": G("0123456789abBcC:dD:eEfF:hHiI:lL:nNpPqrsS:tTuU:vwW:x:X:yZ", "binary brief/q changed-group-format= color? context?/C ed/e exclude=/x exclude-from=/X expand-tabs/t forward-ed/f from-file= help horizon-lines= ifdef=/D ignore-all-space/w ignore-blank-lines/B ignore-case/i ignore-file-name-case ignore-matching-lines=/I ignore-space-change/b ignore-tab-expansion/E ignore-trailing-space/Z inhibit-hunk-merge initial-tab/T label=/L left-column line-format= minimal/d new-file/N new-group-format= new-line-format= no-dereference no-ignore-file-name-case normal old-group-format= old-line-format= paginate/l palette= rcs/n recursive/r report-identical-files/s sdiff-merge-assist show-c-function/p show-function-line=/F side-by-side/y speed-large-files starting-file=/S strip-trailing-cr suppress-blank-empty suppress-common-lines tabsize= text/a to-file= unchanged-group-format= unchanged-line-format= unidirectional-new-file/P unified?/U version/v width=/W",
              {"l": RUNS + " (--paginate runs pr)"}),
    "cmp": G("bci:ln:sv", "print-bytes/b print-chars/c ignore-initial=/i verbose/l bytes=/n silent/s quiet/s version/v help"),
    "file": G("bcCde:Ef:F:hiklLm:nNpP:rsSvzZ0", "apple brief/b checking-printout/c compile/C debug/d exclude=/e exclude-quiet= extension files-from=/f separator=/F help mime/i mime-type mime-encoding keep-going/k list/l dereference/L magic-file=/m no-dereference/h no-buffer/n no-pad/N preserve-date/p parameter=/P raw/r special-files/s no-sandbox/S uncompress/z uncompress-noreport/Z print0/0 version/v",
              {"C": WRITES + " (--compile)", "p": "sets files' access times (--preserve-date)",
               "S": "turns off its own system-call sandbox (--no-sandbox)",
               "z": RUNS + " to decompress (--uncompress)", "Z": RUNS + " to decompress (--uncompress-noreport)"}),
    "column": G("c:dE:eH:hi:JLl:N:n:O:o:p:R:r:s:T:tVW:x", "columns=/c output-width=/c table-noheadings/d table-noextreme=/E table-header-repeat/e table-hide=/H help/h tree-id=/i json/J keep-empty-lines/L table-empty-lines/L table-columns-limit=/l table-columns=/N table-name=/n table-order=/O output-separator=/o tree-parent=/p table-right=/R tree=/r separator=/s table-truncate=/T table/t version/V table-wrap=/W fillrows/x"),
    "rev": G("hV", "help/h version/V"),
    "which": G("as", "", abbrev=False),
}
for _sum in ("sha1sum", "sha224sum", "sha256sum", "sha384sum", "sha512sum"):
    GNU[_sum] = GNU["md5sum"]
GNU["b2sum"] = G("l:bctwz", "length=/l check/c ignore-missing quiet status warn/w strict tag zero/z binary/b text/t help version")
GNU["egrep"] = GNU["fgrep"] = GNU["grep"]

ANY_WORDS = frozenset({"echo", "printf", "true", "false", "test", "[", "pwd"})
"""Shell builtins whose words are all operands (text to print, an expression to test)."""

# ------------------------------------------------------------------------------------------ find

FIND_OPTIONS = frozenset({"-H", "-L", "-P"})
FIND_TESTS_0 = frozenset({
    "-depth", "-d", "-follow", "-xdev", "-mount", "-noleaf", "-ignore_readdir_race", "-noignore_readdir_race",
    "-daystart", "-warn", "-nowarn", "-empty", "-executable", "-readable", "-writable", "-nouser", "-nogroup",
    "-true", "-false", "-prune", "-quit", "-print", "-print0", "-ls", "-not", "!", "-a", "-and", "-o", "-or",
    "(", ")", ",", "-help", "--help", "-version", "--version",
})
FIND_TESTS_1 = frozenset({
    "-name", "-iname", "-path", "-ipath", "-wholename", "-iwholename", "-regex", "-iregex", "-lname", "-ilname",
    "-type", "-xtype", "-size", "-mtime", "-mmin", "-atime", "-amin", "-ctime", "-cmin", "-used", "-newer",
    "-anewer", "-cnewer", "-perm", "-user", "-group", "-uid", "-gid", "-links", "-inum", "-samefile",
    "-maxdepth", "-mindepth", "-regextype", "-fstype", "-printf", "-context", "-files0-from",
})
FIND_BAD = {"-exec": RUNS, "-execdir": RUNS, "-ok": RUNS, "-okdir": RUNS, "-delete": "deletes files",
            "-fprint": WRITES, "-fprint0": WRITES, "-fprintf": WRITES, "-fls": WRITES}

# -------------------------------------------------------------------------------------------- jq

JQ_FLAGS = frozenset({
    "-s", "--slurp", "-r", "--raw-output", "-j", "--join-output", "-a", "--ascii-output", "-C", "--color-output",
    "-M", "--monochrome-output", "-S", "--sort-keys", "-c", "--compact-output", "-n", "--null-input",
    "-R", "--raw-input", "-e", "--exit-status", "-f", "--from-file", "--tab", "--seq", "--stream",
    "--unbuffered", "--args", "--jsonargs", "-h", "--help", "-V", "--version",
})
JQ_VALUES = {"--indent": 1, "--arg": 2, "--argjson": 2, "--slurpfile": 2, "--rawfile": 2, "-L": 1}
"""jq reads its options by full spelling (short ones may cluster: ``-rc``); none writes or runs."""

# ------------------------------------------------------------------------------------ tree and rg

TREE = G("adlfxL:P:I:iqNQpugshDFvtcUrCnJXA", "noreport inodes device si du prune dirsfirst matchdirs gitignore "
         "ignore-case filelimit= charset= timefmt= sort= help version", abbrev=False)
"""tree reads long options by full spelling; ``-o`` writes, ``-R`` writes an index in every folder,
``-H`` makes HTML: none of them is in the table, so they go to the person."""
RG = G("nNiIlwFSsuvxoc0HhLzA:B:C:e:f:g:t:T:m:M:j:", "line-number no-line-number ignore-case smart-case "
       "case-sensitive files-with-matches files-without-match word-regexp fixed-strings hidden no-ignore "
       "invert-match line-regexp only-matching count count-matches null with-filename no-filename follow "
       "files type-list json no-heading heading vimgrep column no-messages trim glob= iglob= type= type-not= "
       "regexp= file= max-count= max-depth= max-columns= after-context= before-context= context= sort= "
       "sortr= color= colors= threads= search-zip pre= pre-glob= hostname-bin= help version",
       {"z": RUNS + " to decompress (--search-zip)", "search-zip": RUNS + " to decompress (--search-zip)",
        "pre": RUNS + " (--pre)", "pre-glob": RUNS + " (--pre-glob)", "hostname-bin": RUNS + " (--hostname-bin)"},
       abbrev=False)

# ------------------------------------------------------------------------------------------- git

GIT_GLOBAL = frozenset({"-P", "--no-pager", "--no-optional-locks", "--literal-pathspecs", "--no-replace-objects"})
"""The only options git may carry before its subcommand. Not ``-c``/``--config-env`` (set
``core.pager``, ``diff.external``, ... and so run programs), ``-C``/``--git-dir``/``--work-tree``
(another repository, whose config the judge cannot see), ``--exec-path``, ``-p``/``--paginate``."""

_DIFF = ("patch/p no-patch/s raw patch-with-raw patch-with-stat stat? numstat shortstat dirstat? summary "
         "name-only name-status compact-summary full-index binary color? no-color word-diff? color-words? "
         "color-moved? no-color-moved no-renames check text/a ignore-space-at-eol ignore-space-change/b "
         "ignore-all-space/w ignore-blank-lines ignore-cr-at-eol minimal patience histogram diff-algorithm= "
         "no-prefix src-prefix= dst-prefix= exit-code quiet no-ext-diff no-textconv function-context/W "
         "find-renames?/M find-copies?/C find-copies-harder break-rewrites?/B irreversible-delete/D pickaxe-all "
         "pickaxe-regex unified=/U relative? no-relative diff-filter= abbrev? no-abbrev ignore-submodules? "
         "submodule? inter-hunk-context=")
_REV = ("oneline graph all decorate? no-decorate abbrev-commit no-abbrev-commit format= pretty? max-count=/n skip= "
        "since= after= until= before= author= committer= grep= regexp-ignore-case/i all-match invert-grep "
        "extended-regexp/E fixed-strings/F basic-regexp perl-regexp merges no-merges first-parent reverse date= "
        "relative-date follow branches? tags? remotes? topo-order date-order author-date-order boundary "
        "left-right cherry-pick cherry-mark cherry ancestry-path simplify-by-decoration full-history no-walk? "
        "source parents children mailmap use-mailmap no-mailmap cc not walk-reflogs/g log-size notes? no-notes "
        "expand-tabs? no-expand-tabs")
_DIFF_SHORT = "pusRabwWM::C::B::DU::S:G:z"
_LOG_SHORT = _DIFF_SHORT + "n:imcEFg"
GIT_BAD = {"output": WRITES + " (--output)", "ext-diff": RUNS + " (--ext-diff)",
           "textconv": RUNS + " (--textconv)", "show-signature": RUNS + " (gpg, --show-signature)",
           "open-files-in-pager": RUNS + " (--open-files-in-pager, -O)", "filters": RUNS + " (--filters)"}
"""Named in every git table so that the option, or an abbreviation of it, says what it would do."""


def _git(short: str, long: str, bad_short: dict[str, str] | None = None) -> Spec:
    spec = G(short, long + " output= ext-diff textconv show-signature open-files-in-pager? filters",
             abbrev=False, digits=True)
    return Spec(spec.short, spec.long, abbrev=False, digits=True, bad={**GIT_BAD, **(bad_short or {})})


GIT: dict[str, Spec] = {
    "log": _git(_LOG_SHORT, _DIFF + " " + _REV),
    "show": _git(_LOG_SHORT, _DIFF + " " + _REV),
    "diff": _git(_DIFF_SHORT, _DIFF + " cached staged merge-base no-index"),
    "shortlog": _git("nsecw::", "numbered/n summary/s email/e committer/c format= group= " + _REV),
    "status": _git("sbvu::z", "short/s branch/b porcelain? long verbose/v untracked-files?/u ignored? "
                   "ignore-submodules? column? no-column ahead-behind no-ahead-behind renames no-renames "
                   "find-renames? show-stash"),
    "grep": _git("nilvwcLhHIEGFPaorqzWpe:f:A:B:C:m:", "line-number/n ignore-case/i invert-match/v word-regexp/w "
                 "files-with-matches/l name-only/l files-without-match/L count/c full-name extended-regexp/E "
                 "basic-regexp/G fixed-strings/F perl-regexp/P text/a only-matching/o recursive/r quiet/q "
                 "null/z function-context/W show-function/p cached no-index untracked exclude-standard "
                 "no-exclude-standard recurse-submodules no-textconv and or not all-match heading break "
                 "column color? no-color max-depth= threads= max-count=/m after-context=/A before-context=/B "
                 "context=/C", {"O": GIT_BAD["open-files-in-pager"]}),
    "rev-parse": _git("q", "show-toplevel abbrev-ref? short? verify quiet/q git-dir git-common-dir absolute-git-dir "
                      "is-inside-work-tree is-inside-git-dir is-bare-repository is-shallow-repository show-prefix "
                      "show-cdup symbolic symbolic-full-name show-object-format? path-format= all branches? "
                      "tags? remotes? sq"),
    "ls-files": _git("cdmoiskuvtfzx:X:", "cached/c deleted/d modified/m others/o ignored/i stage/s killed/k "
                     "unmerged/u directory no-empty-directory eol exclude=/x exclude-from=/X "
                     "exclude-per-directory= exclude-standard error-unmatch full-name recurse-submodules abbrev? "
                     "debug deduplicate format= sparse"),
    "ls-tree": _git("drtlz", "name-only name-status object-only full-name full-tree abbrev? format= long/l"),
    "cat-file": _git("tsepZ", "batch? batch-check? batch-all-objects buffer follow-symlinks unordered "
                     "allow-unknown-type use-mailmap mailmap no-mailmap"),
    "blame": _git("lstfnpwecM::C::L:", "root show-stats score-debug show-name show-number porcelain line-porcelain "
                  "incremental encoding= date= abbrev? minimal reverse first-parent color-lines color-by-age"),
    "describe": _git("", "all tags contains abbrev= candidates= exact-match debug long match= exclude= always "
                     "first-parent dirty? broken?"),
    "branch": _git("arvl", "all/a remotes/r verbose/v list/l show-current merged? no-merged? contains? "
                   "no-contains? points-at= sort= format= color? no-color column? no-column ignore-case omit-empty"),
    "tag": _git("ln::", "list/l contains? no-contains? merged? no-merged? points-at= sort= format= color? column? "
                "no-column ignore-case omit-empty"),
    "remote": _git("v", "verbose/v"),
}
GIT_LISTS = frozenset({"branch", "tag", "remote"})
"""Subcommands that create, rename or delete with an operand: read-only only when they list."""
