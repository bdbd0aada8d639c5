"""The turn-runner service (``python -m cox_runner``): admits every person's action and runs turns.

Layers, top to bottom. A module imports only from the layers below its own, never from its own
layer or one above (``tests/fast/test_layers.py`` reads this list and holds every import to it,
those inside functions and ``TYPE_CHECKING`` blocks too). A subpackage is one entry here and
orders its own modules the same way in its ``__init__``.

1. The process
   - ``__main__``: ``python -m cox_runner``.
2. The service
   - ``service``: the ``Runner``: its endpoints, the lease keeper, the claimer, the sweeper, the
     archiver, the doorbell subscription, shutdown; builds the :class:`~cox_runner.deps.Deps`.
3. Fork, rewind, runs and programs
   - ``forks``: a session copied at a turn (fork) or cut back to one (rewind).
   - ``programs``: a session's long-running programs in the sandbox (start, read, write, stop),
     its network namespace, the program lock, their ends recorded and versioned.
   - ``runs``: a session whose turns the program drives (a run, in a template's copy or not);
     the owner's check command between turns.
4. A person's actions
   - ``admission``: each person's action (create, patch, send, Lead, Stop, answer, observe,
     restore, undo, compact) as one atomic Redis transition.
   - ``queue_ops``: remove or reorder queued messages; the principal's workspaces.
5. Drives, workspaces' owners and attachments
   - ``attachments``: an upload recorded; the attachments a send names, checked (vision too).
   - ``drive``: a drive: this runner holding a session's lease and running its turns one after
     another; starting one, ending a person's operation.
   - ``workspaces``: which principal owns a workspace, and resolving a workspace's name.
6. The turn loop
   - ``loop``: one turn from its first model request to its end: load, the loop, the hooks at its
     start and end, every call closed on the way out.
7. A turn's steps
   - ``step``: one model request (built, streamed, retried, its usage and limits) and the title.
   - ``calls``: a response's tool calls in order: the limits, the argument check, the gate, the
     handler, the PostToolUse hooks.
8. Boundaries and checkpoints
   - ``leads``: Leads at the safe boundaries, and closing Lead admission before the turn ends.
   - ``checkpoints``: the limits during a turn: hard ones end it, soft ones ask, warnings.
9. What a tool call does
   - ``handlers``: one function per tool, run once the gate allowed the call.
   - ``hooks``: the workspace's hooks at the five points of the turn loop.
10. Deciding and versioning
   - ``gate``: a tool call's approval: guard, the judge, the person.
   - ``cmdversions``: what a command changes, versioned like a write.
11. Out of a turn
   - ``infra``: waiting for the services a turn needs (guard, the judge, versions).
   - ``recorder``: a turn's events out, its open calls, its transcript.
12. The parts' resources
   - ``deps``: the resources the parts share, handed down instead of the ``Runner``.
13. Reading a session, ringing its holder
   - ``logreader``: a session's whole log (the outbox flushed, then JetStream read); the transcripts
     kept for idle sessions, with the events since folded in.
   - ``doorbell``: tells the runner holding a session to look again.
14. Leases
   - ``leases``: the drives this runner holds, one per session, their deadlines, the lease check
     before a file write.
   - ``runslots``: this runner's side of the stack's run slots (``[runs] max_active`` run turns
     at once).
15. The transcript
   - ``transcript``: the model's view of a session, rebuilt from its event log.
16. Compaction
   - ``compaction``: keeps a long turn's transcript inside the model's context window.
17. A turn's state
   - ``turn``: a running turn's identity and the signals (Stop, Lead, doorbell) sent to it.
   - ``budget``: a turn's use against its limits (pure).
   - ``spending``: the daily budgets (``[limits] session_spend``, ``principal_spend``): today's
     spend, the budgets reached, the pause and the refusal's words.
18. The leaves: Redis, the model, the workspace, the other services
   - ``redis``: Redis state (the Lua library, its facade, the store, the archive).
   - ``model``: the model (providers, the script model, retries, usage).
   - ``workspace``: workspace I/O (tools, the walk, the sandbox, its limits and egress, MCP).
   - ``clients``: typed calls to guard, the judge and versions over NATS; usage samples out.
   - ``health``: whether the services a turn needs answer now.
   - ``instructions``: ``AGENTS.md`` at the workspace root.
19. Errors
   - ``errors``: the runner's own errors (LeaseLost, StoreDown, StopRequested, SandboxUnavailable).
"""
