"""Redis state: the Lua library every transition runs in, its typed facade, the store that calls
it, the outbox it publishes, the archive of idle sessions, and the fault hook tests use.

Layers, top to bottom (as in :mod:`cox_runner`):

1. Idle sessions
   - ``archive``: archives an idle session's keys to JetStream KV and loads them back on use.
2. The store
   - ``store``: the runner's handle on Redis: loads ``redis_lib.lua``, calls it (retried with the
     call's transition id), the takeover and sweeper passes over the buckets.
3. The outbox
   - ``outbox``: publishes a session's outbox to JetStream in order; flushes it before a read.
4. The facade, replicas and faults
   - ``fns``: one typed method per function of the Lua library.
   - ``replicas``: ``[redis] wait_replicas``: ``WAIT`` queued after the write it covers.
   - ``faults``: fault injection for tests: a function runs and its reply is lost.
"""
