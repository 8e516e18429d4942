-- begin: claim a lease on each of several tasks of one shard for one attempt each
-- (a batch: one call for what would be one call per task; each task's answer is
-- its own, decided as if it were alone).
-- Per task i (from 1), the KEYS and ARGV below at offsets 2*(i-1) and 6*(i-1):
-- KEYS[1] task, KEYS[2] the shard's ready stream; the task's permit is
-- named from its `key` field (lib.lua's permit_name, the task's hash tag:
-- one slot), so a stream entry carries the task id alone
-- ARGV[1] task id, ARGV[2] lease token, ARGV[3] lease ms, ARGV[4] permit grace ms,
-- ARGV[5] retention ms (for a superseded task), ARGV[6] the stream entry the
-- worker holds (empty: none, a caller outside the dispatcher)
-- Returns one answer per task, in order, each {'begun', attempt, lease_until, reclaimed 0|1, {task fields}, {event record
-- fields: event, meta, payload}} | {'busy', lease_until}
--       | {'settled', status} | {'superseded', owner} | {'missing'} | {'gone'}
local function begin_one(task, stream, A, now)
  local id, token = A[1], A[2]
  local lease, grace = tonumber(A[3]), tonumber(A[4])
  -- An entry no longer in the stream was acked as its task was recorded (a
  -- reclaimer can hold one that a slow worker recorded after the claim).
  -- Begun from it, the attempt would have no entry left to re-claim if this
  -- worker died: the task would stay `sending` for good.
  if A[6] ~= '' and #redis.call('XRANGE', stream, A[6], A[6]) == 0 then
    return {'gone'}
  end
  local t = redis.call('HMGET', task, 'status', 'key', 'reclaim_open')
  local status = t[1]
  if not status then
    return {'missing'}
  end
  local permit = permit_name(task, id, t[2] or '')
  local stale = false
  if status == 'sending' then
    local lease_until = tonumber(redis.call('HGET', task, 'lease_until') or '0')
    if lease_until > now then
      return {'busy', n2s(lease_until)}
    end
    -- The worker holding the lease is gone; it may have sent before dying.
    stale = true
  elseif status ~= 'queued' and status ~= 'retry_wait' then
    return {'settled', status}
  end
  -- A re-claimed attempt its worker gave back before deciding on the
  -- vanished worker's send (record.lua's release keeps `reclaim_open`): the
  -- provider may still have that message, so this attempt is a re-claim too.
  local again = not stale and t[3] == '1'
  local owner = redis.call('GET', permit)
  if not owner then
    -- The permit lapsed while the task waited (queued longer than its window,
    -- or a retry promoted later than the grace): the task takes it back.
    -- (A Bloom mode task takes one here for every attempt: it holds a
    -- permit only while it is open; that is not counted as retaken.)
    redis.call('SET', permit, id, 'NX', 'PX', lease + grace)
    if not bloom_task(task) then
      redis.call('HINCRBY', task, 'permit_retaken', 1)
    end
  elseif owner ~= id then
    -- The permit lapsed and a newer task took it: that task sends, this one must not.
    redis.call('HSET', task, 'status', 'superseded', 'superseded_by', owner,
      'lease_token', '', 'updated_at', n2s(now), 'finished_at', n2s(now),
      'last_error', 'permit is held by task ' .. owner)
    redis.call('PEXPIRE', task, A[5])
    event_follower(task, id)()
    return {'superseded', owner}
  end
  local attempt = redis.call('HINCRBY', task, 'tries', 1)
  local lease_until = now + lease
  redis.call('HSET', task, 'status', 'sending', 'lease_token', token,
    'lease_until', n2s(lease_until), 'attempt_started_at', n2s(now), 'updated_at', n2s(now))
  -- When the first attempt started: what a provider's reference window and a
  -- status query's lag are counted from (`attempt_started_at` is the last).
  redis.call('HSETNX', task, 'first_attempt_at', n2s(now))
  if stale then
    redis.call('HSET', task, 'maybe_sent', '1', 'reclaim_open', '1')
    redis.call('HINCRBY', task, 'reclaims', 1)
    -- Whether the vanished worker had handed the message to its channel
    -- (extend.lua marks it just before the send): evidence for the operator.
    local started = redis.call('HGET', task, 'request_started_at')
    redis.call('HSET', task, 'vanished_request_started', (started and started ~= '') and '1' or '0')
  end
  -- This attempt has not started its send yet.
  redis.call('HDEL', task, 'request_started_at')
  redis.call('PEXPIREAT', permit, n2s(lease_until + grace), 'GT')
  return {'begun', n2s(attempt), n2s(lease_until), (stale or again) and '1' or '0', redis.call('HGETALL', task),
    event_fields(task, id)}
end
local n = #KEYS / 2
if n ~= math.floor(n) or #ARGV ~= 6 * n then
  return redis.error_reply('begin: KEYS and ARGV do not hold whole tasks')
end
local now = now_ms()
local answers = {}
for i = 1, n do
  local k, a = 2 * (i - 1), 6 * (i - 1)
  answers[i] = begin_one(KEYS[k + 1], KEYS[k + 2], {unpack(ARGV, a + 1, a + 6)}, now)
end
return answers
