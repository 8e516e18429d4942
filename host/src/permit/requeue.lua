-- requeue: an operator sends a failed, dead or held (`unknown`) task again,
-- under the same key and task id, owner-checked: the permit is re-taken if it
-- is free or still owned by this task; if another task owns it, nothing
-- changes. An `unknown` task's message may be at the provider: it is
-- requeued only when forced, and a reconciler check in flight is fenced.
-- KEYS[1] task, KEYS[2] permit, KEYS[3] ready stream, KEYS[4] dead zset, KEYS[5] awaiting zset
-- ARGV[1] task id, ARGV[2] retention ms, ARGV[3] '1' to requeue a task that may
-- have reached the provider (an unknown outcome nothing settled yet),
-- ARGV[4] who, ARGV[5] why (appended to `operator_log`)
-- Returns {'requeued', attempts so far, new max attempts} | {'refused', owner id}
--       | {'not_requeueable', status} | {'maybe_sent'} | {'missing'}.
local id, retention = ARGV[1], tonumber(ARGV[2])
local status = redis.call('HGET', KEYS[1], 'status')
if not status then
  return {'missing'}
end
if status ~= 'dead' and status ~= 'failed' and status ~= 'unknown' then
  return {'not_requeueable', status}
end
if status == 'unknown' and ARGV[3] ~= '1' then
  return {'maybe_sent'}
end
-- Compensation must not double-send by accident: a task whose message may
-- be at the provider (never confirmed sent, but an attempt's outcome was
-- unknown) is requeued only when the operator says so.
if ARGV[3] ~= '1' and redis.call('HGET', KEYS[1], 'maybe_sent') == '1'
    and redis.call('HGET', KEYS[1], 'ever_sent') ~= '1' then
  return {'maybe_sent'}
end
local now = now_ms()
local window = tonumber(redis.call('HGET', KEYS[1], 'window') or '0')
local owner = redis.call('GET', KEYS[2])
if owner and owner ~= id then
  return {'refused', owner}
end
if bloom_task(KEYS[1]) then
  -- Bloom mode: the filter's bits guard re-posts; `begin` takes the permit
  -- for the lease when the task is sent again, and its end releases it.
  if owner then
    redis.call('DEL', KEYS[2])
  end
elseif owner then
  -- Still ours (kept for the window after a maybe-sent failure): a fresh window.
  redis.call('PEXPIREAT', KEYS[2], n2s(now + window), 'GT')
else
  redis.call('SET', KEYS[2], id, 'PX', n2s(math.max(window, 1)))
end
-- A fresh attempt budget on top of the attempts made, so attempt numbers stay
-- monotonic (the provider and the ledger see attempt n+1, not 1 again).
local attempts = tonumber(redis.call('HGET', KEYS[1], 'tries') or '0')
local base = redis.call('HGET', KEYS[1], 'max_base')
if not base then
  base = redis.call('HGET', KEYS[1], 'max') or '1'
end
local max = attempts + tonumber(base)
local requeues = tonumber(redis.call('HGET', KEYS[1], 'requeues') or '0') + 1
redis.call('HSET', KEYS[1], 'status', 'queued', 'max', n2s(max),
  'max_base', base, 'requeues', n2s(requeues),
  'requeued_at', n2s(now), 'updated_at', n2s(now), 'lease_token', '',
  'finished_at', '', 'check_token', '')
redis.call('HDEL', KEYS[1], 'resend_by')
redis.call('PERSIST', KEYS[1])
event_follower(KEYS[1], id)()
redis.call('XADD', KEYS[3], '*', 'task', id)
redis.call('ZREM', KEYS[4], id)
redis.call('ZREM', KEYS[5], id)
redis.call('ZREM', held_index(KEYS[5], 'awaiting'), id)
local action = 'requeue'
if ARGV[3] == '1' then
  action = 'requeue (forced)'
end
log_operator(KEYS[1], now, ARGV[4] or '', action, ARGV[5] or '')
return {'requeued', n2s(attempts), n2s(max)}
