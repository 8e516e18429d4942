-- accept: take the permit of an idempotency key and enqueue its task, atomically.
-- KEYS[1] permit   {ns:shard}:permit:<key>
-- KEYS[2] task     {ns:shard}:task:<task-id>
-- KEYS[3] ready    {ns:shard}:ready            (stream)
-- KEYS[4] index    {ns:shard}:event:<biz_type>:<biz_id>   (optional set)
-- ARGV[1] task id proposed by the caller (becomes the permit's value: its owner)
-- ARGV[2] window in ms
-- ARGV[3] retention of ended tasks in ms (the index lives window + retention)
-- ARGV[4..] task fields, name/value pairs; the first pair is 'key', <idempotency key>
--           (fields no script reads come packed in one JSON field, `spec`:
--           every hash field costs Redis work on this, the hottest path)
-- Returns {'accepted', id} or {'duplicate', owner id, owner status or ''}.
local id = ARGV[1]
local window = tonumber(ARGV[2])
if redis.call('SET', KEYS[1], id, 'NX', 'PX', window) then
  local now = now_ms()
  local at = n2s(now)
  redis.call('HSET', KEYS[2], 'status', 'queued', 'accepted_at', at,
    'updated_at', at, 'attempts', '0', 'window_ms', ARGV[2],
    'event_index', KEYS[4] or '', unpack(ARGV, 4))
  redis.call('XADD', KEYS[3], '*', 'task', id, 'key', ARGV[5])
  if KEYS[4] then
    redis.call('SADD', KEYS[4], id)
    -- extend_or_set in two calls at most, one for a new index (no PTTL):
    -- NX gives an expiry to an index without one; GT only pushes one later.
    local until_ms = n2s(now + window + tonumber(ARGV[3]))
    if redis.call('PEXPIREAT', KEYS[4], until_ms, 'NX') == 0 then
      redis.call('PEXPIREAT', KEYS[4], until_ms, 'GT')
    end
  end
  return {'accepted', id}
end
local owner = redis.call('GET', KEYS[1])
if owner == id then
  -- The same request again (its first answer was lost): same answer.
  return {'accepted', id}
end
-- The owner's task lives in this shard: same hash tag, same slot.
local prefix = string.sub(KEYS[2], 1, #KEYS[2] - #id)
local status = redis.call('HGET', prefix .. owner, 'status')
return {'duplicate', owner, status or ''}
