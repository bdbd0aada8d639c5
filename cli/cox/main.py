"""The ``cox`` command: ``cox up`` runs the whole system; ``cox chat`` is the terminal client;
``cox gc`` collects the versions stores now; ``cox run`` starts a run and streams it; ``cox sweep``
runs a file of tasks as runs (benchmarks) and writes their results; ``cox acp`` is coxswain as an
Agent Client Protocol agent on stdio, for editors.

Only the chosen command's module is imported: importing all six cost ~1.5 s of CPU at every start
(the ACP SDK's schema alone ~0.8 s, ``gc``'s RPC models ~0.5 s), paid by every ``cox run`` of a
script and every ``cox acp`` an editor starts."""

from __future__ import annotations

import argparse
import importlib
import sys

COMMANDS = {
    "up": "run NATS, Redis and every service in the foreground",
    "chat": "a full-screen terminal chat with a session (new, or SID)",
    "gc": "collect the versions stores now, by the [versions] retention policy",
    "run": "start a run (turns until done), stream it; exit 0 when it completes",
    "sweep": "run a JSONL file of tasks as unattended runs, resumably; write results",
    "acp": "an Agent Client Protocol agent on stdio (editors) over a running coxswain",
}
"""Each command: its module ``cox.<name>`` (with ``build_parser`` and ``run``) and its help line."""


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="cox", description="coxswain: a steerable coding-agent backend")
    sub = parser.add_subparsers(dest="command", required=True)
    # The command is the first word that is not an option (``cox`` itself takes only -h).
    chosen = next((a for a in argv if not a.startswith("-")), None)
    module = None
    for name, help_line in COMMANDS.items():
        p = sub.add_parser(name, help=help_line)
        if name == chosen:
            module = importlib.import_module(f"cox.{name}")
            module.build_parser(p)
    args = parser.parse_args(argv)
    if module is None:  # argparse has already refused an unknown command
        parser.error(f"unknown command {args.command}")
    code: int = module.run(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
