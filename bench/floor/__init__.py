"""The floor programs: the least the same brokers and libraries can do, each its own process.

- ``responder``: a nats-py request-reply responder (echo), on uvloop.
- ``asgi_app``: a bare ASGI app under uvicorn (uvloop, httptools) whose POST publishes the body
  to NATS and answers 202.
- ``probe``: the measuring side, a separate process: NATS request-reply, a JetStream publish
  with ack, a Redis Lua compare-and-set (redis-py and raw RESP), an HTTP POST to the ASGI app
  (the lean client and httpx). It prints one JSON line of results.
"""
