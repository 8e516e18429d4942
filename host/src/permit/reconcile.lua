-- reconcile: what one reconciler check of a sent or unknown task decided,
-- fenced by the status the check started from and by its claim's token (a
-- check that outlived its claim, or raced a receipt, writes nothing).
-- Delivered / failed-after-accept go through receipt.lua instead.
-- KEYS[1] task, KEYS[2] permit, KEYS[3] awaiting zset, KEYS[4] ready stream, KEYS[5] dead zset
-- ARGV[1] task id, ARGV[2] check token, ARGV[3] expected status (sent|unknown),
-- ARGV[4] action:
--   later   - check again in ARGV[5] ms (pending, or nothing could tell)
--   untrack - stop checking a sent task (checks exhausted); it stays sent
--   sent    - unknown -> sent: the provider has it, no resend; a receipt or a
--             check ARGV[5] ms later confirms delivery
--   requeue - unknown -> queued: the provider never got it; one new ready
--             entry under the same key and task id (the dispatcher resends);
--             at most ARGV[10] times per task: one more is refused
--             ({'fenced', 'requeued'})
--   dead    - unknown -> dead: checks exhausted and nothing could tell; listed
--             for operators, permit kept for the window (it may have been sent)
-- ARGV[5] ms (see action), ARGV[6] retention ms, ARGV[7] permit grace ms,
-- ARGV[8] reason, ARGV[9] provider message id or '', ARGV[10] most re-queues (requeue),
-- ARGV[11] what the check asked, ARGV[12] its answer, ARGV[13] the answer's detail
-- Every recorded check counts in `reconcile_checks` (completed checks) and
-- appends one JSON line {at, check, asked, answer, detail, action} to
-- `reconcile_log` (the newest 32 kept); `held_cause` and `provider_answer`
-- are never written here, except a missing cause on `dead`.
-- Returns {'done', action} | {'fenced', current status}.
local id, action = ARGV[1], ARGV[4]
local after, retention, grace = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
local status = redis.call('HGET', KEYS[1], 'status')
if status ~= ARGV[3] or redis.call('HGET', KEYS[1], 'check_token') ~= ARGV[2] then
  return {'fenced', status or ''}
end
if action == 'requeue'
    and tonumber(redis.call('HGET', KEYS[1], 'reconcile_requeues') or '0') >= tonumber(ARGV[10]) then
  return {'fenced', 'requeued'}
end
if action ~= 'later' and action ~= 'untrack' and status ~= 'unknown' then
  return redis.error_reply('action ' .. action .. ' applies to unknown tasks only')
end
local valid = {later = 1, untrack = 1, sent = 1, requeue = 1, dead = 1}
if not valid[action] then
  return redis.error_reply('unknown action ' .. action)
end
local now = now_ms()
local at = n2s(now)
local checks = redis.call('HINCRBY', KEYS[1], 'reconcile_checks', 1)
log_step(KEYS[1], cjson.encode({at = now, check = checks, asked = ARGV[11] or '',
  answer = ARGV[12] or '', detail = ARGV[13] or '', action = action}))
local held = held_index(KEYS[3], 'awaiting')
if action == 'later' then
  redis.call('ZADD', KEYS[3], n2s(now + after), id)
  return {'done', action}
elseif action == 'untrack' then
  redis.call('ZREM', KEYS[3], id)
  redis.call('HSET', KEYS[1], 'reconcile_untracked_at', at, 'check_token', '')
  return {'done', action}
end
local owner = redis.call('GET', KEYS[2])
if action == 'sent' then
  redis.call('HSET', KEYS[1], 'status', 'sent', 'ever_sent', '1', 'sent_at', at,
    'finished_at', at, 'updated_at', at, 'last_error', ARGV[8], 'check_token', '')
  if ARGV[9] ~= '' then
    redis.call('HSET', KEYS[1], 'provider_message_id', ARGV[9])
  end
  -- Held without expiry while unknown: a window again (window_end).
  end_permit(KEYS[1], KEYS[2], id, owner, n2s(window_end(KEYS[1], now)), true)
  redis.call('PEXPIRE', KEYS[1], retention)
  event_follower(KEYS[1], id)()
  await(KEYS[1], KEYS[3], id, now, after)
  redis.call('ZREM', held, id)
elseif action == 'requeue' then
  -- One more attempt at least, even if the unknown one was the last allowed.
  local attempts = tonumber(redis.call('HGET', KEYS[1], 'tries') or '0')
  local max = tonumber(redis.call('HGET', KEYS[1], 'max') or '1')
  redis.call('HSET', KEYS[1], 'status', 'queued', 'maybe_sent', '1', 'last_error', ARGV[8],
    'max', n2s(math.max(max, attempts + 1)), 'updated_at', at,
    'lease_token', '', 'check_token', '')
  redis.call('HINCRBY', KEYS[1], 'reconcile_requeues', 1)
  redis.call('HDEL', KEYS[1], 'resend_by')
  local until_ms = n2s(math.max(window_end(KEYS[1], now), now + grace))
  if owner == id then
    redis.call('PEXPIREAT', KEYS[2], until_ms)
  elseif not owner then
    redis.call('SET', KEYS[2], id, 'NX', 'PXAT', until_ms)
  end
  redis.call('XADD', KEYS[4], '*', 'task', id)
  redis.call('ZREM', KEYS[3], id)
  redis.call('ZREM', held, id)
elseif action == 'dead' then
  redis.call('HSET', KEYS[1], 'status', 'dead', 'last_error', ARGV[8], 'finished_at', at,
    'updated_at', at, 'check_token', '', 'maybe_sent', '1')
  -- The cause stays the attempt's; only a task held without one gets this.
  redis.call('HSETNX', KEYS[1], 'held_cause', '{"kind":"query_could_not_tell"}')
  redis.call('ZREM', held, id)
  -- It may have reached the provider: the permit keeps the window.
  end_permit(KEYS[1], KEYS[2], id, owner, n2s(window_end(KEYS[1], now)), false)
  redis.call('PEXPIRE', KEYS[1], retention)
  event_follower(KEYS[1], id)()
  redis.call('ZREM', KEYS[3], id)
  redis.call('ZADD', KEYS[5], at, id)
  redis.call('ZREMRANGEBYSCORE', KEYS[5], '-inf', n2s(now - retention))
else
  return redis.error_reply('unknown action ' .. action)
end
return {'done', action}
