"""Redis state: the Lua library every transition runs in, its typed facade, the store that calls
it, the archive of idle sessions, and the fault hook tests use.

Layers, top to bottom (as in :mod:`cox_runner`):

1. Idle sessions
   - ``archive``: archives an idle session's keys to JetStream KV and loads them back on use.
2. The store
   - ``store``: the runner's handle on Redis: loads ``redis_lib.lua``, calls it (retried with the
     call's transition id), publishes the outbox, claims, sweeps.
3. The facade and the faults
   - ``fns``: one typed method per function of the Lua library.
   - ``faults``: fault injection for tests: a function runs and its reply is lost.
"""
