"""Workspaces belong to principals (docs/api.md, "Workspaces"; docs/design.md, "Who owns a workspace").

A workspace is a folder under the root, named by its path relative to the root after every link
is resolved (``team/app``). It is never the root itself and never inside or around another
workspace: a session's commands may write anywhere in their workspace, so a workspace holding
another would reach that one's files, versions store and hooks.

Its owner is recorded in Redis (``cox:{ws}:owners``) by ``cox_ws_claim``, in one call that also
refuses a name inside or around a recorded one, so two principals racing for one new name (or for
``w1`` and ``w1/d``) cannot both win. The claim is made before the folder or the session: the
loser creates nothing. Another principal's workspace answers 404 unless ``[[auth.shares]]``
shares it with the caller.

A folder already under the root that nobody claimed (made before owners were recorded, or by the
operator's hand) belongs to the local principal (``principal``, default ``local``): the operator
shares it with ``[[auth.shares]]``; its first session by the local principal records the claim.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path, PurePosixPath

from coxswain import keys, safefs
from coxswain.errors import Invalid, NotFound, Refused, WorkspaceInvalid, WorkspaceNested

from .deps import Deps

MAX_LISTED = 1000
NAME_MAX = 255
"""The longest file name Linux file systems take (bytes)."""


class Workspaces:
    def __init__(self, deps: Deps) -> None:
        self.r = deps

    # ------------------------------------------------------------------ names
    def name_of(self, requested: str) -> str:
        """The workspace name of ``requested`` (relative to the root, or absolute beneath it),
        links resolved. Refused: outside the root (422 ``invalid``), the root itself or a store
        folder (422 ``workspace_invalid``), the credential denylist (422 ``invalid``)."""
        root = self.r.settings.root
        rel = requested.strip()
        if any(len(part.encode("utf-8", "surrogatepass")) > NAME_MAX for part in rel.split("/")):
            raise Invalid(f"a folder name may be at most {NAME_MAX} bytes")
        if os.path.isabs(rel):
            under = safefs.real_under(root, rel)
            if under is None:
                raise Invalid("workspace must be a folder under the root")
            rel = str(under)
        try:
            name = safefs.resolve(root, rel or ".")
        except Refused as exc:
            raise Invalid("workspace must be a folder under the root") from exc
        if name == "":
            raise WorkspaceInvalid("a workspace is a folder under the root, never the root itself")
        if self.r.settings.store_dir in PurePosixPath(name).parts:
            raise WorkspaceInvalid(f"a workspace cannot be or be inside a {self.r.settings.store_dir} store folder")
        if safefs.denied(name):
            raise Invalid("that folder is on the credential denylist")
        return name

    def is_root(self, workspace: str) -> bool:
        """A session made before this rule on the root itself (it may no longer run anything).

        Asked on every send: two ``stat`` calls (the same folder, however it is reached: a link
        or a bind mount of the root counts as the root) instead of two ``realpath`` walks, an
        ``lstat`` per path component (~0.1 ms a send here); the walk only for a path gone."""
        try:
            return os.path.samefile(workspace, self.r.settings.root)
        except OSError:
            return os.path.realpath(workspace) == os.path.realpath(self.r.settings.root)

    def path(self, name: str) -> Path:
        return Path(os.path.realpath(self.r.settings.root)) / name

    # ------------------------------------------------------------------ ownership
    async def owner(self, name: str) -> str | None:
        got = await self.r.redis.hget(keys.WS_OWNERS, name)
        return str(got) if got is not None else None

    def may_use(self, name: str, owner: str | None, principal: str) -> bool:
        return owner == principal or name in self.r.settings.auth.shared_with(principal)

    async def claim(self, name: str, owner: str) -> str:
        """Record ``owner`` as the owner of ``name`` unless it has one; answer its owner.
        WorkspaceNested when ``name`` is inside or around a recorded workspace."""
        res = await self.r.store.fns.ws_claim(name=name, owner=owner)
        return str(res["owner"])

    async def release(self, name: str, owner: str) -> None:
        await self.r.store.fns.ws_release(name=name, owner=owner)

    async def admit(self, name: str, principal: str, create: bool) -> Path:
        """The folder of ``name`` if ``principal`` may open a session on it, claimed for its owner
        (and made) when it was not recorded yet. 404 for another principal's workspace (unless
        shared) and for a missing one with ``create`` false.

        Its file system calls (a stat, a mkdir, a realpath of a name a few parts deep) run on the
        loop: each is microseconds on the root's local disk, and a hop to a thread cost more than
        the call (the pool's submit and hand-back were 17% of a runner's CPU starting runs)."""
        ws = self.path(name)
        missing = NotFound(f"no workspace {name!r} you may use under the root (create: true makes a new one)")
        owner = await self.owner(name)
        if owner is None:
            if ws.is_dir():
                # A claim comes before its mkdir: a folder seen now that has a record got it
                # meanwhile (another request's claim); one without is nobody's: the operator's.
                owner = await self.owner(name) or self.r.settings.principal
            elif not create:
                raise missing
            else:
                owner = principal
                self._no_store_above(name)
            if not self.may_use(name, owner, principal):
                await self._not_nested(name)  # the clearer answer when it is the reason
                raise missing
            owner = await self.claim(name, owner)
        if not self.may_use(name, owner, principal):
            raise missing
        if not create and not ws.is_dir():
            raise missing
        ws.mkdir(parents=True, exist_ok=True)
        return Path(os.path.realpath(ws))

    async def _not_nested(self, name: str) -> None:
        """WorkspaceNested when a recorded workspace is around or inside ``name`` (a read: the
        claim is what decides; this only picks the clearer refusal)."""
        parts = PurePosixPath(name).parts
        above = ["/".join(parts[:i]) for i in range(1, len(parts))]
        if above and any(o is not None for o in await self.r.redis.hmget(keys.WS_OWNERS, above)):
            raise WorkspaceNested("that folder is inside another workspace")
        if await self.r.redis.zrangebylex(keys.WS_NAMES, f"[{name}/", f"({name}0", start=0, num=1):
            raise WorkspaceNested("that folder holds another workspace")

    def _no_store_above(self, name: str) -> None:
        """A new workspace inside a folder that holds a versions store (a workspace from before
        owners were recorded) is refused like one inside a recorded workspace."""
        root = Path(os.path.realpath(self.r.settings.root))
        parts = PurePosixPath(name).parts
        for i in range(1, len(parts)):
            if (root.joinpath(*parts[:i]) / self.r.settings.store_dir).is_dir():
                raise WorkspaceNested("that folder is inside another workspace")

    # ------------------------------------------------------------------ listing
    async def listing(self, principal: str) -> list[str]:
        """The workspaces ``principal`` may open sessions on: its own, those shared with it and,
        for the local principal, the folders directly under the root nobody claimed."""
        redis = self.r.redis
        own = set(await redis.zrange(keys.ws_principal(principal), 0, MAX_LISTED - 1))
        shared = self.r.settings.auth.shared_with(principal)
        out = set(own)
        if shared:
            names = sorted(shared)
            owners = await redis.hmget(keys.WS_OWNERS, names)
            for n, o in zip(names, owners, strict=True):
                if o is not None or await asyncio.to_thread(self.path(n).is_dir):
                    out.add(n)
        if principal == self.r.settings.principal:
            folders = await asyncio.to_thread(_folders, self.r.settings.root, self.r.settings.store_dir)
            if folders:
                recorded = await redis.zrange(keys.WS_NAMES, 0, -1)
                taken = {str(n).split("/", 1)[0] for n in recorded}
                out.update(f for f in folders if f not in taken)
        return sorted(out)[:MAX_LISTED]


def _folders(root: os.PathLike[str], store_dir: str) -> list[str]:
    try:
        entries = list(os.scandir(root))
    except FileNotFoundError:
        return []
    return [e.name for e in entries
            if not e.name.startswith(".") and e.name != store_dir and e.is_dir(follow_symlinks=False)
            and not safefs.denied(e.name)]
