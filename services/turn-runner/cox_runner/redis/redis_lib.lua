#!lua name=coxswain
--[[
coxswain's session state machine: every transition is one function call, atomic in Redis.

Keys of a session derive from its hash key KEYS[1] = "cox:s:{b<bucket>}:<sid>" (see
coxswain/keys.py; the suffixes below mirror it). Its bucket's lease and dirty indexes carry the
same hash tag {b<bucket>}: every call touches keys of one Redis Cluster slot only.

Every function returns an array: [1] is a JSON reply ({"error": code, "detail": text} when it
refused, in which case nothing was changed); the rest, when present, is a batch of outbox
entries the caller now holds the publish lock for and must publish to JetStream, then call
cox_pub_done. Events are written to the outbox here, with their seq, in the same call as the
state change they describe, so the log and the state can never disagree.

Fencing: the busy lease is the string KEYS[1]..":lease" holding the token (an INCR that is
never reused) with a PX TTL. Functions a turn's runner calls take the token and refuse with
"fenced" when it is no longer the lease's.

Idempotent transitions: the functions registered through once() take one more argument, last,
the transition id (tx: '' = none, else "x_" and letters, digits, '_' or '-'). Their first reply for a tx is kept (KEYS[1]..":tx:"..tx, PX
TX_KEEP_MS) and a call with the same tx answers it again without running: a caller whose reply
was lost (the connection broke after Redis ran the call) retries with the same tx and gets the
first attempt's answer, even if the state moved on since (a turn_end that released the lease
is not refused "fenced" on the retry).

A transition id may name its caller too: "x_<id>.<by>". A request the gateway sent to a
session's home and then, the home late, to any runner carries one id to both (coxswain.bus,
call_home); each runner's call names itself as "by". The first to run makes the change; the
other's call answers the same reply with "tx_replay": true in it (a "by" that differs from the
kept one), so that runner does not act on it a second time (start the turn, ring a doorbell). The
same caller's own retry (the same "by") gets the reply as it was.
]]

local LEASES_PREFIX = 'cox:leases:'
local DIRTY_PREFIX = 'cox:dirty:'
local ACTIVE_PREFIX = 'cox:active:'
local PAUSED_PREFIX = 'cox:paused:'
local function tag_of(key) return string.match(key, '(%b{})') end
local function leases_of(base) return LEASES_PREFIX .. tag_of(base) end
local function dirty_of(base) return DIRTY_PREFIX .. tag_of(base) end
local function active_of(base) return ACTIVE_PREFIX .. tag_of(base) end
local function paused_of(base) return PAUSED_PREFIX .. tag_of(base) end
local DAY_MS = 86400000
local PUB_BATCH = 200
local PUB_LOCK_MS = 5000
local TX_KEEP_MS = 60000

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local function reply(tbl) return cjson.encode(tbl) end
-- The last refusal made (its reply and code): once() keeps no not_found refusal (below).
local refused, refused_code = nil, nil
local function refuse(code, detail)
  refused, refused_code = { cjson.encode({ error = code, detail = detail }) }, code
  return refused
end

-- The events recorded by the running call, by session key, written by flush(): one HINCRBY of
-- the seq, one RPUSH, one ZADD of each index a session, however many events the call records (a
-- turn's end records five or six; four commands an event were a third of a turn's commands here).
-- A call runs alone, so one table serves every call; it is emptied as a call begins and written
-- before anything reads what it holds (the outbox, the seq, the indexes) and as the call returns.
local pending, pending_order = {}, {}

local function flush()
  for i = 1, #pending_order do
    local base = pending_order[i]
    local p = pending[base]
    if p.n > 1 then redis.call('HINCRBY', base, 'seq', p.n - 1) end
    -- in slices: unpack has a limit (a fork copies a whole history in one call)
    for j = 1, #p.evs, 1000 do
      redis.call('RPUSH', base .. ':outbox', unpack(p.evs, j, math.min(j + 999, #p.evs)))
    end
    redis.call('ZADD', dirty_of(base), 'NX', p.now, p.sid)
    redis.call('ZADD', active_of(base), p.now, p.sid)
  end
  if #pending_order > 0 then pending, pending_order = {}, {} end
end

-- Record one event: body is a JSON object without seq/ts. Its seq is taken now (the session's
-- first event of the call takes it from the hash; the rest follow it here), written by flush().
local function emit(base, sid, body, now)
  local p = pending[base]
  local seq
  if p == nil then
    seq = redis.call('HINCRBY', base, 'seq', 1)
    p = { sid = sid, seq = seq, n = 1, evs = {}, now = now }
    pending[base] = p
    pending_order[#pending_order + 1] = base
  else
    p.seq, p.n, p.now = p.seq + 1, p.n + 1, now
    seq = p.seq
  end
  p.evs[#p.evs + 1] = '{"seq":' .. seq .. ',"ts":' .. now .. ',' .. string.sub(body, 2)
  return seq
end

-- What every function is registered through: the events it records are written when it returns
-- (a refusal too: what it recorded before refusing is kept, as a direct write would have kept it).
local function entry(fn)
  return function(keys, args)
    pending, pending_order = {}, {}
    local res = fn(keys, args)
    flush()
    return res
  end
end

local function emit_t(base, sid, tbl, now)
  tbl.sid = sid
  return emit(base, sid, cjson.encode(tbl), now)
end

local function seq_of(entry) return tonumber(string.match(entry, '^{"seq":(%d+),')) end

-- The publish lock's holder has been handed the outbox up to seq hw (KEYS[1]..":pubhw", set with
-- every batch handed and gone with the lock): what it may be handed next starts after it. A lock
-- just taken starts its mark at its first batch; one held (again) keeps a mark already past it.
local function handed(base, batch, held)
  local last = batch[#batch]
  if last == nil then return end
  local hw = held and tonumber(redis.call('GET', base .. ':pubhw'))
  if hw and hw >= seq_of(last) then
    redis.call('PEXPIRE', base .. ':pubhw', PUB_LOCK_MS)
  else
    redis.call('SET', base .. ':pubhw', seq_of(last), 'PX', PUB_LOCK_MS)
  end
end

-- Take the publish lock if free and hand the caller the first batch of the outbox. When the
-- caller's own process holds the lock (a publisher of it is running: its call recorded events
-- while that publisher's batch was on its way), hand it what follows that publisher's batches,
-- marked with a first entry CONTINUED: the process adds it to the running publisher's work,
-- which publishes it next without a cox_pub_done between the two (one round trip fewer, and the
-- events out sooner). Without cont (cox_pub_claim) the caller is handed a batch only with a free lock.
local CONTINUED = '~'
-- A fresh lock's batch begins with where the stream was when the last holder freed it (the
-- session hash's pubpos, '<event seq>:<stream seq>', written by cox_pub_done): the new holder,
-- maybe another process, publishes conditionally on it with no look at the stream first. Only a
-- hint: if the subject moved since (a publisher died between its publish and its cox_pub_done),
-- the conditional publish fails and the publisher looks.
local POSITION = '@'
local function with_pub(base, owner, first, cont)
  flush()
  local out = { first }
  if owner == nil or owner == '' then return out end
  if redis.call('LLEN', base .. ':outbox') == 0 then return out end
  if redis.call('SET', base .. ':publock', owner, 'NX', 'PX', PUB_LOCK_MS) then
    local pos = redis.call('HGET', base, 'pubpos')
    if pos then out[#out + 1] = POSITION .. pos end
    local batch = redis.call('LRANGE', base .. ':outbox', 0, PUB_BATCH - 1)
    for i = 1, #batch do out[#out + 1] = batch[i] end
    handed(base, batch)
  elseif cont ~= false and redis.call('GET', base .. ':publock') == owner then
    local hw = tonumber(redis.call('GET', base .. ':pubhw'))
    local tail = redis.call('LINDEX', base .. ':outbox', -1)
    local tail_seq = tail and seq_of(tail)
    local n = hw and tail_seq and (tail_seq - hw) or 0
    if n > 0 and n <= redis.call('LLEN', base .. ':outbox') then
      local batch = redis.call('LRANGE', base .. ':outbox', -n, math.min(-1, PUB_BATCH - n - 1))
      -- the outbox holds consecutive seqs; anything else and the publisher's pub_done hands it on
      if seq_of(batch[1]) == hw + 1 then
        out[#out + 1] = CONTINUED
        for i = 1, #batch do out[#out + 1] = batch[i] end
        handed(base, batch)
        -- the lock is not renewed here: a publisher that died keeps it only until it lapses,
        -- however many calls follow; a live one renews it with its cox_pub_done
      end
    end
  end
  return out
end

-- Run fn once per transition id (the last argument, taken off before fn sees its arguments).
-- What is kept is the reply's head and, when the call handed over a batch with the publish
-- lock, that lock's owner. A replay never hands back the old batch blindly: the outbox has moved
-- on. While the lock is still that owner's (its caller never got the batch, so nobody publishes)
-- the replay hands the outbox's first batch again and renews the lock; otherwise the head alone
-- (someone else publishes, or it is done). Publishing twice is harmless: a seq already in the
-- stream is skipped, and cox_pub_done trims by seq.
local function once(fn)
  return function(keys, args)
    local arg = args[#args]
    args[#args] = nil
    if arg == nil or arg == '' then return fn(keys, args) end
    local tx, by = string.match(arg, '^(x_[%w_-]+)%.?([%w_-]*)$')
    if tx == nil or (by == '' and string.sub(arg, -1) == '.') then
      -- a caller that forgot the id would otherwise lose its last argument without a word
      return refuse('invalid', 'the last argument must be a transition id (x_..., x_....by) or empty')
    end
    local base = keys[1]
    local txk = base .. ':tx:' .. tx
    local kept = redis.call('GET', txk)
    if kept then
      local k = cjson.decode(kept)
      local h = k.h
      if (k.b or '') ~= by then  -- another caller's request ran it: the reply, marked
        if h == '{}' then h = '{"tx_replay":true}' else h = string.sub(h, 1, -2) .. ',"tx_replay":true}' end
      end
      local out = { h }
      if k.o ~= nil and redis.call('GET', base .. ':publock') == k.o then
        local batch = redis.call('LRANGE', base .. ':outbox', 0, PUB_BATCH - 1)
        if #batch > 0 then
          redis.call('PEXPIRE', base .. ':publock', PUB_LOCK_MS)
          for i = 1, #batch do out[#out + 1] = batch[i] end
          handed(base, batch, true)
        end
      end
      return out
    end
    refused = nil
    local res = fn(keys, args)
    -- No session: nothing ran, and the same request may run once the session is loaded back
    -- from the archive (the runner's handler runs again under the same id; so may another
    -- runner the request was also sent to).
    if res == refused and refused_code == 'not_found' then return res end
    local k = { h = res[1] }
    if by ~= '' then k.b = by end
    if #res > 1 then k.o = redis.call('GET', base .. ':publock') end
    redis.call('SET', txk, cjson.encode(k), 'PX', TX_KEEP_MS)
    return res
  end
end

local function busy(base) return redis.call('HGET', base, 'busy') == '1' end

local function hold(base, token)
  local cur = redis.call('GET', base .. ':lease')
  return cur ~= false and cur == token
end

-- The reply already given to a request with this idempotency key (marked replay), or nil.
local function replayed(base, key)
  if key == '' then return nil end
  local prev = redis.call('HGET', base .. ':cid', key)
  if not prev then return nil end
  local p = cjson.decode(prev)
  p.replay = true
  return { cjson.encode(p) }
end

local function session_of(base, principal)
  if redis.call('EXISTS', base) == 0 then return nil end
  if principal ~= nil and principal ~= '' and redis.call('HGET', base, 'principal') ~= principal then
    return nil
  end
  return true
end

local function ids_of(list)
  local out = {}
  for i = 1, #list do out[#out + 1] = cjson.decode(list[i]).message_id end
  return out
end

-- A model chosen while the session was busy applies now (before the next message, or at idle).
local function apply_next_model(base, sid, now)
  local nm = redis.call('HGET', base, 'next_model')
  if nm and nm ~= '' then
    redis.call('HSET', base, 'model', nm)
    redis.call('HDEL', base, 'next_model')
    emit_t(base, sid, { type = 'session.updated', changes = { model = nm } }, now)
  end
end

-- ------------------------------------------------------------------ runs
-- A run is a session whose turns the program drives (docs/api.md, "Runs"). The session hash's
-- field run holds it as JSON: {state = running|ended, confirm, unattended, max_turns, turns,
-- outcome?, last?} (last: the outcome of its latest turn). Whenever a turn of a running run ends
-- without finishing, cox_turn_end queues the run's 'continue' in the same call, so a takeover
-- never loses or doubles one.
local RUN_CANNOT_CONTINUE = { context_full = true }

local function run_of(base)
  local raw = redis.call('HGET', base, 'run')
  if not raw or raw == '' then return nil end
  return cjson.decode(raw)
end

local function running(run) return run ~= nil and run.state == 'running' end

local function end_run(base, sid, run, outcome, now)
  run.state = 'ended'
  run.outcome = outcome
  redis.call('HSET', base, 'run', cjson.encode(run))
  emit_t(base, sid, { type = 'run.end', outcome = outcome, turns = run.turns }, now)
end

-- Start a turn for msg (table: message_id, text, mode). Lease must already be held/created.
-- The session hash as a map, for the reply of a call that began a turn: the turn reads the
-- session from it, not with a read of its own.
local function info_of(base)
  flush()
  local flat = redis.call('HGETALL', base)
  local t = {}
  for i = 1, #flat, 2 do t[flat[i]] = flat[i + 1] end
  return t
end

-- Begins the turn of msg; true when it is the session's first: cox_create marks a new session
-- 'blank' (its log holds nothing of a conversation; a fork's does, and cox_fork unmarks it) and the
-- first turn unmarks it, so the runner may make that turn's transcript of its message alone.
local function begin_turn(base, sid, msg, turn_id, now, agents_md)
  local fresh = redis.call('HDEL', base, 'blank') == 1
  apply_next_model(base, sid, now)
  local model = redis.call('HGET', base, 'model')
  redis.call('HSET', base, 'turn_id', turn_id, 'message_id', msg.message_id, 'stop', '',
    'lead_closed', '0', 'turn_started', now)
  -- a run's 'continue' goes on with the task the run was given: the task stays that one
  if msg.mode ~= 'run' then redis.call('HSET', base, 'task', msg.text) end
  local run = run_of(base)
  if running(run) then
    run.turns = (tonumber(run.turns) or 0) + 1
    redis.call('HSET', base, 'run', cjson.encode(run))
  end
  redis.call('DEL', base .. ':open')
  local via = msg.mode
  if via == nil or via == '' then via = 'send' end
  emit_t(base, sid, { type = 'user.msg', turn_id = turn_id, message_id = msg.message_id, text = msg.text, via = via,
                      attachments = msg.attachments, traceparent = msg.traceparent }, now)
  local start = { type = 'turn.start', turn_id = turn_id, message_id = msg.message_id, model = model }
  if agents_md ~= nil and agents_md ~= '' then start.agents_md = agents_md end
  emit_t(base, sid, start, now)
  return fresh
end

local function take_lease(base, sid, runner, lease_ms, now)
  local token = tostring(redis.call('HINCRBY', base, 'fence', 1))
  redis.call('SET', base .. ':lease', token, 'PX', lease_ms)
  redis.call('ZADD', leases_of(base), now + lease_ms, sid)
  redis.call('HSET', base, 'runner', runner, 'token', token, 'busy', '1')
  return token
end

local function release(base, sid, now)
  redis.call('DEL', base .. ':lease')
  redis.call('ZREM', leases_of(base), sid)
  redis.call('HSET', base, 'turn_id', '', 'message_id', '', 'stop', '', 'runner', '', 'token', '',
    'lead_closed', '0', 'op', '', 'busy', '0')
  apply_next_model(base, sid, now)
end

-- Start the first waiting message (steered first, then queued) on an idle session, under a new
-- lease (in the name of the runner that runs the session's programs, if one does), or nil.
local function start_waiting(base, sid, runner, lease_ms, turn_id, now, agents_md)
  local raw = redis.call('LPOP', base .. ':sq')
  if not raw then raw = redis.call('LPOP', base .. ':q') end
  if not raw then return nil end
  local holder = redis.call('GET', base .. ':plock')
  if holder and holder ~= '' then runner = holder end
  local token = take_lease(base, sid, runner, lease_ms, now)
  local msg = cjson.decode(raw)
  local fresh = begin_turn(base, sid, msg, turn_id, now, agents_md)
  return { next = msg, token = token, turn_id = turn_id, runner = runner, fresh = fresh or nil }
end

-- ------------------------------------------------------------------ daily budgets
-- [limits] session_spend and principal_spend (docs/api.md, "Budgets"): USD per day, the day being
-- the UTC day of Redis's clock (ms / DAY_MS). The session hash counts its own spend of the day
-- (spend_day, spend_today: cox_emit's 'spend' op); a principal's is its own key (cox_spend). A
-- turn that reaches a budget ends spend_limit and its cox_turn_end pauses the session: the field
-- budget holds JSON {budget, limit, spent, day, detail}, the bucket's paused index lists it, its
-- waiting messages stay waiting and every send is refused budget_reached, until cox_budget_resume
-- (an admin raised the budget) or the day is over (the next send or resume lifts it).
local function day_of(now) return math.floor(now / DAY_MS) end

local function budget_of(base)
  local raw = redis.call('HGET', base, 'budget')
  if not raw or raw == '' then return nil end
  return cjson.decode(raw)
end

-- The pause of today, or nil (a pause of an earlier day is over: its budget counted that day).
local function paused_today(base, now)
  local b = budget_of(base)
  if b ~= nil and tonumber(b.day) == day_of(now) then return b end
  return nil
end

-- The refusal of a send or a Lead to a paused session (over: the runner found the principal's
-- budget reached today, '' = not), or nil.
local function budget_refusal(base, now, over)
  if over ~= nil and over ~= '' then return refuse('budget_reached', over) end
  local b = paused_today(base, now)
  if b ~= nil then return refuse('budget_reached', b.detail or 'a daily spend budget is reached') end
  return nil
end

local function waiting_count(base) return redis.call('LLEN', base .. ':sq') + redis.call('LLEN', base .. ':q') end

-- The pause ends: by 'patch' (an admin raised the session's spend_limit), 'reload' (the
-- configured budgets were raised) or 'day' (a new day began).
local function lift(base, sid, b, by, now)
  redis.call('HDEL', base, 'budget')
  redis.call('ZREM', paused_of(base), sid)
  emit_t(base, sid, { type = 'budget.resumed', budget = b.budget, by = by, waiting = waiting_count(base) }, now)
end

-- Mark every pending lead unapplied (Stop, steer, crash): they stay saved, start nothing.
local function unapply_leads(base, sid, turn_id, now)
  local ids = redis.call('LRANGE', base .. ':leadq', 0, -1)
  if #ids == 0 then return ids end
  for i = 1, #ids do
    local raw = redis.call('HGET', base .. ':leads', ids[i])
    if raw then
      local l = cjson.decode(raw)
      l.state = 'unapplied'
      redis.call('HSET', base .. ':leads', ids[i], cjson.encode(l))
    end
  end
  redis.call('DEL', base .. ':leadq')
  local t = { type = 'lead.unapplied', lead_ids = ids }
  if turn_id ~= '' then t.turn_id = turn_id end
  emit_t(base, sid, t, now)
  return ids
end

-- Dismiss the approvals a turn left pending (it crashed, or ended some other way while one was
-- open): a pending approval never outlives its turn.
local function dismiss_approvals(base, sid, turn_id, now)
  if turn_id == '' then return end
  local all = redis.call('HGETALL', base .. ':appr')
  for i = 1, #all, 2 do
    local a = cjson.decode(all[i + 1])
    if a.state == 'pending' and a.turn_id == turn_id then
      a.state = 'dismissed'
      a.decision = 'deny'
      a.actor = 'policy'
      redis.call('HSET', base .. ':appr', all[i], cjson.encode(a))
      emit_t(base, sid, { type = 'approval.resolved', turn_id = turn_id, approval_id = all[i], decision = 'deny',
                          actor = 'policy', reason = 'the turn ended' }, now)
    end
  end
end

-- ------------------------------------------------------------------ session lifecycle

-- KEYS: base. ARGV: sid, principal, workspace, model, title, created_body, owner. The caller
-- wrote the principal index entry before (another slot: not in this call).
local function cox_create(keys, args)
  local base = keys[1]
  local sid, principal, workspace, model, title, body, owner = unpack(args)
  if redis.call('EXISTS', base) == 1 then return refuse('conflict', 'session exists') end
  local now = now_ms()
  local tsrc = ''
  if title ~= '' then tsrc = 'manual' end
  redis.call('HSET', base, 'principal', principal, 'workspace', workspace, 'model', model,
    'title', title, 'title_source', tsrc, 'auto_title', '1', 'dont_ask', '0', 'created', now,
    'seq', 0, 'fence', 0, 'turn_id', '', 'stop', '', 'lead_closed', '0', 'busy', '0', 'blank', '1')
  emit(base, sid, body, now)
  return with_pub(base, owner, reply({ sid = sid, created = now }))
end

-- ARGV: sid, principal, owner, then field/value pairs among title, auto_title, model, dont_ask,
-- spend_limit (a number, '' = none), share (JSON {principal, role}) and unshare (a principal); a share change is sent alone
local function cox_patch(keys, args)
  local base = keys[1]
  local sid, principal, owner = args[1], args[2], args[3]
  if not session_of(base, principal) then return refuse('not_found', 'no such session') end
  local now = now_ms()
  local changes = {}
  local n = 0
  local is_busy = busy(base)
  for i = 4, #args, 2 do
    local f, v = args[i], args[i + 1]
    if f == 'title' then
      redis.call('HSET', base, 'title', v, 'title_source', 'manual')
      emit_t(base, sid, { type = 'title.set', title = v, source = 'manual' }, now)
    elseif f == 'model' then
      if is_busy then
        -- applied before the next queued message runs, so that message runs on the model chosen
        redis.call('HSET', base, 'next_model', v)
        changes.next_model = v
      else
        redis.call('HSET', base, 'model', v)
        redis.call('HDEL', base, 'next_model')
        changes.model = v
      end
      n = n + 1
    elseif f == 'auto_title' or f == 'dont_ask' then
      redis.call('HSET', base, f, v)
      changes[f] = (v == '1')
      n = n + 1
    elseif f == 'spend_limit' then
      -- an admin's USD/day budget of this session ('' = [limits] session_spend again); the
      -- runner then asks cox_budget_resume whether a paused session goes on
      if v == '' then
        redis.call('HDEL', base, 'spend_limit')
        changes.spend_limit = cjson.null
      else
        redis.call('HSET', base, 'spend_limit', v)
        changes.spend_limit = tonumber(v)
      end
      n = n + 1
    elseif f == 'share' or f == 'unshare' then
      local raw = redis.call('HGET', base, 'shares')
      local shares = {}
      if raw and raw ~= '' then shares = cjson.decode(raw) end
      if f == 'share' then
        local s = cjson.decode(v)
        if s.principal == redis.call('HGET', base, 'principal') then
          return refuse('invalid', 'the session is its owner\'s already: share it with someone else')
        end
        shares[s.principal] = s.role
        emit_t(base, sid, { type = 'session.shared', principal = s.principal, role = s.role }, now)
      else
        if shares[v] == nil then return refuse('not_found', 'the session is not shared with that principal') end
        shares[v] = nil
        emit_t(base, sid, { type = 'session.unshared', principal = v }, now)
      end
      if next(shares) == nil then redis.call('HDEL', base, 'shares')
      else redis.call('HSET', base, 'shares', cjson.encode(shares)) end
    end
  end
  if n > 0 then emit_t(base, sid, { type = 'session.updated', changes = changes }, now) end
  return with_pub(base, owner, reply({ ok = true, runner = redis.call('HGET', base, 'runner') }))
end

-- ------------------------------------------------------------------ admission

-- ARGV: sid, principal, message_id, text, mode ('', queue, steer), client_id, runner,
--       lease_ms, turn_id, owner, known_models (space separated, '' = any), agents_md,
--       attachments, traceparent (W3C, '' = none: carried to the message's user.msg), over (''
--       or why the principal's daily budget refuses it: the runner read it, another slot)
-- A paused session (a daily budget reached today) is refused budget_reached.
local function cox_send(keys, args)
  local base = keys[1]
  local sid, principal, message_id, text, mode, client_id, runner, lease_ms, turn_id, owner, models, agents_md, attachments, traceparent, over =
    unpack(args)
  lease_ms = tonumber(lease_ms)
  if not session_of(base, principal) then return refuse('not_found', 'no such session') end
  local prev = replayed(base, client_id)
  if prev then return prev end
  local now = now_ms()
  local refused = budget_refusal(base, now, over)
  if refused then return refused end
  if running(run_of(base)) then
    return refuse('run_active', 'a run drives this session: wait for its end, or Stop it first')
  end
  local model = redis.call('HGET', base, 'model')
  if model == false or model == '' then
    return refuse('not_accepting', 'no model is chosen for this session')
  end
  if models ~= '' then
    local target = redis.call('HGET', base, 'next_model')
    if not target or target == '' then target = model end
    if not string.find(' ' .. models .. ' ', ' ' .. target .. ' ', 1, true) then
      return refuse('not_accepting', 'model ' .. target .. ' is not configured')
    end
  end
  local msg = { message_id = message_id, text = text, mode = mode }
  -- the attachments' records (a JSON array), carried with the message to its user.msg
  if attachments ~= nil and attachments ~= '' then msg.attachments = cjson.decode(attachments) end
  -- the caller's trace context (a traceparent header), carried with the message to its user.msg
  if traceparent ~= nil and traceparent ~= '' then msg.traceparent = traceparent end
  local res
  -- paused on an earlier day (budget_refusal let it through): today's budget is whole again, and
  -- the pause is lifted by a send that is taken (a refused one changes nothing)
  local stale = budget_of(base)
  if stale ~= nil and (mode ~= '' or not busy(base)) then
    lift(base, sid, stale, 'day', now)
  end
  if stale ~= nil and not busy(base) and waiting_count(base) > 0 then
    -- the messages that waited through the pause run first, in order; this one after them
    local started = start_waiting(base, sid, runner, lease_ms, turn_id, now, agents_md)
    msg.mode = 'queue'
    redis.call('RPUSH', base .. ':q', cjson.encode(msg))
    local pos = waiting_count(base)
    emit_t(base, sid, { type = 'queue.added', message_id = message_id, position = pos, mode = 'queue', text = text }, now)
    res = { message_id = message_id, disposition = 'queued', position = pos, resumed = started,
            runner = redis.call('HGET', base, 'runner') }
  elseif not busy(base) then
    -- The session's programs run on one runner (its :plock, renewed while they run): the turn
    -- starts there, under a lease taken in that runner's name (the admitting runner rings it).
    local holder = redis.call('GET', base .. ':plock')
    if holder and holder ~= '' then runner = holder end
    local token = take_lease(base, sid, runner, lease_ms, now)
    local fresh = begin_turn(base, sid, msg, turn_id, now, agents_md)
    local disp = 'started'
    res = { message_id = message_id, disposition = disp, turn_id = turn_id, token = token, runner = runner,
            info = info_of(base), fresh = fresh or nil, observed = redis.call('LLEN', base .. ':observed') }
  elseif mode == '' then
    return refuse('busy', 'a turn is running: choose queue or steer')
  elseif mode == 'queue' then
    redis.call('RPUSH', base .. ':q', cjson.encode(msg))
    local pos = waiting_count(base)
    emit_t(base, sid, { type = 'queue.added', message_id = message_id, position = pos, mode = 'queue', text = text }, now)
    res = { message_id = message_id, disposition = 'queued', position = pos, runner = redis.call('HGET', base, 'runner') }
  else
    redis.call('RPUSH', base .. ':sq', cjson.encode(msg))
    local pos = redis.call('LLEN', base .. ':sq')
    emit_t(base, sid, { type = 'queue.added', message_id = message_id, position = pos, mode = 'steer', text = text }, now)
    if redis.call('HGET', base, 'stop') == '' then redis.call('HSET', base, 'stop', 'steer') end
    redis.call('HSET', base, 'lead_closed', '1')
    res = { message_id = message_id, disposition = 'steered', position = pos,
            runner = redis.call('HGET', base, 'runner'), turn_id = redis.call('HGET', base, 'turn_id') }
  end
  if client_id ~= '' then
    local keep = { message_id = res.message_id, disposition = res.disposition, position = res.position }
    redis.call('HSET', base .. ':cid', client_id, cjson.encode(keep))
  end
  return with_pub(base, owner, reply(res))
end

-- Save a Lead for the running turn (serialized per session: one atomic call).
-- ARGV: sid, principal, lead_id, text, client_id, max_pending, owner, turn_id ('' = whichever runs),
--       over ('' or why the principal's daily budget refuses it)
-- Refusals, in order: budget_reached (as a send's), no_turn (idle, between turns, or not the turn the client named),
-- lead_closed (Stop/steer asked, or the turn closed admission for its final work),
-- too_many_pending. A client_id already used for a Lead answers the same reply again.
local function cox_lead(keys, args)
  local base = keys[1]
  local sid, principal, lead_id, text, client_id, max_pending, owner, want_turn, over = unpack(args)
  if not session_of(base, principal) then return refuse('not_found', 'no such session') end
  local prev = replayed(base, client_id ~= '' and ('lead:' .. client_id) or '')
  if prev then return prev end
  local now = now_ms()
  local refused = budget_refusal(base, now, over)
  if refused then return refused end
  local run = run_of(base)
  if running(run) and (run.confirm ~= 'person' or run.unattended == true) then
    return refuse('run_active', 'a run nobody supervises drives this session: no Lead (Stop it first)')
  end
  local turn_id = redis.call('HGET', base, 'turn_id')
  if not busy(base) or turn_id == false or turn_id == '' then
    return refuse('no_turn', 'no turn is running: send a message instead')
  end
  if want_turn ~= nil and want_turn ~= '' and want_turn ~= turn_id then
    return refuse('no_turn', 'turn ' .. want_turn .. ' is not running (the running turn is ' .. turn_id .. ')')
  end
  if redis.call('HGET', base, 'lead_closed') == '1' or redis.call('HGET', base, 'stop') ~= '' then
    return refuse('lead_closed', 'the running turn is finishing and takes no more Leads')
  end
  if redis.call('LLEN', base .. ':leadq') >= tonumber(max_pending) then
    return refuse('too_many_pending', 'at most ' .. max_pending .. ' Leads may wait')
  end
  redis.call('HSET', base .. ':leads', lead_id,
    cjson.encode({ lead_id = lead_id, text = text, state = 'pending', turn_id = turn_id, saved = now }))
  redis.call('RPUSH', base .. ':leadq', lead_id)
  emit_t(base, sid, { type = 'lead.saved', turn_id = turn_id, lead_id = lead_id, text = text }, now)
  local res = { lead_id = lead_id, pending = redis.call('LLEN', base .. ':leadq'), turn_id = turn_id }
  if client_id ~= '' then redis.call('HSET', base .. ':cid', 'lead:' .. client_id, cjson.encode(res)) end
  res.runner = redis.call('HGET', base, 'runner')
  return with_pub(base, owner, reply(res))
end

-- ARGV: sid, principal, owner
local function cox_stop(keys, args)
  local base = keys[1]
  local sid, principal, owner = unpack(args)
  if not session_of(base, principal) then return refuse('not_found', 'no such session') end
  if not busy(base) then
    return { reply({ turn_id = cjson.null, discarded = {}, unapplied_leads = {}, stopped = false }) }
  end
  local now = now_ms()
  local turn_id = redis.call('HGET', base, 'turn_id')
  local waiting = redis.call('LRANGE', base .. ':sq', 0, -1)
  local queued = redis.call('LRANGE', base .. ':q', 0, -1)
  for i = 1, #queued do waiting[#waiting + 1] = queued[i] end
  local discarded = ids_of(waiting)
  redis.call('DEL', base .. ':sq', base .. ':q')
  if #discarded > 0 then
    local t = { type = 'queue.discarded', message_ids = discarded }
    if turn_id ~= '' then t.turn_id = turn_id end
    emit_t(base, sid, t, now)
  end
  local unapplied = unapply_leads(base, sid, turn_id, now)
  redis.call('HSET', base, 'stop', 'stop', 'lead_closed', '1')
  local tid = turn_id
  if tid == '' then tid = cjson.null end
  local res = { turn_id = tid, discarded = discarded, unapplied_leads = unapplied, stopped = true,
                runner = redis.call('HGET', base, 'runner') }
  return with_pub(base, owner, reply(res))
end

-- Answer an approval. ARGV: sid, principal, approval_id, decision, scope, message, owner,
-- actor ('' = person), reason. A person answers through the API (principal checked); the runner
-- answers for the don't-ask switch (actor dont_ask) and dismisses an approval whose turn is
-- ending (actor policy: state "dismissed"). Answering twice is refused: resolved.
-- "Always this session" makes the approval's standing_key standing (never for a security confirm,
-- except the network confirm, whose standing key 'network' is the session's recorded permission).
local function cox_answer(keys, args)
  local base = keys[1]
  local sid, principal, aid, decision, scope, message, owner, actor, why = unpack(args)
  if actor == nil or actor == '' then actor = 'person' end
  if not session_of(base, principal) then return refuse('not_found', 'no such session') end
  local raw = redis.call('HGET', base .. ':appr', aid)
  if not raw then return refuse('not_found', 'no such approval') end
  local a = cjson.decode(raw)
  if a.state ~= 'pending' then return refuse('resolved', 'this approval was already answered') end
  local now = now_ms()
  if actor == 'policy' then a.state = 'dismissed' else a.state = 'resolved' end
  a.decision = decision
  a.scope = scope
  a.actor = actor
  if message ~= '' then a.message = message end
  redis.call('HSET', base .. ':appr', aid, cjson.encode(a))
  local prefix = a.standing_key
  if decision == 'allow' and scope == 'session' and type(prefix) == 'string' and prefix ~= ''
     and (not a.security or prefix == 'network') then
    redis.call('SADD', base .. ':standing', prefix)
  end
  local ev = { type = 'approval.resolved', turn_id = a.turn_id, approval_id = aid, decision = decision,
               actor = actor, scope = scope }
  if message ~= '' then ev.message = message end
  if why ~= nil and why ~= '' then ev.reason = why end
  emit_t(base, sid, ev, now)
  return with_pub(base, owner, reply({ ok = true, runner = redis.call('HGET', base, 'runner'),
                                       turn_id = a.turn_id }))
end

-- ------------------------------------------------------------------ the turn's holder

-- ARGV: sid, token, lease_ms
local function cox_renew(keys, args)
  local base = keys[1]
  local sid, token, lease_ms = args[1], args[2], tonumber(args[3])
  if not hold(base, token) then return refuse('fenced', 'lease lost') end
  redis.call('PEXPIRE', base .. ':lease', lease_ms)
  redis.call('ZADD', leases_of(base), now_ms() + lease_ms, sid)
  -- turn_id: the flags are this turn's (a late reply must not stop the turn after it)
  -- lead_last: the newest Lead waiting ('' for none; one the holder took since is not waiting)
  return { reply({ stop = redis.call('HGET', base, 'stop'), leads = redis.call('LLEN', base .. ':leadq'),
                   lead_last = redis.call('LINDEX', base .. ':leadq', -1) or '',
                   observed = redis.call('LLEN', base .. ':observed'),
                   dont_ask = redis.call('HGET', base, 'dont_ask') == '1',
                   turn_id = redis.call('HGET', base, 'turn_id') }) }
end

-- Close Lead admission unless a Lead waits to be applied (a Stop or steer asked: closed whatever
-- waits, it is never applied). n: the Leads waiting. True if closed.
local function close_leads(base, n)
  if n > 0 and redis.call('HGET', base, 'stop') == '' then return false end
  redis.call('HSET', base, 'lead_closed', '1')
  return true
end

-- Take the pending Leads: each marked applied and recorded as a user message, then one
-- lead.applied. Returns them ({lead_id, text} each; empty: none waited, nothing recorded) and
-- the seq of the lead.applied (0: none).
local function take_leads(base, sid, turn_id, now)
  local ids = redis.call('LRANGE', base .. ':leadq', 0, -1)
  local leads = {}
  if #ids == 0 then return leads, 0 end
  for i = 1, #ids do
    local raw = redis.call('HGET', base .. ':leads', ids[i])
    local l = cjson.decode(raw)
    l.state = 'applied'
    redis.call('HSET', base .. ':leads', ids[i], cjson.encode(l))
    leads[#leads + 1] = { lead_id = ids[i], text = l.text }
    emit_t(base, sid, { type = 'user.msg', turn_id = turn_id, message_id = ids[i], text = l.text, via = 'lead' }, now)
  end
  redis.call('DEL', base .. ':leadq')
  return leads, emit_t(base, sid, { type = 'lead.applied', turn_id = turn_id, lead_ids = ids }, now)
end

-- Record events and state writes for the holder of token. ARGV: sid, token, owner, nops,
-- then nops*4 op fields (op, suffix, field, value), then event bodies.
-- ops: hset | hsetnx | hdel | del | sadd | rpush | ltrim (field, value = start, stop) | hincrby |
-- hincrbyfloat | spend (value: USD added to the session's spend of the day; the reply then says
-- spend_day and spend_today) | close_leads (suffix, field, value ''; with the lease: Lead admission
-- closes as cox_close_leads closes it, after the events; the reply's closed says if it did, false
-- without the op) | take_leads (suffix, field ''; value: the turn id; with the lease: the Leads
-- saved so far are taken after the events (take_leads) and the reply's taken lists them: a safe
-- boundary's skips and its Leads in one call; cox_emit's only); suffix in the allowed set.
local ALLOWED = { [''] = true, [':open'] = true, [':appr'] = true, [':standing'] = true, [':observed'] = true,
                  [':wip'] = true, [':att'] = true }
-- The nops ops of args from index i (each op, suffix, field, value): nil if they may run, else the
-- refusal. is_emit: whether the call is cox_emit (the spend and take_leads ops are its own:
-- cox_turn_end's carried ops do without them).
local function check_ops(args, i, nops, token, is_emit)
  for _ = 1, nops do
    local op, suffix = args[i], args[i + 1]
    if not ALLOWED[suffix] then return refuse('invalid', 'suffix not allowed: ' .. suffix) end
    if (op == 'close_leads' or op == 'take_leads') and token == '' then
      return refuse('invalid', op .. ' needs the lease')
    end
    if (op == 'spend' or op == 'take_leads') and not is_emit then
      return refuse('invalid', 'the ' .. op .. ' op is cox_emit\'s only')
    end
    i = i + 4
  end
  return nil
end

-- Run the ops checked by check_ops. Returns the index after them, the day a spend op counted on
-- (nil without one), whether a close_leads op was among them and a take_leads op's turn id (nil
-- without one): the caller runs those two after its events.
local function run_ops(base, args, i, nops, now)
  local spent = nil
  local close = false
  local take = nil
  for _ = 1, nops do
    local op, suffix, field, value = args[i], args[i + 1], args[i + 2], args[i + 3]
    local key = base .. suffix
    if op == 'close_leads' then close = true
    elseif op == 'take_leads' then take = value
    elseif op == 'hset' then redis.call('HSET', key, field, value)
    elseif op == 'hsetnx' then redis.call('HSETNX', key, field, value)
    elseif op == 'hdel' then redis.call('HDEL', key, field)
    elseif op == 'del' then redis.call('DEL', key)
    elseif op == 'sadd' then redis.call('SADD', key, value)
    elseif op == 'rpush' then redis.call('RPUSH', key, value)
    elseif op == 'ltrim' then redis.call('LTRIM', key, tonumber(field), tonumber(value))
    elseif op == 'hincrby' then redis.call('HINCRBY', key, field, tonumber(value))
    elseif op == 'hincrbyfloat' then redis.call('HINCRBYFLOAT', key, field, value)
    elseif op == 'spend' then
      -- USD of a model request, counted in the session's spend of the day (a new day starts at 0)
      local day = day_of(now)
      if tonumber(redis.call('HGET', base, 'spend_day') or '') ~= day then
        redis.call('HSET', base, 'spend_day', day, 'spend_today', value)
      else
        redis.call('HINCRBYFLOAT', base, 'spend_today', value)
      end
      spent = day
    end
    i = i + 4
  end
  return i, spent, close, take
end

-- Record the event bodies args[i..n]: the seqs of the first and the last (0, 0 for none).
local function emit_all(base, sid, args, i, n, now)
  local first, last = 0, 0
  for j = i, n do
    last = emit(base, sid, args[j], now)
    if first == 0 then first = last end
  end
  return first, last
end

local function cox_emit(keys, args)
  local base = keys[1]
  local sid, token, owner, nops = args[1], args[2], args[3], tonumber(args[4])
  if token ~= '' and not hold(base, token) then return refuse('fenced', 'lease lost') end
  if token == '' and redis.call('EXISTS', base) == 0 then return refuse('not_found', 'no such session') end
  local bad = check_ops(args, 5, nops, token, true)
  if bad then return bad end
  local now = now_ms()
  local i, spent, close, take = run_ops(base, args, 5, nops, now)
  local first, last = emit_all(base, sid, args, i, #args, now)
  -- The take_leads op (a safe boundary's record): the Leads saved so far are applied after its
  -- events, in the same call as the skips before them.
  local taken = nil
  if take ~= nil then
    local applied
    taken, applied = take_leads(base, sid, take, now)
    if applied > 0 then
      if first == 0 then first = applied - #taken end
      last = applied
    end
  end
  -- What waits for the holder's next boundary, so it need not ask again.
  local leads, observed = redis.call('LLEN', base .. ':leadq'), redis.call('LLEN', base .. ':observed')
  -- The close_leads op (the turn's final response, recorded with nothing left to wait for): Lead
  -- admission closes here as cox_close_leads closes it, with one call fewer for the turn.
  local closed = close and close_leads(base, leads)
  -- taken only when some were (Redis's cjson writes an empty table as an object)
  if taken ~= nil and #taken == 0 then taken = nil end
  if spent ~= nil then
    return with_pub(base, owner, reply({ first = first, last = last, leads = leads, observed = observed, spend_day = spent,
                                         spend_today = tonumber(redis.call('HGET', base, 'spend_today')) or 0,
                                         closed = closed, taken = taken }))
  end
  if taken ~= nil then
    return with_pub(base, owner, reply({ first = first, last = last, leads = leads, observed = observed, closed = closed,
                                         taken = taken }))
  end
  return with_pub(base, owner, reply({ first = first, last = last, leads = leads, observed = observed, closed = closed }))
end

-- Is token still the lease? ARGV: sid, token[, call_id, intent]. With an intent (a staged file
-- write: {path, tmp, ...}), it is recorded in :wip under the same check, before the rename: a
-- takeover finds it there and settles it (cox_runner.drive._settle_writes) before anything else.
local function cox_fence(keys, args)
  local base = keys[1]
  local sid, token, call_id, intent = args[1], args[2], args[3], args[4]
  if not hold(base, token) then return refuse('fenced', 'lease lost') end
  if call_id ~= nil and call_id ~= '' then redis.call('HSET', base .. ':wip', call_id, intent) end
  return { reply({ ok = true }) }
end

-- Automatic title: never over a manual rename, never when auto_title is off.
-- ARGV: sid, token, owner, title, turn_id
local function cox_auto_title(keys, args)
  local base = keys[1]
  local sid, token, owner, title, turn_id = unpack(args)
  if not hold(base, token) then return refuse('fenced', 'lease lost') end
  if redis.call('HGET', base, 'title_source') ~= '' or redis.call('HGET', base, 'auto_title') ~= '1' then
    return { reply({ applied = false }) }
  end
  redis.call('HSET', base, 'title', title, 'title_source', 'auto')
  emit_t(base, sid, { type = 'title.set', turn_id = turn_id, title = title, source = 'auto' }, now_ms())
  return with_pub(base, owner, reply({ applied = true }))
end

-- Close Lead admission before the turn's final work. If Leads are pending, admission stays
-- open and the caller must apply them (the turn continues). ARGV: sid, token
local function cox_close_leads(keys, args)
  local base = keys[1]
  local sid, token = args[1], args[2]
  if not hold(base, token) then return refuse('fenced', 'lease lost') end
  local n = redis.call('LLEN', base .. ':leadq')
  return { reply({ closed = close_leads(base, n), pending = n }) }
end

-- End the running turn and, atomically, start the next waiting message or go idle.
-- ARGV: sid, token, owner, end_body ('' = the turn had no turn.end to write), next_turn_id,
--       lease_ms, plan ('' keep as is, '-' clear, else JSON), handoff ('1': this runner is
--       shutting down; leave the next message for another runner: the session stays busy, the
--       lease is dropped and the session is listed as claimable at once), hold ('1': the
--       services a turn needs do not answer; start nothing: the session stays busy under this
--       lease with its messages waiting, and the runner calls again with no end_body once they answer),
--       agents_md, pause ('' or the JSON of the daily budget the turn reached: {budget, limit,
--       spent, day, detail}; the session pauses, see "daily budgets" above; a Stopped turn does not),
--       then, as cox_emit's, nops, nops*4 op fields and event bodies: the turn's final record,
--       carried (its final response: one call for the record and the end, not two). They are
--       recorded first; with a close_leads op among them and a Lead waiting (no Stop asked), the
--       turn does not end: the reply is { next = null, ended = '', goes_on = true, leads, last }
--       and the holder applies the Leads and goes on, calling again at its end. Every reply's
--       last is the seq of the last carried event (0: none).
-- A paused session starts nothing: it goes idle with its messages waiting.
-- A Stop answered with this turn's id promised that it ends 'stopped' (cox_stop set the flag in
-- the same ordering as this call): a runner that decided another ending a moment before it
-- could see the Stop records 'stopped', the ending it had decided kept in the detail. A turn
-- that ended 'stopped' or 'crashed' (a takeover's) keeps its own ending.
local KEEPS_OWN_ENDING = { stopped = true, crashed = true }
local function stopped_end(end_body)
  local body = cjson.decode(end_body)
  if KEEPS_OWN_ENDING[body.outcome] then return end_body end
  local had = 'it would have ended ' .. tostring(body.outcome)
  if type(body.detail) == 'string' and body.detail ~= '' then had = had .. ': ' .. body.detail end
  body.outcome = 'stopped'
  body.detail = 'stop requested as the turn was ending (' .. had .. ')'
  return cjson.encode(body)
end

local function cox_turn_end(keys, args)
  local base = keys[1]
  local sid, token, owner, end_body, next_turn_id, lease_ms, plan, handoff, hold_next, agents_md, pause = unpack(args)
  lease_ms = tonumber(lease_ms)
  if not hold(base, token) then return refuse('fenced', 'lease lost') end
  local nops = tonumber(args[12]) or 0
  local bad = check_ops(args, 13, nops, token, false)
  if bad then return bad end
  if end_body ~= '' and redis.call('EXISTS', base .. ':open') == 1 then
    -- a tool call of the turn has no result yet: the runner closes it (with the writes it left)
    -- and ends the turn again; checked here so a turn whose calls all closed reads nothing first
    return refuse('open_calls', 'a tool call of the turn is still open')
  end
  local now = now_ms()
  local i, _, close = run_ops(base, args, 13, nops, now)
  local _, carried = emit_all(base, sid, args, i, #args, now)
  if close then
    local leads = redis.call('LLEN', base .. ':leadq')
    if not close_leads(base, leads) then
      return with_pub(base, owner, reply({ next = cjson.null, ended = '', goes_on = true, leads = leads,
                                           last = carried }))
    end
  end
  local turn_id = redis.call('HGET', base, 'turn_id')
  local stop_flag = redis.call('HGET', base, 'stop')
  if plan == '-' then redis.call('HDEL', base, 'plan')
  elseif plan ~= '' then redis.call('HSET', base, 'plan', plan) end
  local run = run_of(base)
  if pause == nil or turn_id == '' or end_body == '' or stop_flag == 'stop' then pause = '' end
  if end_body ~= '' and turn_id ~= '' then
    dismiss_approvals(base, sid, turn_id, now)
    unapply_leads(base, sid, turn_id, now)
    if stop_flag == 'stop' then end_body = stopped_end(end_body) end
    emit(base, sid, end_body, now)
    if pause ~= '' then
      -- a daily budget is reached: the session pauses, its waiting messages stay waiting
      local p = cjson.decode(pause)
      redis.call('HSET', base, 'budget', pause)
      redis.call('ZADD', paused_of(base), now, sid)
      emit_t(base, sid, { type = 'budget.reached', turn_id = turn_id, budget = p.budget, limit = p.limit,
                          spent = p.spent, waiting = waiting_count(base) }, now)
    end
    if running(run) then
      -- The run goes on or ends here, in the call that ends the turn: exactly one 'continue' per
      -- unfinished turn, whichever runner (or takeover) ends it.
      local outcome = cjson.decode(end_body).outcome
      run.last = outcome
      if outcome == 'completed' then end_run(base, sid, run, 'completed', now)
      elseif stop_flag == 'stop' then end_run(base, sid, run, 'stopped', now)
      elseif pause ~= '' then end_run(base, sid, run, 'spend_limit', now)
      elseif RUN_CANNOT_CONTINUE[outcome] then end_run(base, sid, run, outcome, now)
      elseif (tonumber(run.turns) or 0) >= (tonumber(run.max_turns) or 1) then end_run(base, sid, run, 'max_turns', now)
      else
        redis.call('HSET', base, 'run', cjson.encode(run))
        -- its id follows the next turn's id: unique, and the same on a replay of this call
        local mid = 'm' .. string.sub(next_turn_id, 2)
        redis.call('RPUSH', base .. ':q', cjson.encode({ message_id = mid, text = 'continue', mode = 'run',
                                                          traceparent = run.traceparent }))
      end
    end
  end
  redis.call('DEL', base .. ':open')
  redis.call('HSET', base, 'turn_id', '', 'message_id', '', 'stop', '', 'lead_closed', '0', 'op', '')
  local b = budget_of(base)
  if b ~= nil and tonumber(b.day) ~= day_of(now) then
    lift(base, sid, b, 'day', now)
    b = nil
  end
  if b ~= nil then
    -- paused: nothing more starts (the messages wait, in order, for cox_budget_resume)
    release(base, sid, now)
    return with_pub(base, owner, reply({ next = cjson.null, ended = turn_id, paused = true, last = carried }))
  end
  if handoff == '1' and waiting_count(base) > 0 then
    redis.call('DEL', base .. ':lease')
    redis.call('ZADD', leases_of(base), 0, sid)
    redis.call('HSET', base, 'runner', '', 'token', '')
    return with_pub(base, owner, reply({ next = cjson.null, ended = turn_id, handed_off = true, last = carried }))
  end
  local waiting = waiting_count(base)
  if hold_next == '1' and waiting > 0 then
    redis.call('PEXPIRE', base .. ':lease', lease_ms)
    redis.call('ZADD', leases_of(base), now + lease_ms, sid)
    return with_pub(base, owner, reply({ next = cjson.null, ended = turn_id, held = true, last = carried }))
  end
  local raw = redis.call('LPOP', base .. ':sq')
  if not raw then raw = redis.call('LPOP', base .. ':q') end
  if raw then
    local msg = cjson.decode(raw)
    redis.call('PEXPIRE', base .. ':lease', lease_ms)
    redis.call('ZADD', leases_of(base), now + lease_ms, sid)
    local fresh = begin_turn(base, sid, msg, next_turn_id, now, agents_md)
    return with_pub(base, owner, reply({ next = msg, turn_id = next_turn_id, ended = turn_id, info = info_of(base),
      fresh = fresh or nil, last = carried, observed = redis.call('LLEN', base .. ':observed') }))
  end
  run = run_of(base)
  if running(run) then
    -- Going idle with the run still marked running: its 'continue' was discarded (a Stop while the
    -- session was held between turns). An idle session is never a running run.
    end_run(base, sid, run, stop_flag == 'stop' and 'stopped' or (run.last or 'stopped'), now)
  end
  release(base, sid, now)
  return with_pub(base, owner, reply({ next = cjson.null, ended = turn_id, last = carried }))
end

-- A short lease for a person's write while idle (restore, undo). ARGV: sid, principal, runner, lease_ms, op
local function cox_op_begin(keys, args)
  local base = keys[1]
  local sid, principal, runner, lease_ms, op = unpack(args)
  if not session_of(base, principal) then return refuse('not_found', 'no such session') end
  if busy(base) then
    return refuse('busy', 'a turn is running: stop it or wait before ' .. op)
  end
  local token = take_lease(base, sid, runner, tonumber(lease_ms), now_ms())
  redis.call('HSET', base, 'op', op)
  return { reply({ token = token }) }
end

-- ------------------------------------------------------------------ daily budgets: resume, a principal's spend

-- Does a paused session go on? Asked after an admin changed its spend_limit (by 'patch') and, on
-- every turn-runner, after the configured budgets were reloaded (by 'reload'). It goes on when
-- both of today's budgets are now above what was spent (or the pause was of an earlier day): the
-- pause is lifted (budget.resumed) and, idle, its first waiting message starts (the others follow
-- in order, as after any turn). Otherwise nothing changes. ARGV: sid, owner, session_spend
-- ([limits] session_spend, '' = none), principal_usd (the principal's spend today, read by the
-- runner: another slot), principal_spend ('' = none), runner, lease_ms, turn_id, agents_md, by
local function cox_budget_resume(keys, args)
  local base = keys[1]
  local sid, owner, session_spend, principal_usd, principal_spend, runner, lease_ms, turn_id, agents_md, by =
    unpack(args)
  local b = budget_of(base)
  if b == nil then
    -- not paused, or not in Redis (archived: its next use loads it back and lists it again)
    redis.call('ZREM', paused_of(base), sid)
    return { reply({ resumed = false, paused = false }) }
  end
  local now = now_ms()
  local today = day_of(now)
  if tonumber(b.day) == today then
    local limit = tonumber(redis.call('HGET', base, 'spend_limit') or '') or tonumber(session_spend)
    local spent = 0
    if tonumber(redis.call('HGET', base, 'spend_day') or '') == today then
      spent = tonumber(redis.call('HGET', base, 'spend_today')) or 0
    end
    if limit ~= nil and spent >= limit then
      return { reply({ resumed = false, paused = true, budget = 'session_spend' }) }
    end
    local plimit = tonumber(principal_spend)
    if plimit ~= nil and (tonumber(principal_usd) or 0) >= plimit then
      return { reply({ resumed = false, paused = true, budget = 'principal_spend' }) }
    end
  else
    by = 'day'
  end
  lift(base, sid, b, by, now)
  local res = { resumed = true, paused = false }
  if not busy(base) then
    local started = start_waiting(base, sid, runner, tonumber(lease_ms), turn_id, now, agents_md)
    if started ~= nil then
      res.next = started.next
      res.token = started.token
      res.turn_id = started.turn_id
      res.runner = started.runner
      res.fresh = started.fresh
    end
  end
  return with_pub(base, owner, reply(res))
end

-- A principal's spend of the day (UTC, Redis's clock), across its sessions: KEYS the principal's
-- spend hash {day, usd} (coxswain.keys.principal_spend; one key a principal, its own slot).
-- ARGV: add (USD to add, '0' to read). A new day starts at 0.
local function cox_spend(keys, args)
  local key = keys[1]
  local add = args[1]
  local day = day_of(now_ms())
  if tonumber(redis.call('HGET', key, 'day') or '') ~= day then
    redis.call('HSET', key, 'day', day, 'usd', '0')
  end
  if (tonumber(add) or 0) > 0 then redis.call('HINCRBYFLOAT', key, 'usd', add) end
  return { reply({ day = day, usd = tonumber(redis.call('HGET', key, 'usd')) or 0 }) }
end

-- ------------------------------------------------------------------ takeover

-- Claim sessions whose lease expired (their runner died or stalled), in the buckets named.
-- KEYS: lease indexes of buckets (one in a cluster, where a call stays in one slot; on one server
-- every bucket in one call). ARGV: runner, lease_ms, limit (over all the buckets of the call)
local function cox_claim(keys, args)
  local runner, lease_ms, limit = args[1], tonumber(args[2]), tonumber(args[3])
  local now = now_ms()
  local out = {}
  for k = 1, #keys do
    if #out >= limit then break end
    local leases, tag = keys[k], tag_of(keys[k])
    local sids = redis.call('ZRANGEBYSCORE', leases, '-inf', now, 'LIMIT', 0, limit - #out)
    for i = 1, #sids do
      local sid = sids[i]
      local base = 'cox:s:' .. tag .. ':' .. sid
      local ttl = redis.call('PTTL', base .. ':lease')
      if ttl > 0 then
        redis.call('ZADD', leases, now + ttl, sid)
      elseif redis.call('EXISTS', base) == 0 or not busy(base) then
        redis.call('ZREM', leases, sid)
      else
        local old = redis.call('HGET', base, 'runner')
        local token = take_lease(base, sid, runner, lease_ms, now)
        local open = redis.call('HGETALL', base .. ':open')
        out[#out + 1] = { sid = sid, token = token, turn_id = redis.call('HGET', base, 'turn_id'),
                          old_runner = old, open = open, op = redis.call('HGET', base, 'op') }
      end
    end
  end
  return { cjson.encode(out) }
end

-- ------------------------------------------------------------------ outbox publishing

-- The stream now holds the session's events up to seq last (published in order, so every one
-- before it too), the last of them in the message at stream seq stream ('' if unknown: the
-- position is dropped). ARGV: sid, owner, last, stream. Trimmed by seq, not by a count: a
-- publisher whose lock lapsed under it can never drop an entry nobody published.
local function cox_pub_done(keys, args)
  local base = keys[1]
  local sid, owner, last, stream = args[1], args[2], tonumber(args[3]), args[4]
  if redis.call('GET', base .. ':publock') ~= owner then return refuse('lost', 'publish lock lost') end
  if stream ~= nil and string.match(stream, '^%d+$') then
    redis.call('HSET', base, 'pubpos', last .. ':' .. stream)
  else
    redis.call('HDEL', base, 'pubpos')
  end
  -- The outbox holds consecutive seqs: the entry that holds last is as far from the head as last
  -- is from the head's seq, and everything up to it goes in one LTRIM (an entry popped at a time
  -- was two commands an event). Anything else, and the entries go one at a time, by their seqs.
  local head = redis.call('LINDEX', base .. ':outbox', 0)
  local head_seq = head and seq_of(head)
  if head_seq ~= nil and head_seq <= last then
    local at = redis.call('LINDEX', base .. ':outbox', last - head_seq)
    if at and seq_of(at) == last then
      redis.call('LTRIM', base .. ':outbox', last - head_seq + 1, -1)
    else
      while true do
        head = redis.call('LINDEX', base .. ':outbox', 0)
        if not head then break end
        local seq = seq_of(head)
        if seq == nil or seq > last then break end
        redis.call('LPOP', base .. ':outbox')
      end
    end
  end
  if redis.call('LLEN', base .. ':outbox') > 0 then
    redis.call('PEXPIRE', base .. ':publock', PUB_LOCK_MS)
    local out = { reply({ more = true }) }
    local batch = redis.call('LRANGE', base .. ':outbox', 0, PUB_BATCH - 1)
    for i = 1, #batch do out[#out + 1] = batch[i] end
    handed(base, batch, true)
    return out
  end
  redis.call('DEL', base .. ':publock', base .. ':pubhw')
  redis.call('ZREM', dirty_of(base), sid)
  return { reply({ more = false }) }
end

-- The members scored longer ago than age_ms of the zsets named (at most limit in all): a plain
-- array of sids. Sweeper (cox_dirty): sessions whose outbox has waited longer than min_age_ms,
-- KEYS the dirty indexes of buckets. Archiver (cox_idle, below): sessions whose last event is
-- older than idle_ms, KEYS the activity indexes. One bucket's index in a cluster; every bucket's
-- on one server.
local function older_than(keys, age_ms, limit)
  local cutoff = now_ms() - age_ms
  local out = {}
  for k = 1, #keys do
    if #out >= limit then break end
    local got = redis.call('ZRANGEBYSCORE', keys[k], '-inf', cutoff, 'LIMIT', 0, limit - #out)
    for i = 1, #got do out[#out + 1] = got[i] end
  end
  return out
end

-- ARGV: min_age_ms, limit
local function cox_dirty(keys, args)
  local min_age_ms, limit = tonumber(args[1]), tonumber(args[2])
  return older_than(keys, min_age_ms, limit)
end

-- Take the publish lock of a session found by the sweeper. ARGV: sid, owner
local function cox_pub_claim(keys, args)
  local base = keys[1]
  local sid, owner = args[1], args[2]
  if redis.call('LLEN', base .. ':outbox') == 0 then
    redis.call('ZREM', dirty_of(base), sid)
    return { reply({ claimed = false }) }
  end
  return with_pub(base, owner, reply({ claimed = true }), false)
end

redis.register_function('cox_create', entry(once(cox_create)))
redis.register_function('cox_patch', entry(once(cox_patch)))
redis.register_function('cox_send', entry(once(cox_send)))
redis.register_function('cox_lead', entry(once(cox_lead)))
redis.register_function('cox_stop', entry(once(cox_stop)))
redis.register_function('cox_answer', entry(once(cox_answer)))
redis.register_function('cox_renew', entry(cox_renew))
redis.register_function('cox_emit', entry(once(cox_emit)))
redis.register_function('cox_auto_title', entry(once(cox_auto_title)))
redis.register_function('cox_fence', entry(cox_fence))
redis.register_function('cox_close_leads', entry(once(cox_close_leads)))
redis.register_function('cox_turn_end', entry(once(cox_turn_end)))
redis.register_function('cox_op_begin', entry(once(cox_op_begin)))
redis.register_function('cox_budget_resume', entry(once(cox_budget_resume)))
redis.register_function('cox_spend', entry(once(cox_spend)))
redis.register_function('cox_claim', entry(cox_claim))
redis.register_function('cox_pub_done', entry(cox_pub_done))
redis.register_function('cox_dirty', entry(cox_dirty))
redis.register_function('cox_pub_claim', entry(cox_pub_claim))

-- ------------------------------------------------------------------ workspaces
-- Who owns which workspace (docs/api.md "Workspaces"). Every workspace key carries the hash tag
-- {ws}: one slot, so a claim sees every other workspace at once and two claims (two principals
-- racing for one name, or for "w1" and "w1/d") are ordered by Redis. KEYS: the owners hash
-- (name -> principal), the lex-ordered name index (zset, score 0), the owner's index (zset name
-- -> created ms). ARGV: name (relative to the root, '/'-separated, never ''), owner.
-- Answers the workspace's owner; created = true when this call made the record. A name inside
-- or around a recorded workspace is refused workspace_nested (nothing is written).
local function cox_ws_claim(keys, args)
  local owners, names, mine = keys[1], keys[2], keys[3]
  local name, owner = args[1], args[2]
  local have = redis.call('HGET', owners, name)
  if have then return { reply({ owner = have, created = false }) } end
  local prefix = ''
  for part in string.gmatch(name, '[^/]+') do
    if prefix ~= '' then
      if redis.call('HEXISTS', owners, prefix) == 1 then
        return refuse('workspace_nested', 'that folder is inside another workspace')
      end
      prefix = prefix .. '/' .. part
    else
      prefix = part
    end
  end
  -- '0' follows '/' in byte order: [name/, (name0) is every name beneath this one
  local under = redis.call('ZRANGEBYLEX', names, '[' .. name .. '/', '(' .. name .. '0', 'LIMIT', 0, 1)
  if #under > 0 then return refuse('workspace_nested', 'that folder holds another workspace') end
  redis.call('HSET', owners, name, owner)
  redis.call('ZADD', names, 0, name)
  redis.call('ZADD', mine, now_ms(), name)
  return { reply({ owner = owner, created = true }) }
end

-- Drop a claim this owner made and could not use (a fork whose copy failed). ARGV: name, owner.
local function cox_ws_release(keys, args)
  local owners, names, mine = keys[1], keys[2], keys[3]
  local name, owner = args[1], args[2]
  if redis.call('HGET', owners, name) ~= owner then return { reply({ released = false }) } end
  redis.call('HDEL', owners, name)
  redis.call('ZREM', names, name)
  redis.call('ZREM', mine, name)
  return { reply({ released = true }) }
end

redis.register_function('cox_ws_claim', entry(cox_ws_claim))
redis.register_function('cox_ws_release', entry(cox_ws_release))

-- ------------------------------------------------------------------ queue management
-- A person may remove or reorder queued messages before they start. Each is one call that
-- changes the queue and records it (queue.removed / queue.reordered): never silent. A message
-- that has left the queue (it started, or Stop discarded it) is refused with not_queued; a
-- steer is not in the queue a person manages (it starts as soon as the turn stops).

-- ARGV: sid, principal, message_id, owner
local function cox_queue_remove(keys, args)
  local base = keys[1]
  local sid, principal, message_id, owner = unpack(args)
  if not session_of(base, principal) then return refuse('not_found', 'no such session') end
  local q = redis.call('LRANGE', base .. ':q', 0, -1)
  for i = 1, #q do
    local msg = cjson.decode(q[i])
    if msg.message_id == message_id then
      redis.call('LREM', base .. ':q', 1, q[i])
      local now = now_ms()
      local t = { type = 'queue.removed', message_id = message_id, text = msg.text, mode = 'queue' }
      local tid = redis.call('HGET', base, 'turn_id')
      if tid and tid ~= '' then t.turn_id = tid end
      emit_t(base, sid, t, now)
      return with_pub(base, owner, reply({ message_id = message_id, removed = true,
                                           queue = ids_of(redis.call('LRANGE', base .. ':q', 0, -1)) }))
    end
  end
  local sq = redis.call('LRANGE', base .. ':sq', 0, -1)
  for i = 1, #sq do
    if cjson.decode(sq[i]).message_id == message_id then
      return refuse('not_queued', 'a steer starts as soon as the running turn stops; it cannot be removed')
    end
  end
  return refuse('not_queued', 'that message is not waiting in the queue (it has started, or Stop discarded it)')
end

-- ARGV: sid, principal, owner, then every queued message_id in the new order (a permutation of
-- the queue as it is now; otherwise not_queued: a message started meanwhile, or the list is wrong)
local function cox_queue_order(keys, args)
  local base = keys[1]
  local sid, principal, owner = args[1], args[2], args[3]
  if not session_of(base, principal) then return refuse('not_found', 'no such session') end
  local q = redis.call('LRANGE', base .. ':q', 0, -1)
  local by_id = {}
  for i = 1, #q do by_id[cjson.decode(q[i]).message_id] = q[i] end
  local want = {}
  local seen = {}
  for i = 4, #args do
    local id = args[i]
    if by_id[id] == nil or seen[id] then
      return refuse('not_queued', 'the order must list each queued message once; ' .. id ..
                    ' is not waiting in the queue (it may have started)')
    end
    seen[id] = true
    want[#want + 1] = id
  end
  if #want ~= #q then
    return refuse('not_queued', 'the order must list every queued message (the queue changed: read it again)')
  end
  local same = true
  for i = 1, #q do if cjson.decode(q[i]).message_id ~= want[i] then same = false end end
  if same then return { reply({ queue = want, changed = false }) } end
  redis.call('DEL', base .. ':q')
  for i = 1, #want do redis.call('RPUSH', base .. ':q', by_id[want[i]]) end
  local t = { type = 'queue.reordered', message_ids = want }
  local tid = redis.call('HGET', base, 'turn_id')
  if tid and tid ~= '' then t.turn_id = tid end
  emit_t(base, sid, t, now_ms())
  return with_pub(base, owner, reply({ queue = want, changed = true }))
end

redis.register_function('cox_queue_remove', entry(once(cox_queue_remove)))
redis.register_function('cox_queue_order', entry(once(cox_queue_order)))

-- ------------------------------------------------------------------ idle sessions: archive and reload
-- An idle session's keys can be saved to the archive (a JetStream KV bucket, written by the
-- runner between these calls) and dropped; its next use loads them back (docs/design.md,
-- "Idle sessions"). Every event moves the session in its bucket's activity index
-- (cox:active:{b<n>}, see emit), which the archiver scans.

-- The session's keys (the suffixes named, in that order) as canonical JSON:
-- [[suffix, type, values], ...], a hash's fields and a set's members sorted, so the same state
-- always encodes to the same text (its sha1 tells whether anything changed since).
local function snapshot_of(base, suffixes)
  flush()
  local out = {}
  for i = 1, #suffixes do
    local sfx = suffixes[i]
    local key = base .. sfx
    local t = redis.call('TYPE', key)['ok']
    if t == 'hash' then
      local flat = redis.call('HGETALL', key)
      local names, by = {}, {}
      for j = 1, #flat, 2 do
        -- pubpos is the publisher's hint (cox_pub_done), not the session's state: it moves when
        -- session.archived itself is published, and a session restored without it looks it up
        if not (sfx == '' and flat[j] == 'pubpos') then
          names[#names + 1] = flat[j]
          by[flat[j]] = flat[j + 1]
        end
      end
      table.sort(names)
      local vals = {}
      for j = 1, #names do
        vals[#vals + 1] = names[j]
        vals[#vals + 1] = by[names[j]]
      end
      out[#out + 1] = { sfx, 'hash', vals }
    elseif t == 'list' then
      out[#out + 1] = { sfx, 'list', redis.call('LRANGE', key, 0, -1) }
    elseif t == 'set' then
      local m = redis.call('SMEMBERS', key)
      table.sort(m)
      out[#out + 1] = { sfx, 'set', m }
    elseif t == 'string' then
      out[#out + 1] = { sfx, 'string', { redis.call('GET', key) } }
    elseif t ~= 'none' then
      return nil
    end
  end
  return cjson.encode(out)
end

-- Why the session may not be archived now ('' = it may): something runs, waits or is unpublished.
local function unarchivable(base)
  flush()
  if busy(base) then return 'busy' end
  if redis.call('EXISTS', base .. ':lease') == 1 then return 'leased' end
  if redis.call('EXISTS', base .. ':plock') == 1 then return 'programs running' end
  if waiting_count(base) > 0 then return 'queued' end
  if redis.call('LLEN', base .. ':leadq') > 0 then return 'leads pending' end
  if redis.call('LLEN', base .. ':outbox') > 0 then return 'outbox not published' end
  if redis.call('HLEN', base .. ':wip') > 0 then return 'writes to settle' end
  local appr = redis.call('HVALS', base .. ':appr')
  for i = 1, #appr do
    if cjson.decode(appr[i]).state == 'pending' then return 'approval open' end
  end
  return ''
end

-- Start archiving an idle session: record session.archived (body) and answer the snapshot of
-- its keys after it, with its sha1 and seq. Refused not_idle (nothing recorded) while it is not
-- idle for idle_ms or cannot be archived (then its activity is set to now: it is looked at
-- again an idle period later, not on every pass). ARGV: sid, idle_ms, owner, body, suffixes...
local function cox_archive_take(keys, args)
  local base = keys[1]
  local sid, idle_ms, owner, body = args[1], tonumber(args[2]), args[3], args[4]
  local suffixes = {}
  for i = 5, #args do suffixes[#suffixes + 1] = args[i] end
  if redis.call('EXISTS', base) == 0 then
    redis.call('ZREM', active_of(base), sid)
    return refuse('not_found', 'no such session')
  end
  local now = now_ms()
  local last = redis.call('ZSCORE', active_of(base), sid)
  if last and tonumber(last) > now - idle_ms then return refuse('not_idle', 'used recently') end
  local why = unarchivable(base)
  if why ~= '' then
    redis.call('ZADD', active_of(base), now, sid)
    return refuse('not_idle', why)
  end
  local seq = emit(base, sid, body, now)
  local snapshot = snapshot_of(base, suffixes)
  if snapshot == nil then return refuse('invalid', 'a session key has an unexpected type') end
  return with_pub(base, owner, reply({ seq = seq, sha = redis.sha1hex(snapshot), snapshot = snapshot,
                                       principal = redis.call('HGET', base, 'principal') }))
end

-- Drop an archived session's keys, only if nothing changed since cox_archive_take answered this
-- seq and sha (its session.archived event published: the outbox is empty) and nothing runs.
-- Otherwise nothing is dropped (the session stays; the archive's copy is ignored while it does).
-- ARGV: sid, seq, sha, suffixes...
local function cox_archive_drop(keys, args)
  local base = keys[1]
  local sid, seq, sha = args[1], args[2], args[3]
  local suffixes = {}
  for i = 4, #args do suffixes[#suffixes + 1] = args[i] end
  if redis.call('EXISTS', base) == 0 then return { reply({ dropped = false, reason = 'gone' }) } end
  if redis.call('HGET', base, 'seq') ~= seq then return { reply({ dropped = false, reason = 'changed' }) } end
  local why = unarchivable(base)
  if why ~= '' then return { reply({ dropped = false, reason = why }) } end
  local snapshot = snapshot_of(base, suffixes)
  if snapshot == nil or redis.sha1hex(snapshot) ~= sha then return { reply({ dropped = false, reason = 'changed' }) } end
  for i = 1, #suffixes do redis.call('DEL', base .. suffixes[i]) end
  redis.call('DEL', base .. ':lease', base .. ':outbox', base .. ':publock', base .. ':pubhw')
  redis.call('ZREM', active_of(base), sid)
  redis.call('ZREM', dirty_of(base), sid)
  redis.call('ZREM', leases_of(base), sid)
  redis.call('ZREM', paused_of(base), sid)
  return { reply({ dropped = true }) }
end

-- Load an archived session's keys back (its snapshot from cox_archive_take) and record
-- session.restored (body), unless the session is in Redis already (another reload was first,
-- or it was never dropped): then nothing changes. ARGV: sid, snapshot, seq, owner, body
local function cox_archive_load(keys, args)
  local base = keys[1]
  local sid, snapshot, seq, owner, body = unpack(args)
  if redis.call('EXISTS', base) == 1 then return { reply({ restored = false }) } end
  local entries = cjson.decode(snapshot)
  for i = 1, #entries do
    local sfx, t, vals = entries[i][1], entries[i][2], entries[i][3]
    local key = base .. sfx
    if t == 'hash' then
      for j = 1, #vals, 2 do redis.call('HSET', key, vals[j], vals[j + 1]) end
    elseif t == 'list' then
      for j = 1, #vals do redis.call('RPUSH', key, vals[j]) end
    elseif t == 'set' then
      for j = 1, #vals do redis.call('SADD', key, vals[j]) end
    elseif t == 'string' then
      redis.call('SET', key, vals[1])
    end
  end
  if redis.call('HGET', base, 'seq') ~= seq then
    -- a snapshot that disagrees with its own record: leave nothing half loaded
    for i = 1, #entries do redis.call('DEL', base .. entries[i][1]) end
    return refuse('invalid', 'the archived snapshot does not hold seq ' .. seq)
  end
  local now = now_ms()
  if budget_of(base) ~= nil then redis.call('ZADD', paused_of(base), now, sid) end
  emit(base, sid, body, now)
  return with_pub(base, owner, reply({ restored = true }))
end

-- ARGV: idle_ms, limit
local function cox_idle(keys, args)
  local idle_ms, limit = tonumber(args[1]), tonumber(args[2])
  return older_than(keys, idle_ms, limit)
end

redis.register_function('cox_idle', entry(cox_idle))
redis.register_function('cox_archive_take', entry(once(cox_archive_take)))
redis.register_function('cox_archive_drop', entry(cox_archive_drop))
redis.register_function('cox_archive_load', entry(cox_archive_load))
-- ------------------------------------------------------------------ fork

-- A fork: a new session, made as cox_create makes one, whose log begins with the transcript it
-- was forked with, all in this one call (no send can slip in before the copied history).
-- ARGV: sid, principal, workspace, model, title, owner, created_body, then the bodies of the
-- copied events and of the session.forked event, in order. The caller wrote the principal
-- index entry before (another slot).
local function cox_fork(keys, args)
  local base = keys[1]
  local sid, principal, workspace, model, title, owner, body = args[1], args[2], args[3], args[4], args[5],
    args[6], args[7]
  local res = cox_create(keys, { sid, principal, workspace, model, title, body, '' })
  if cjson.decode(res[1]).error ~= nil then return res end
  local now = now_ms()
  redis.call('HDEL', base, 'blank')  -- its log holds the source's conversation
  for j = 8, #args do emit(base, sid, args[j], now) end
  return with_pub(base, owner, res[1])
end

redis.register_function('cox_fork', entry(once(cox_fork)))

-- ------------------------------------------------------------------ runs

-- A run: a new session, made as cox_create makes one, marked a run (run.start) and its first
-- turn begun, all in this one call (docs/api.md, "Runs"). ARGV: sid, principal, workspace, model,
-- title, created_body, owner, message_id, text, runner, lease_ms, turn_id, agents_md, run (JSON:
-- {confirm, unattended, max_turns, traceparent?}), start_body (the run.start event). The caller wrote the
-- principal's index entries before (other slots).
local function cox_run(keys, args)
  local base = keys[1]
  local sid, principal, workspace, model, title, body, owner, message_id, text, runner, lease_ms, turn_id, agents_md, run, start_body =
    unpack(args)
  if model == '' then return refuse('not_accepting', 'no model is chosen for this run') end
  local res = cox_create(keys, { sid, principal, workspace, model, title, body, '' })
  if cjson.decode(res[1]).error ~= nil then return res end
  local now = now_ms()
  local r = cjson.decode(run)
  r.state = 'running'
  r.turns = 0
  redis.call('HSET', base, 'run', cjson.encode(r))
  emit(base, sid, start_body, now)
  local token = take_lease(base, sid, runner, tonumber(lease_ms), now)
  -- the caller's trace context (run.traceparent) goes with each of the run's turns
  begin_turn(base, sid, { message_id = message_id, text = text, mode = 'send', traceparent = r.traceparent }, turn_id,
    now, agents_md)
  return with_pub(base, owner, reply({ sid = sid, created = now, token = token, turn_id = turn_id,
    info = info_of(base) }))
end

redis.register_function('cox_run', entry(once(cox_run)))

-- The stack's bound on run turns driven at once ([runs] max_active): a semaphore whose slots are
-- leased like the sessions (a slot lapses unless its holder renews it within lease_ms). A member
-- is runner|sid|token: fenced by the session lease's token, so a takeover's turn takes a slot of
-- its own and the dead runner's lapses. One call per runner and renewal period carries every
-- slot it holds and every run turn of it that waits. A runner gets at most its share of the slots
-- (max over the runners with waiting run turns, rounded up) while others wait too, so runs spread
-- over the runners that have them. Safe to run again: a member granted before counts as granted.
-- KEYS: the slots zset (member -> expiry ms), the pollers zset (runner -> expiry ms).
-- ARGV: runner, max_active, lease_ms, then entries: '+member' renew a slot held, '-member' free it,
-- '?member' take one when there is room (in the order given: first come, first served).
local function cox_run_slots(keys, args)
  local slots, pollers = keys[1], keys[2]
  local runner, max_active, lease_ms = args[1], tonumber(args[2]), tonumber(args[3])
  local now = now_ms()
  redis.call('ZREMRANGEBYSCORE', slots, '-inf', now)
  redis.call('ZREMRANGEBYSCORE', pollers, '-inf', now)
  local granted, wanting = {}, {}
  for i = 4, #args do
    local op, m = string.sub(args[i], 1, 1), string.sub(args[i], 2)
    if op == '-' then redis.call('ZREM', slots, m)
    elseif op == '+' then redis.call('ZADD', slots, now + lease_ms, m)
    elseif op == '?' then
      if redis.call('ZSCORE', slots, m) then
        redis.call('ZADD', slots, now + lease_ms, m)
        granted[#granted + 1] = m
      else
        wanting[#wanting + 1] = m
      end
    end
  end
  if #wanting > 0 then redis.call('ZADD', pollers, now + lease_ms, runner)
  else redis.call('ZREM', pollers, runner) end
  local n = redis.call('ZCARD', slots)
  local npoll = redis.call('ZCARD', pollers)
  local share = math.ceil(max_active / math.max(1, npoll))
  local mine = 0
  local all = redis.call('ZRANGE', slots, 0, -1)
  local prefix = runner .. '|'
  for i = 1, #all do
    if string.sub(all[i], 1, #prefix) == prefix then mine = mine + 1 end
  end
  for i = 1, #wanting do
    if n >= max_active or (npoll > 1 and mine >= share) then break end
    redis.call('ZADD', slots, now + lease_ms, wanting[i])
    granted[#granted + 1] = wanting[i]
    n = n + 1
    mine = mine + 1
  end
  return { reply({ granted = granted, active = n }) }
end

redis.register_function('cox_run_slots', entry(cox_run_slots))
