"""A command granted the network reaches it only through coxswain's egress proxy.

Attack first: a granted command tries the host's loopback (the stack's Redis, a test listener),
private ranges, cloud metadata, IPv6 loopback and a name that resolves to loopback, directly and
through the proxy; every try fails and every one the proxy saw is a ``network.request`` event
(``allowed: false``) in the session's log, before the command's ``tool.result``. Then what must
still work: a destination the rules allow carries bytes both ways over HTTP forwarding, CONNECT
and SOCKS5, and ``allow_hosts``/``deny_hosts`` decide by name.

No byte leaves this machine: an "allowed" destination is an echo server in a network namespace
the test makes (tests/support/netns.py), in a benchmarking /30 that ``allow_networks`` opens; the
decision for public addresses is tested with an injected resolver and connector.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import socket
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pydantic
import pytest

from cox_runner.errors import SandboxUnavailable
from cox_runner.workspace import egress, tools
from cox_runner.workspace.egress import Egress, Request
from cox_runner.workspace.sandbox import Sandbox
from coxswain import hostpatterns
from coxswain.config import SandboxConfig
from tests.support import MCP_SERVERS, netns
from tests.support.checks import of_type
from tests.support.flow import result, run_turn
from tests.support.stack import Api, Stack, running, script, tool

HAVE_BWRAP = shutil.which("bwrap") is not None
needs_bwrap = pytest.mark.skipif(not HAVE_BWRAP, reason="bubblewrap is not installed (./dev installs it)")
needs_netns = pytest.mark.skipif(not netns.AVAILABLE, reason=netns.WHY_NOT)
ALLOW = '[approval]\ncommands = "allow"\n'


# --- the rules, alone -------------------------------------------------------------------------

def test_host_patterns_match_a_name_or_what_is_under_it() -> None:
    p = hostpatterns.normalize_pattern
    assert p("PyPI.org.") == "pypi.org" and p("*.PythonHosted.org") == "*.pythonhosted.org"
    assert p("[::1]") == "::1" and p("10.0.0.1") == "10.0.0.1"
    m = hostpatterns.matches
    assert m("pypi.org", "pypi.org") and not m("evilpypi.org", "pypi.org") and not m("pypi.org.evil", "pypi.org")
    assert m("files.pythonhosted.org", "*.pythonhosted.org") and m("a.b.pythonhosted.org", "*.pythonhosted.org")
    assert not m("pythonhosted.org", "*.pythonhosted.org"), "a wildcard names what is under it, not itself"
    assert not m("evilpythonhosted.org", "*.pythonhosted.org")
    for bad in ("*", "http://pypi.org", "pypi.org/simple", "a b", "*.*.org", "pypi..org", "", "x" * 300, "pypi.org:443"):
        with pytest.raises(ValueError):
            p(bad)
    n = hostpatterns.normalize_host
    assert n("PyPI.Org.") == "pypi.org" and n("[::1]") == "::1"
    for bad in ("pypi.org\x00.evil", "a b", "", "..", "évil.org", "x/y"):
        assert n(bad) is None, bad


def test_deny_wins_and_a_nonempty_allow_list_refuses_the_rest() -> None:
    allow, deny = ["pypi.org", "*.pythonhosted.org"], ["bad.pythonhosted.org"]
    r = hostpatterns.host_refusal
    assert r("pypi.org", allow, deny) is None and r("files.pythonhosted.org", allow, deny) is None
    assert "deny_hosts" in (r("bad.pythonhosted.org", allow, deny) or "")
    assert "not in allow_hosts" in (r("github.com", allow, deny) or "")
    assert r("github.com", [], []) is None, "empty allow_hosts: any host (the address decides)"
    assert "deny_hosts" in (r("x.evil.com", [], ["*.evil.com"]) or "")


@pytest.mark.parametrize("address,why", [
    ("127.0.0.1", "loopback"), ("127.255.0.9", "loopback"), ("::1", "loopback"),
    ("10.1.2.3", "private"), ("172.16.0.1", "private"), ("192.168.1.1", "private"),
    ("100.64.0.1", "CGNAT"), ("169.254.169.254", "cloud metadata"), ("fe80::1", "link-local"),
    ("fd00::1", "unique local"), ("fc00::1", "unique local"), ("0.0.0.0", "unspecified"), ("::", "unspecified"),
    ("224.0.0.1", "multicast"), ("239.1.1.1", "multicast"), ("ff02::1", "multicast"), ("224.0.1.1", "multicast"),
    ("255.255.255.255", "broadcast"), ("198.18.0.1", "benchmarking"), ("198.19.255.1", "benchmarking"),
    ("192.0.2.1", "documentation"), ("240.0.0.1", "reserved"),
    ("::ffff:127.0.0.1", "loopback"), ("::ffff:169.254.169.254", "metadata"), ("::ffff:10.0.0.1", "private"),
    ("64:ff9b::7f00:1", "loopback"), ("2002:7f00:1::", "loopback"), ("2002:a9fe:a9fe::1", "link-local"),
    ("::7f00:1", "loopback"),
])
def test_non_public_addresses_are_refused(address: str, why: str) -> None:
    said = hostpatterns.address_refusal(address)
    assert said is not None and why in said, (address, said)


@pytest.mark.parametrize("address", ["8.8.8.8", "151.101.0.223", "2606:4700::1111", "::ffff:8.8.8.8",
                                     "64:ff9b::808:808"])
def test_public_addresses_pass(address: str) -> None:
    assert hostpatterns.address_refusal(address) is None


def test_allow_networks_opens_a_range_but_never_loopback_link_local_or_a_carrier() -> None:
    assert hostpatterns.address_refusal("10.20.1.2", ["10.20.0.0/16"]) is None
    assert hostpatterns.address_refusal("::ffff:10.20.1.2", ["10.20.0.0/16"]) is None
    assert hostpatterns.address_refusal("10.21.1.2", ["10.20.0.0/16"]) is not None
    assert SandboxConfig(allow_networks=["10.20.0.1/16"]).allow_networks == ["10.20.0.0/16"]
    for bad in ("127.0.0.0/8", "127.0.0.1/32", "0.0.0.0/0", "169.254.169.254/32", "::/0", "::1/128", "fe80::/64",
                "::ffff:0:0/96", "64:ff9b::/96", "2002::/16", "224.0.0.0/8", "not-a-range"):
        with pytest.raises(pydantic.ValidationError) as exc:
            SandboxConfig(allow_networks=[bad])
        assert "allow_networks" in str(exc.value) or "address range" in str(exc.value), (bad, str(exc.value))
    with pytest.raises(pydantic.ValidationError):
        SandboxConfig(allow_hosts=["https://pypi.org"])
    assert SandboxConfig(deny_hosts=["Evil.COM."]).deny_hosts == ["evil.com"]


# --- the proxy, in this process, with an injected resolver and connector ------------------------

class Upstream:
    """A connector that never leaves the machine: every "connection" goes to a local echo server,
    and the address the proxy asked for is kept."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.asked: list[tuple[str, int]] = []

    async def __call__(self, address: str, port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        self.asked.append((address, port))
        return await asyncio.open_connection("127.0.0.1", self.port)


@contextlib.asynccontextmanager
async def echo_server() -> AsyncIterator[int]:
    async def serve(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError):
            while data := await r.read(65536):
                w.write(b"echo:" + data)
                await w.drain()
        w.close()

    srv = await asyncio.start_server(serve, "127.0.0.1", 0)
    try:
        yield srv.sockets[0].getsockname()[1]
    finally:
        srv.close()


class Names:
    """A resolver from a table; counts lookups. A list of lists answers in turn (a rebinding name)."""

    def __init__(self, table: dict[str, list[str] | list[list[str]]]) -> None:
        self.table = table
        self.calls: list[str] = []

    async def __call__(self, host: str, port: int) -> list[str]:
        self.calls.append(host)
        answers = self.table.get(host)
        if answers is None:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        rounds = [a for a in answers if isinstance(a, list)]
        if rounds:
            return list(rounds[min(len(self.calls), len(rounds)) - 1])
        return [a for a in answers if isinstance(a, str)]


async def ask(sock: str, request: bytes, read: int = 4096) -> bytes:
    r, w = await asyncio.open_unix_connection(sock)
    w.write(request)
    await w.drain()
    out = b""
    with contextlib.suppress(asyncio.TimeoutError, ConnectionError):
        while len(out) < read:
            chunk = await asyncio.wait_for(r.read(4096), 3)
            if not chunk:
                break
            out += chunk
            if b"echo:" in out:
                break
    w.close()
    return out


async def test_a_name_resolving_to_loopback_among_public_addresses_connects_only_to_a_judged_one() -> None:
    names = Names({"mixed.test": ["127.0.0.1", "10.0.0.9", "93.184.216.34"], "local.test": ["127.0.0.1", "::1"]})
    async with echo_server() as port:
        up = Upstream(port)
        eg = Egress(SandboxConfig(), resolve=names, connect=up)
        reqs: list[Request] = []
        async with eg.grant(reqs) as g:
            assert oct(os.stat(os.path.dirname(g.socket)).st_mode & 0o777) == "0o700"
            out = await ask(g.socket, b"CONNECT mixed.test:443 HTTP/1.1\r\nHost: mixed.test:443\r\n\r\nhello")
            assert out.startswith(b"HTTP/1.1 200") and b"echo:hello" in out, out
            refused = await ask(g.socket, b"CONNECT local.test:443 HTTP/1.1\r\n\r\n")
        assert up.asked == [("93.184.216.34", 443)], "only the address that was judged is connected to"
        assert refused.startswith(b"HTTP/1.1 403") and b"resolves to 127.0.0.1, a loopback address" in refused
        assert reqs == [Request("mixed.test", 443, True, "a public address", "93.184.216.34"),
                        Request("local.test", 443, False, "local.test resolves to 127.0.0.1, a loopback address",
                                "127.0.0.1")]
        assert not os.path.exists(g.socket) and not os.path.exists(os.path.dirname(g.socket))


async def test_dns_rebinding_cannot_swap_the_address_after_the_check() -> None:
    """The name answers public first and loopback after: the proxy resolves once per request and
    connects to the address it judged, never resolving again."""
    names = Names({"rebind.test": [["93.184.216.34"], ["127.0.0.1"]]})
    async with echo_server() as port:
        up = Upstream(port)
        reqs: list[Request] = []
        async with Egress(SandboxConfig(), resolve=names, connect=up).grant(reqs) as g:
            first = await ask(g.socket, b"CONNECT rebind.test:80 HTTP/1.1\r\n\r\nx")
            second = await ask(g.socket, b"CONNECT rebind.test:80 HTTP/1.1\r\n\r\nx")
        assert b"echo:x" in first and second.startswith(b"HTTP/1.1 403"), (first, second)
        assert names.calls == ["rebind.test", "rebind.test"], "one resolution per request"
        assert up.asked == [("93.184.216.34", 80)]
        assert [r.allowed for r in reqs] == [True, False]


async def test_socks5_and_http_forwarding_are_judged_the_same_way() -> None:
    names = Names({"pub.test": ["93.184.216.34"], "localhost": ["127.0.0.1"]})
    async with echo_server() as port:
        up = Upstream(port)
        reqs: list[Request] = []
        async with Egress(SandboxConfig(), resolve=names, connect=up).grant(reqs) as g:
            r, w = await asyncio.open_unix_connection(g.socket)
            host = b"pub.test"
            w.write(b"\x05\x01\x00" + b"\x05\x01\x00\x03" + bytes([len(host)]) + host + b"\x00\x50" + b"ping")
            await w.drain()
            got = b""
            while b"echo:ping" not in got:
                got += await asyncio.wait_for(r.read(4096), 5)
            assert got.startswith(b"\x05\x00" + b"\x05\x00"), got
            w.close()
            r, w = await asyncio.open_unix_connection(g.socket)
            w.write(b"\x05\x01\x00" + b"\x05\x01\x00\x01" + bytes([169, 254, 169, 254]) + b"\x00\x50")
            await w.drain()
            reply = await asyncio.wait_for(r.readexactly(12), 5)
            assert reply == b"\x05\x00" + b"\x05\x02\x00\x01\x00\x00\x00\x00\x00\x00", reply
            w.close()
            fwd = await ask(g.socket, b"GET http://pub.test/simple/?q=1 HTTP/1.1\r\nHost: pub.test\r\n"
                                      b"Proxy-Authorization: x\r\nProxy-Connection: keep-alive\r\n\r\n")
            assert fwd == b"echo:GET /simple/?q=1 HTTP/1.1\r\nHost: pub.test\r\nConnection: close\r\n\r\n", fwd
            bad = await ask(g.socket, b"GET http://localhost:6379/ HTTP/1.1\r\n\r\n")
            assert bad.startswith(b"HTTP/1.1 403") and b"loopback" in bad
        assert [(r.host, r.port, r.allowed) for r in reqs] == [
            ("pub.test", 80, True), ("169.254.169.254", 80, False), ("pub.test", 80, True), ("localhost", 6379, False)]
        assert up.asked == [("93.184.216.34", 80), ("93.184.216.34", 80)]


async def test_allow_and_deny_hosts_decide_before_any_lookup() -> None:
    names = Names({"pypi.org": ["151.101.0.223"], "files.pythonhosted.org": ["151.101.0.223"],
                   "bad.pythonhosted.org": ["151.101.0.223"], "github.com": ["140.82.112.3"]})
    cfg = SandboxConfig(allow_hosts=["pypi.org", "*.pythonhosted.org"], deny_hosts=["bad.pythonhosted.org"])
    eg = Egress(cfg, resolve=names)
    assert (await eg.decide("pypi.org", 443)).allowed
    assert (await eg.decide("FILES.pythonhosted.org.", 443)).allowed
    d = await eg.decide("bad.pythonhosted.org", 443)
    assert not d.allowed and "deny_hosts" in d.reason
    d = await eg.decide("github.com", 443)
    assert not d.allowed and "allow_hosts" in d.reason
    d = await eg.decide("151.101.0.223", 443)
    assert not d.allowed and "allow_hosts" in d.reason, "an address literal is a host like any other"
    assert names.calls == ["pypi.org", "files.pythonhosted.org"], "a refused name is never looked up"
    d = await eg.decide("nowhere.test", 443)
    assert not d.allowed


async def test_the_proxy_is_bounded() -> None:
    names = Names({"pub.test": ["93.184.216.34"]})
    async with echo_server() as port:
        # Too many at once: the 33rd open connection is refused (and recorded).
        reqs: list[Request] = []
        async with Egress(SandboxConfig(), resolve=names, connect=Upstream(port)).grant(reqs) as g:
            held = []
            for _ in range(egress.MAX_OPEN):
                r, w = await asyncio.open_unix_connection(g.socket)
                w.write(b"CONNECT pub.test:80 HTTP/1.1\r\n\r\n")
                await w.drain()
                assert (await asyncio.wait_for(r.readline(), 5)).startswith(b"HTTP/1.1 200")
                held.append(w)
            out = await ask(g.socket, b"CONNECT pub.test:80 HTTP/1.1\r\n\r\n")
            assert out.startswith(b"HTTP/1.1 403") and b"connections open" in out, out
            for w in held:
                w.close()
        assert sum(not r.allowed for r in reqs) == 1
        # A total per command: past it the socket stops answering (so the log stays bounded).
        reqs = []
        async with Egress(SandboxConfig(), resolve=names, connect=Upstream(port), max_connections=3).grant(reqs) as g:
            for _ in range(3):
                assert b"echo:x" in await ask(g.socket, b"CONNECT pub.test:80 HTTP/1.1\r\n\r\nx")
            with pytest.raises(OSError):
                await ask(g.socket, b"CONNECT pub.test:80 HTTP/1.1\r\n\r\nx")
        assert len(reqs) == 3
        # Idle: a tunnel with no byte either way is closed.
        async with Egress(SandboxConfig(), resolve=names, connect=Upstream(port), idle_s=0.5).grant([]) as g:
            r, w = await asyncio.open_unix_connection(g.socket)
            w.write(b"CONNECT pub.test:80 HTTP/1.1\r\n\r\n")
            await w.drain()
            assert (await asyncio.wait_for(r.readuntil(b"\r\n\r\n"), 5)).startswith(b"HTTP/1.1 200")
            t0 = time.monotonic()
            assert await asyncio.wait_for(r.read(10), 10) == b"", "the idle tunnel is closed"
            assert time.monotonic() - t0 < 5
            w.close()
        # A head past its limit, or garbage, gets a clear 400 and no connection.
        reqs = []
        async with Egress(SandboxConfig(), resolve=names, connect=Upstream(port)).grant(reqs) as g:
            long = await ask(g.socket, b"CONNECT pub.test:80 HTTP/1.1\r\nX: " + b"a" * 20000 + b"\r\n\r\n")
            assert long.startswith(b"HTTP/1.1 400") and b"longer than" in long, long[:200]
            junk = await ask(g.socket, b"HELLO\r\n\r\n")
            assert junk.startswith(b"HTTP/1.1 400")
            https = await ask(g.socket, b"GET https://pub.test/ HTTP/1.1\r\n\r\n")
            assert https.startswith(b"HTTP/1.1 400") and b"CONNECT" in https
        assert reqs == []


# --- real bubblewrap: the command's side ------------------------------------------------------

@contextlib.contextmanager
def host_listener() -> Iterator[int]:
    """A TCP listener on the host's loopback that greets every connection."""
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("127.0.0.1", 0))
    srv.listen(64)
    srv.setblocking(False)
    yield srv.getsockname()[1]
    srv.close()


async def sandboxed(tmp: Path, cfg: SandboxConfig, command: str, resolve: Any = None,
                    network: bool = True) -> tuple[tools.CommandResult, list[Request]]:
    sb = Sandbox(cfg, ".coxswain")
    assert (await sb.probe()).available
    if resolve is not None:
        sb.egress.resolve = resolve
    reqs: list[Request] = []
    ws = tmp / "ws"
    ws.mkdir(exist_ok=True)
    res = await tools.run_command(ws, command, 60, 20000, sb, network, requests=reqs)
    return res, reqs


def via(proxy: str, url: str, extra: str = "") -> str:
    """curl through the proxy whatever NO_PROXY says (``--noproxy ''``)."""
    return f"curl -sS -m 8 --fail-with-body --noproxy '' -x {proxy} {extra} {url}; echo \" rc=$?\""


@needs_bwrap
async def test_a_granted_command_has_its_own_namespace_and_the_proxy_refuses_the_host(tmp_path: Path) -> None:
    with host_listener() as port:
        cmd = "; ".join([
            f"curl -sS -m 5 http://127.0.0.1:{port}/; echo \" rc=$?\"",  # NO_PROXY: direct, own netns
            via("$HTTP_PROXY", f"http://127.0.0.1:{port}/"),
            via("$HTTP_PROXY", f"http://localhost:{port}/", "-p"),
            via("$ALL_PROXY", f"http://[::1]:{port}/"),
            via("$HTTP_PROXY", "http://169.254.169.254/latest/meta-data/"),
            via("$ALL_PROXY", "http://10.0.0.1/"),
            "cat /etc/resolv.conf >/dev/null; getent hosts pypi.org; echo \" dns=$?\"",
            "ls -la /run; env | grep -ci proxy",
        ])
        res, reqs = await sandboxed(tmp_path, SandboxConfig(), cmd)
    out = res.output
    assert res.exit_code == 0, out
    lines = [ln for ln in out.splitlines() if "rc=" in ln]
    assert len(lines) == 6 and all("rc=0" not in ln for ln in lines), out
    assert "refused this connection" in out or "403" in out, out
    assert "dns=0" not in out, "the sandbox resolves no name itself"
    assert "cox-egress.sock" in out and out.strip().endswith("8"), out
    got = [(r.host, r.port, r.allowed) for r in reqs]
    assert got == [("127.0.0.1", port, False), ("localhost", port, False), ("::1", port, False),
                   ("169.254.169.254", 80, False), ("10.0.0.1", 80, False)], got
    assert "loopback" in reqs[1].reason and reqs[1].address == "127.0.0.1"
    assert "cloud metadata" in reqs[3].reason


@needs_bwrap
async def test_the_command_runs_as_before_with_its_exit_code_and_the_network_off_stays_off(tmp_path: Path) -> None:
    res, _ = await sandboxed(tmp_path, SandboxConfig(), "echo out; echo err >&2; exit 7")
    assert res.exit_code == 7 and "out" in res.output and "err" in res.output
    res, reqs = await sandboxed(tmp_path, SandboxConfig(), "env | grep -ci proxy; ls /run", network=False)
    assert res.output.split()[0] == "0" and "cox-egress" not in res.output and reqs == []


@needs_bwrap
async def test_a_hook_has_no_network_even_when_every_command_has(tmp_path: Path) -> None:
    """Hooks run a repository's own scripts, unasked: ``[sandbox] network = true`` is not theirs."""
    sb = Sandbox(SandboxConfig(network=True), ".coxswain")
    assert (await sb.probe()).available
    ws = tmp_path / "ws"
    ws.mkdir()
    argv = sb.argv(ws, "env | grep -ci proxy; ls /run", False, offline=True)
    assert "--share-net" not in argv and egress.SOCKET_IN_SANDBOX not in argv
    proc = await asyncio.create_subprocess_exec(*argv, stdout=asyncio.subprocess.PIPE, env=tools.command_env(ws))
    out, _ = await proc.communicate()
    assert out.split() == [b"0"], out
    with pytest.raises(SandboxUnavailable, match="egress proxy"):
        sb.argv(ws, "true", False)  # a command of this config without its proxy is refused, never run open


@needs_bwrap
@needs_netns
async def test_an_allowed_destination_carries_bytes_both_ways(tmp_path: Path) -> None:
    with netns.remote() as rem:
        url = f"http://{rem.address}:{rem.port}/up"
        cmd = "; ".join([
            f"curl -sS -m 5 --noproxy '*' {url}; echo \" rc=$?\"",  # direct: no route out of its namespace
            via("$HTTP_PROXY", url, "-d ping-forward"),
            via("$HTTPS_PROXY", url, "-p -d ping-connect"),
            via("$ALL_PROXY", url, "-d ping-socks"),
        ])
        closed, _ = await sandboxed(tmp_path, SandboxConfig(), cmd)
        opened, reqs = await sandboxed(tmp_path, SandboxConfig(allow_networks=[rem.network]), cmd)
    lines = [ln for ln in closed.output.splitlines() if "rc=" in ln]
    assert all("rc=0" not in ln for ln in lines) and "benchmarking" in closed.output, closed.output
    lines = [ln for ln in opened.output.splitlines() if "rc=" in ln]
    assert "rc=0" not in lines[0], "even an allowed address is not reachable without the proxy"
    for kind in ("forward", "connect", "socks"):
        assert f"echo POST /up host={rem.address}:{rem.port} body=ping-{kind}\n rc=0" in opened.output, opened.output
    assert [(r.host, r.allowed, r.address) for r in reqs] == [(rem.address, True, rem.address)] * 3
    assert all("allow_networks" in r.reason for r in reqs)


@needs_bwrap
@needs_netns
async def test_allow_and_deny_hosts_hold_for_a_sandboxed_command(tmp_path: Path) -> None:
    with netns.remote() as rem:
        names = Names({n: [rem.address] for n in ("pkg.mirror.test", "bad.mirror.test", "mirror.test", "other.test")})
        cfg = SandboxConfig(allow_hosts=["*.mirror.test"], deny_hosts=["bad.mirror.test"],
                            allow_networks=[rem.network])
        cmd = "; ".join(via("$HTTPS_PROXY", f"http://{h}:{rem.port}/x", "-p")
                        for h in ("pkg.mirror.test", "bad.mirror.test", "mirror.test", "other.test"))
        res, reqs = await sandboxed(tmp_path, cfg, cmd, resolve=names)
    assert f"echo GET /x host=pkg.mirror.test:{rem.port} body=\n rc=0" in res.output, res.output
    assert [(r.host, r.allowed) for r in reqs] == [("pkg.mirror.test", True), ("bad.mirror.test", False),
                                                    ("mirror.test", False), ("other.test", False)]
    assert "deny_hosts" in reqs[1].reason and "allow_hosts" in reqs[2].reason
    assert names.calls == ["pkg.mirror.test"]


START_S = 120.0
"""What a test of the proxy gives its MCP server to start (the default is 30 s): a cold CI run's
parallel lane, starved beside the drills and a first image build, once took longer than 30 s to
start a Python MCP server in bwrap."""


@needs_bwrap
async def test_a_stdio_mcp_server_granted_the_network_goes_through_the_proxy(tmp_path: Path) -> None:
    import structlog

    from cox_runner.workspace.mcp_servers import McpServers
    from coxswain.config import Settings

    tiny = MCP_SERVERS / "tiny.py"
    settings = Settings(root=tmp_path, sandbox={"extra_ro": sorted({sys.prefix, sys.base_prefix, str(tiny.parent)})},
                        mcp={"servers": [{"name": "tiny", "command": [sys.executable, str(tiny)], "network": True,
                                          "env": {"TINY_FETCH": "1"}, "start_timeout_s": START_S}]})
    m = McpServers(settings, Sandbox(settings.sandbox, settings.store_dir), structlog.get_logger())
    await m.start(tmp_path, tools.command_env(tmp_path))
    try:
        changes = m.take_changes()
        assert [(c.name, c.state) for c in changes] == [("tiny", "ready")], changes
        _, meta = await m.call("tiny__fetch", {"url": "http://169.254.169.254/latest/meta-data/"}, 30)
        _, private = await m.call("tiny__fetch", {"url": "http://10.0.0.1/"}, 30)
    finally:
        await m.aclose()
    assert meta.startswith("403") and "cloud metadata" in meta, meta
    assert private.startswith("403") and "private" in private, private
    reqs = m.take_requests("tiny")
    assert [(r.host, r.allowed) for r in reqs] == [("169.254.169.254", False), ("10.0.0.1", False)]
    assert m.take_requests("tiny") == [], "taken once, recorded with one call's result"


# --- the real stack: the session's log -----------------------------------------------------------

def commands(*cmds: str) -> str:
    return script({"text": "Running.", "tools": [tool("run_command", command=c, network=True) for c in cmds]},
                  {"text": "Done."})


@pytest.fixture(scope="module")
def remote() -> Iterator[netns.Remote | None]:
    if not netns.AVAILABLE:
        yield None
        return
    with netns.remote() as rem:
        yield rem


@pytest.fixture(scope="module")
def netstack(tmp_path_factory: pytest.TempPathFactory, remote: netns.Remote | None) -> Iterator[Stack]:
    opened = f"allow_networks = [\"{remote.network}\"]\n" if remote else ""
    with running(tmp_path_factory.mktemp("egress"), runners=1,
                 config=ALLOW + "[sandbox]\nnetwork = true\n" + opened) as st:
        yield st


@pytest.fixture
def api(netstack: Stack) -> Iterator[Api]:
    with netstack.client() as client:
        yield client


@needs_bwrap
def test_every_refused_attempt_is_a_network_request_event_before_the_commands_result(
        netstack: Stack, api: Api) -> None:
    redis_port = urlsplit(netstack.redis.url).port
    nats_port = urlsplit(netstack.nats.url).port
    s = api.create("egress-refused")
    with host_listener() as port:
        evs = run_turn(api, s["id"], commands(
            f"curl -sS -m 5 http://127.0.0.1:{port}/; " + via("$HTTP_PROXY", f"http://127.0.0.1:{port}/"),
            via("$HTTPS_PROXY", f"http://localhost:{redis_port}/", "-p") + "; "
            + via("$ALL_PROXY", f"http://127.0.0.1:{nats_port}/"),
        ), timeout=90)
    calls = [e["call_id"] for e in evs if e["type"] == "tool.call"]
    assert len(calls) == 2
    for cid in calls:
        assert "rc=0" not in result(evs, cid)["output"], result(evs, cid)["output"]
    net = of_type(evs, "network.request")
    assert [(e["host"], e["port"], e["allowed"], e["call_id"]) for e in net] == [
        ("127.0.0.1", port, False, calls[0]), ("localhost", redis_port, False, calls[1]),
        ("127.0.0.1", nats_port, False, calls[1])], net
    assert all("loopback" in e["reason"] for e in net)
    for e in net:  # each just before its command's result, in the order they happened
        res_seq = result(evs, e["call_id"])["seq"]
        between = [x for x in evs if e["seq"] < x["seq"] < res_seq and x["type"] not in
                   ("network.request", "file.written", "version.kept")]
        assert e["seq"] < res_seq and between == [], between
    assert [e["seq"] for e in net] == sorted(e["seq"] for e in net)


@needs_bwrap
@needs_netns
def test_an_allowed_connection_is_recorded_and_carries_the_answer(
        netstack: Stack, api: Api, remote: netns.Remote | None) -> None:
    assert remote is not None
    s = api.create("egress-allowed")
    url = f"http://{remote.address}:{remote.port}/hello"
    evs = run_turn(api, s["id"], commands(via("$HTTPS_PROXY", url, "-p -d from-the-sandbox")), timeout=90)
    out = result(evs, next(e["call_id"] for e in evs if e["type"] == "tool.call"))["output"]
    assert f"echo POST /hello host={remote.address}:{remote.port} body=from-the-sandbox\n rc=0" in out, out
    (net,) = of_type(evs, "network.request")
    assert net["allowed"] is True and net["address"] == remote.address and net["port"] == remote.port
    assert "allow_networks" in net["reason"]


@needs_bwrap
def test_a_persons_command_goes_through_the_proxy_and_its_requests_are_recorded(
        netstack: Stack, api: Api) -> None:
    s = api.create("egress-observe")
    sid = s["id"]
    r = api.http.post(f"/v1/sessions/{sid}/observe",
                      json={"command": via("$HTTP_PROXY", "http://169.254.169.254/latest/meta-data/")})
    assert r.status_code == 202, r.text
    obs = api.wait_type(sid, "observed")
    assert "rc=0" not in obs["output"], obs["output"]
    evs = api.all_events(sid)
    net = of_type(evs, "network.request")
    assert len(net) == 1 and net[0]["allowed"] is False and net[0]["host"] == "169.254.169.254"
    assert net[0]["seq"] < obs["seq"] and net[0]["call_id"].startswith("obs")
    assert "cloud metadata" in net[0]["reason"]
