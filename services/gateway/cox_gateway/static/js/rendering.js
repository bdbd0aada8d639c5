// How the console shows each event type of the log (docs/events.schema.json): every type has a
// deliberate rendering, or "none" when showing it would only be noise. state.js refuses to load
// when a type here that is not "none" has no handler there, and tests/fast/test_console_events.py
// fails when a type of the schema is missing here. Keep the block between the markers valid JSON
// (double quotes, no trailing comma): the fast test reads it as such.

// BEGIN RENDERING
export const RENDERING = {
  "agent.message": "transcript: a message from an agent, as Markdown",
  "approval.pending": "approval card over the composer; the call's card says waiting for you; Needs you in the title, the favicon and the list",
  "approval.resolved": "the call's card: allowed or denied, once, with the message",
  "attachment.withheld": "transcript: one line, the file the model was not given and why",
  "budget.reached": "transcript: one line, the daily budget that paused the session and what waits",
  "budget.resumed": "transcript: one line, the session goes on (and why)",
  "assistant.delta": "transcript: the streaming answer",
  "assistant.msg": "transcript: the answer as Markdown; its usage counts in the turn's status line",
  "check": "transcript: one line, the command and whether it passed",
  "context.compacted": "transcript: one line, tokens before and after",
  "event.omitted": "transcript: one line, what was too large to show",
  "file.written": "the call's card (created, changed or deleted, with +/-) or one line for a restore, undo or rewind; Review",
  "hook.decision": "transcript: one line; the call's card when it was about one",
  "lead.applied": "the Lead's fate, folded into the transcript",
  "lead.saved": "waiting list above the composer",
  "lead.unapplied": "transcript: one line naming the Leads not applied",
  "limit.hard": "transcript: one line",
  "limit.soft": "transcript: one line",
  "limit.warning": "transcript: one line",
  "mcp.server": "inspector: the tool servers; a line when one fails or exits",
  "model.retry": "turn status line: retrying, with the error",
  "network.request": "the call's card: one line per connection asked for",
  "observed": "transcript: the !command and its output",
  "plan.carried": "inspector plan; one line in the transcript",
  "plan.step": "inspector plan (the plan_step call is one line in the transcript)",
  "plan.write": "inspector plan (the plan_write call is one line in the transcript)",
  "policy.decision": "the call's card: who refused it and why, or its diff preview",
  "program.exited": "transcript: one line, the program and its exit code; inspector programs: exited",
  "program.started": "transcript: one line, the program's name and command; inspector programs: listed, with its output tail and Stop",
  "program.stopped": "transcript: one line, the program and who stopped it; inspector programs: stopped",
  "queue.added": "waiting list above the composer",
  "queue.discarded": "transcript: one line naming what Stop discarded",
  "queue.removed": "transcript: one line",
  "queue.reordered": "waiting list order",
  "run.end": "transcript: one line; the run badge",
  "run.start": "transcript: one line; the run badge and banner",
  "session.archived": "none",
  "session.created": "transcript: one line",
  "session.forked": "transcript: one line",
  "session.restored": "none",
  "session.shared": "transcript: one line, who may now see it (and answer, as an approver)",
  "session.unshared": "transcript: one line",
  "session.rewound": "transcript: one line; the turns it took out of the model's view are dimmed and marked",
  "session.updated": "transcript: one line; the header",
  "title.set": "the header and the session list",
  "tool.call": "transcript: the call's card",
  "tool.result": "the call's card: status and output",
  "tool.skipped": "the call's card: skipped, and why",
  "turn.end": "transcript: the turn's end with Fork, Rewind and Review",
  "turn.start": "transcript: one line; the turn status line",
  "usage": "turn status line: tokens and cost (judge, title and compaction requests added to the turn's)",
  "user.msg": "transcript: the message, with its attachments (images previewed, other files as a named chip)",
  "version.kept": "the call's card (its inline diff) and Review"
};
// END RENDERING

/** The event types shown as nothing at all. */
export const SILENT = new Set(Object.keys(RENDERING).filter((t) => RENDERING[t] === "none"));
