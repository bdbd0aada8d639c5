"""A bare ASGI app under uvicorn: POST publishes its body to NATS and answers 202 (the HTTP floor).

No framework, no validation, no auth: the least an HTTP front that hands work to NATS can do.
``POST /chain`` is the chained floor: the body goes as a NATS request to the responder (which runs
one Redis script) and the reply is the answer, the path of a send with nothing of ours in it.
"""

from __future__ import annotations

import argparse
from typing import Any

import nats
import uvicorn

SUBJECT = "bench.floor.http"
CHAIN = "bench.floor.chain"
REPLY = b'{"ok":true}'
_nc: Any = None


def make_app(url: str) -> Any:
    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        global _nc
        if scope["type"] == "lifespan":
            while True:
                m = await receive()
                if m["type"] == "lifespan.startup":
                    _nc = await nats.connect(url)
                    await send({"type": "lifespan.startup.complete"})
                elif m["type"] == "lifespan.shutdown":
                    await _nc.drain()
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        body = b""
        more = True
        while more:
            m = await receive()
            body += m.get("body", b"")
            more = m.get("more_body", False)
        if scope["path"] == "/chain":
            reply = (await _nc.request(CHAIN, body, timeout=5)).data
        else:
            await _nc.publish(SUBJECT, body)
            reply = REPLY
        await send({"type": "http.response.start", "status": 202,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(reply)).encode())]})
        await send({"type": "http.response.body", "body": reply})

    return app


def serve(make: Any) -> None:
    """``--nats URL --port N``: the app ``make(url)`` builds, under uvicorn as the gateway runs
    (uvloop, httptools, no access log). Both floor apps start this way."""
    p = argparse.ArgumentParser()
    p.add_argument("--nats", required=True)
    p.add_argument("--port", type=int, required=True)
    a = p.parse_args()
    uvicorn.run(make(a.nats), host="127.0.0.1", port=a.port, loop="uvloop", http="httptools",
                lifespan="on", access_log=False, log_level="warning")


if __name__ == "__main__":
    serve(make_app)
