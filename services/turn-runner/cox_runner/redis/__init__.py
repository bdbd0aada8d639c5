"""Redis state: the Lua library every transition runs in, its typed facade, the store that calls
it (outbox, claims, sweeps), the archive of idle sessions and the fault hook tests use."""
