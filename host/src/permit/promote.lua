-- promote: move due retries of one shard from its delayed zset to its ready stream,
-- and tasks whose first attempt quiet hours held back (`queued`, `scheduled_for`).
-- KEYS[1] delayed zset, KEYS[2] ready stream
-- ARGV[1] most entries to move, ARGV[2] task key prefix of the shard ({ns:shard}:task:)
-- Returns how many were taken off the delayed set.
local now = now_ms()
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', n2s(now), 'LIMIT', 0, tonumber(ARGV[1]))
for _, id in ipairs(due) do
  -- Same hash tag as KEYS: same slot on a cluster.
  local status = redis.call('HGET', ARGV[2] .. id, 'status')
  if status == 'retry_wait' or status == 'queued' then
    redis.call('XADD', KEYS[2], '*', 'task', id)
  end
  redis.call('ZREM', KEYS[1], id)
end
return #due
