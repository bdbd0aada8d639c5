"""Peers, side by side: the same load against coxswain and against a system a user would pick instead.

- ``base.py``: what every peer shares: its own venv and server process, the queue and interrupt
  loads over a small :class:`~bench.peer.base.Driver`, the figures and the report's rows.
- ``ours.py``: coxswain's side, measured once per bench run whatever the peers.
- ``langgraph.py`` (serves ``lg_graph.py``): LangGraph's in-memory dev server.
- ``dbos.py`` (serves ``dbos_app.py``): DBOS Transact on SQLite behind FastAPI + uvicorn.

The files a peer serves (``lg_graph.py``, ``dbos_app.py``) run in the peer's own venv, never
imported here.
"""

from __future__ import annotations

from typing import Any

from . import dbos, langgraph
from .base import Peer, rows

PEERS: dict[str, Peer] = {p.name: p for p in (langgraph.PEER, dbos.PEER)}


def peer_rows(res: dict[str, Any]) -> list[dict[str, Any]]:
    """Every measured peer's rows beside ours (``res`` = the peer phase's results by name)."""
    ours = res.get("ours") or {}
    return [r for name, p in PEERS.items() if res.get(name) and ours for r in rows(p, res[name], ours)]
