"""``cox gc``: collect the versions stores now, by the retention policy (``[versions]``).

The versions service collects every ``gc_interval_s`` by itself; this asks it to collect at once
(one workspace, or every workspace under its root) and prints what it did as JSON. The operation
is one only NATS ``admin`` may send, so this reads admin's password from the credentials file
``cox up`` writes (``.cox/credentials.json``) and needs the NATS URL ``cox up`` printed
(``nats.started``) or ``NATS_URL``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path

import nats
import nats.errors

from coxswain import rpc
from coxswain.errors import CoxError
from coxswain.models import CollectRequest

from .creds import Credentials, nats_admin_url


def build_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("--workspace", default=None, help="collect only this workspace folder (default: all)")
    p.add_argument("--nats", default=None, metavar="URL", help="the NATS server (default: $NATS_URL)")
    p.add_argument("--credentials", default=".cox/credentials.json", metavar="FILE",
                   help="the file with the admin user's password (default .cox/credentials.json)")


def run(args: argparse.Namespace) -> int:
    url = args.nats or os.environ.get("NATS_URL") or os.environ.get("COX_NATS_URL")
    if not url:
        print("cox gc: say which NATS server (--nats URL or NATS_URL)", file=sys.stderr)
        return 2
    try:
        creds = Credentials.load(Path(args.credentials))
    except (OSError, ValueError, KeyError) as exc:
        print(f"cox gc: the credentials file is not usable: {exc}", file=sys.stderr)
        return 2
    workspace = str(Path(args.workspace).resolve()) if args.workspace else None
    try:
        result = asyncio.run(_collect(nats_admin_url(url, creds), workspace))
    except CoxError as exc:
        print(f"cox gc: {exc.code}: {exc.detail}", file=sys.stderr)
        return 1
    except (OSError, nats.errors.Error) as exc:
        print(f"cox gc: NATS is not reachable: {exc!r}", file=sys.stderr)
        return 1
    print(result)
    return 0


async def _collect(url: str, workspace: str | None) -> str:
    nc = await nats.connect(url, connect_timeout=5, max_reconnect_attempts=0)
    try:
        res = await rpc.call(nc, rpc.VERSIONS_COLLECT, CollectRequest(workspace=workspace))
    finally:
        await nc.close()
    return res.model_dump_json(indent=2)
