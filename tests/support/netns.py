"""A listener on an address of its own, in a network namespace this test makes: a stand-in for
"a host on the network" that never sends a byte off this machine.

The namespace gets one end of a veth pair, the host the other, both in a /30 of the
benchmarking range 198.18.0.0/15 (not publicly routable; the egress proxy refuses it unless
``[sandbox] allow_networks`` names it, which is what the tests that need an allowed
destination do). Root only (``ip netns``); :data:`AVAILABLE` says whether it can run here.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass

AVAILABLE = os.geteuid() == 0 and shutil.which("ip") is not None
WHY_NOT = "needs root and iproute2 (ip netns) to make a network namespace"

ECHO_SERVER = r"""
import http.server, sys
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.0"
    def _reply(self, body):
        out = (b"echo " + self.command.encode() + b" " + self.path.encode() + b" host="
               + (self.headers.get("Host") or "").encode() + b" body=" + body + b"\n")
        self.send_response(200)
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)
    def do_GET(self):
        self._reply(b"")
    def do_POST(self):
        self._reply(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
    def log_message(self, *a):
        pass
http.server.ThreadingHTTPServer((sys.argv[1], int(sys.argv[2])), H).serve_forever()
"""


@dataclass
class Remote:
    address: str
    """The listener's address (in the namespace)."""
    port: int
    network: str
    """The /30 both ends are in (what ``allow_networks`` names to let the proxy through)."""


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=20)


@contextlib.contextmanager
def remote(port: int = 8080) -> Iterator[Remote]:
    """An HTTP echo server at ``198.19.x.y+2:port`` in a fresh namespace (removed after)."""
    tag = secrets.token_hex(3)
    ns, host_if, ns_if = f"cox-eg-{tag}", f"cxh{tag}", f"cxn{tag}"
    base = int(ipaddress.IPv4Address("198.19.0.0")) + 4 * secrets.randbelow(16384)
    net = ipaddress.IPv4Network((base, 30))
    host_ip, ns_ip = str(net[1]), str(net[2])
    _ip("netns", "add", ns)
    proc: subprocess.Popen[bytes] | None = None
    try:
        _ip("link", "add", host_if, "type", "veth", "peer", "name", ns_if)
        _ip("link", "set", ns_if, "netns", ns)
        _ip("addr", "add", f"{host_ip}/30", "dev", host_if)
        _ip("link", "set", host_if, "up")
        _ip("-n", ns, "addr", "add", f"{ns_ip}/30", "dev", ns_if)
        _ip("-n", ns, "link", "set", ns_if, "up")
        _ip("-n", ns, "link", "set", "lo", "up")
        proc = subprocess.Popen(["ip", "netns", "exec", ns, sys.executable, "-c", ECHO_SERVER, ns_ip, str(port)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 20
        while True:
            try:
                with socket.create_connection((ns_ip, port), 1):
                    break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise AssertionError("the namespace's echo server did not start") from None
                time.sleep(0.1)
        yield Remote(ns_ip, port, str(net))
    finally:
        if proc is not None:
            proc.kill()
            proc.wait(5)
        with contextlib.suppress(subprocess.SubprocessError):
            _ip("link", "del", host_if)
        with contextlib.suppress(subprocess.SubprocessError):
            _ip("netns", "del", ns)
