-- begin: claim a lease on a task for one attempt (fencing token = ARGV[2]).
-- KEYS[1] task, KEYS[2] permit
-- ARGV[1] task id, ARGV[2] lease token, ARGV[3] lease ms, ARGV[4] permit grace ms,
-- ARGV[5] retention ms (for a superseded task)
-- Returns {'begun', attempt, lease_until, reclaimed 0|1, {task fields}, {event record
-- fields: event, meta, payload}} | {'busy', lease_until}
--       | {'settled', status} | {'superseded', owner} | {'missing'}
local id, token = ARGV[1], ARGV[2]
local lease, grace = tonumber(ARGV[3]), tonumber(ARGV[4])
local now = now_ms()
local status = redis.call('HGET', KEYS[1], 'status')
if not status then
  return {'missing'}
end
local stale = false
if status == 'sending' then
  local lease_until = tonumber(redis.call('HGET', KEYS[1], 'lease_until') or '0')
  if lease_until > now then
    return {'busy', n2s(lease_until)}
  end
  -- The worker holding the lease is gone; it may have sent before dying.
  stale = true
elseif status ~= 'queued' and status ~= 'retry_wait' then
  return {'settled', status}
end
local owner = redis.call('GET', KEYS[2])
if not owner then
  -- The permit lapsed while the task waited (queued longer than its window,
  -- or a retry promoted later than the grace): the task takes it back.
  -- (A Bloom mode task takes one here for every attempt: it holds a
  -- permit only while it is open; that is not counted as retaken.)
  redis.call('SET', KEYS[2], id, 'NX', 'PX', lease + grace)
  if not bloom_task(KEYS[1]) then
    redis.call('HINCRBY', KEYS[1], 'permit_retaken', 1)
  end
elseif owner ~= id then
  -- The permit lapsed and a newer task took it: that task sends, this one must not.
  redis.call('HSET', KEYS[1], 'status', 'superseded', 'superseded_by', owner,
    'lease_token', '', 'updated_at', n2s(now), 'finished_at', n2s(now),
    'last_error', 'permit is held by task ' .. owner)
  redis.call('PEXPIRE', KEYS[1], ARGV[5])
  event_follower(KEYS[1], id)()
  return {'superseded', owner}
end
local attempt = redis.call('HINCRBY', KEYS[1], 'attempts', 1)
local lease_until = now + lease
redis.call('HSET', KEYS[1], 'status', 'sending', 'lease_token', token,
  'lease_until', n2s(lease_until), 'attempt_started_at', n2s(now), 'updated_at', n2s(now))
-- When the first attempt started: what a provider's reference window and a
-- status query's lag are counted from (`attempt_started_at` is the last).
redis.call('HSETNX', KEYS[1], 'first_attempt_at', n2s(now))
if stale then
  redis.call('HSET', KEYS[1], 'maybe_sent', '1')
  redis.call('HINCRBY', KEYS[1], 'reclaims', 1)
  -- Whether the vanished worker had handed the message to its channel
  -- (extend.lua marks it just before the send): evidence for the operator.
  local started = redis.call('HGET', KEYS[1], 'request_started_at')
  redis.call('HSET', KEYS[1], 'vanished_request_started', (started and started ~= '') and '1' or '0')
end
-- This attempt has not started its send yet.
redis.call('HDEL', KEYS[1], 'request_started_at')
redis.call('PEXPIREAT', KEYS[2], n2s(lease_until + grace), 'GT')
return {'begun', n2s(attempt), n2s(lease_until), stale and '1' or '0', redis.call('HGETALL', KEYS[1]),
  event_fields(KEYS[1], id)}
