-- receipt: settle a sent (or unknown) task from a delivery receipt or status query.
-- KEYS[1] task, KEYS[2] permit, KEYS[3] awaiting zset (the entry is removed: settled;
-- so is its entry in the shard's held index)
-- ARGV[1] task id, ARGV[2] new status (delivered|failed), ARGV[3] retention ms,
-- ARGV[4] provider message id or '', ARGV[5] the task's last error or '' (kept as is)
-- The task keeps the retention here: once the delivery ledger holds the
-- outcome, the caller lets it leave Redis (`forget.lua`).
-- Returns {'recorded', status} or {'ignored', current status}.
local id = ARGV[1]
local now = now_ms()
local status = redis.call('HGET', KEYS[1], 'status')
if status ~= 'sent' and status ~= 'unknown' then
  return {'ignored', status or ''}
end
redis.call('HSET', KEYS[1], 'status', ARGV[2], 'ever_sent', '1',
  'receipt_at', n2s(now), 'finished_at', n2s(now), 'updated_at', n2s(now))
if ARGV[4] ~= '' then
  redis.call('HSET', KEYS[1], 'provider_message_id', ARGV[4])
end
if ARGV[5] ~= '' then
  redis.call('HSET', KEYS[1], 'last_error', ARGV[5])
end
-- The provider had it: the permit keeps the window (a held one gets its expiry back).
end_permit(KEYS[1], KEYS[2], id, redis.call('GET', KEYS[2]),
  n2s(window_end(KEYS[1], now)), false)
redis.call('ZREM', KEYS[3], id)
redis.call('ZREM', held_index(KEYS[3], 'awaiting'), id)
local keep = tonumber(ARGV[3])
redis.call('PEXPIRE', KEYS[1], keep)
event_follower(KEYS[1], id)()
return {'recorded', ARGV[2]}
