-- settle: an operator settles a task without a send, owner- and state-checked:
-- `delivered` (the operator confirmed with the user or the provider that the
-- message arrived) or `given_up` (nobody will send it; it leaves the
-- operators' lists). Both keep the permit for a window from now (the
-- message may be at the provider; in Bloom mode the filter's bits do, and
-- the permit goes) and are recorded in `operator_log`.
-- KEYS[1] task, KEYS[2] permit, KEYS[3] dead zset, KEYS[4] awaiting zset
-- (the shard's held index is named after it)
-- ARGV[1] task id, ARGV[2] 'delivered' | 'given_up', ARGV[3] retention ms,
-- ARGV[4] who, ARGV[5] why
-- Returns {'settled', new status} | {'refused', owner id}
--       | {'not_settleable', status} | {'missing'}.
local id, action, retention = ARGV[1], ARGV[2], tonumber(ARGV[3])
local status = redis.call('HGET', KEYS[1], 'status')
if not status then
  return {'missing'}
end
local from = {unknown = 1, dead = 1, failed = 1}
if action == 'delivered' then
  -- A sent task awaiting its receipt may be confirmed by hand too.
  from.sent = 1
elseif action ~= 'given_up' then
  return redis.error_reply('unknown settle action ' .. action)
end
if not from[status] then
  return {'not_settleable', status}
end
local owner = redis.call('GET', KEYS[2])
if owner and owner ~= id then
  return {'refused', owner}
end
local now = now_ms()
local at = n2s(now)
local until_ms = n2s(window_end(KEYS[1], now))
-- Held without expiry while unknown: a window again (window_end).
end_permit(KEYS[1], KEYS[2], id, owner, until_ms, true)
local new = 'failed'
if action == 'delivered' then
  new = 'delivered'
  redis.call('HSET', KEYS[1], 'ever_sent', '1', 'receipt_at', at)
end
-- `check_token` '' fences a reconciler check in flight.
redis.call('HSET', KEYS[1], 'status', new, 'settled_by_operator', action,
  'finished_at', at, 'updated_at', at, 'lease_token', '', 'check_token', '')
log_operator(KEYS[1], now, ARGV[4], action, ARGV[5])
redis.call('ZREM', KEYS[3], id)
redis.call('ZREM', KEYS[4], id)
redis.call('ZREM', held_index(KEYS[4], 'awaiting'), id)
redis.call('PEXPIRE', KEYS[1], retention)
event_follower(KEYS[1], id)()
return {'settled', new}
