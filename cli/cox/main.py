"""The ``cox`` command: ``cox up`` runs the whole system; ``cox chat`` is the terminal client;
``cox gc`` collects the versions stores now; ``cox run`` starts a run and streams it; ``cox sweep``
runs a file of tasks as runs (benchmarks) and writes their results; ``cox acp`` is coxswain as an
Agent Client Protocol agent on stdio, for editors."""

from __future__ import annotations

import argparse
import sys

from . import acp, chat, gc, run, sweep, up


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="cox", description="coxswain: a steerable coding-agent backend")
    sub = parser.add_subparsers(dest="command", required=True)
    p_up = sub.add_parser("up", help="run NATS, Redis and every service in the foreground")
    up.build_parser(p_up)
    p_chat = sub.add_parser("chat", help="a full-screen terminal chat with a session (new, or SID)")
    chat.build_parser(p_chat)
    p_gc = sub.add_parser("gc", help="collect the versions stores now, by the [versions] retention policy")
    gc.build_parser(p_gc)
    p_run = sub.add_parser("run", help="start a run (turns until done), stream it; exit 0 when it completes")
    run.build_parser(p_run)
    p_sweep = sub.add_parser("sweep", help="run a JSONL file of tasks as unattended runs, resumably; write results")
    sweep.build_parser(p_sweep)
    p_acp = sub.add_parser("acp", help="an Agent Client Protocol agent on stdio (editors) over a running coxswain")
    acp.build_parser(p_acp)
    args = parser.parse_args(argv)
    if args.command == "up":
        return up.run(args)
    if args.command == "chat":
        return chat.run(args)
    if args.command == "gc":
        return gc.run(args)
    if args.command == "run":
        return run.run(args)
    if args.command == "acp":
        return acp.run(args)
    if args.command == "sweep":
        return sweep.run(args)
    parser.error(f"unknown command {args.command}")
    return 2


if __name__ == "__main__":
    sys.exit(main())
