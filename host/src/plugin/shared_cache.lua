-- The shared cache of one channel instance (`pushonce:channel/shared-cache`).
-- KEYS[1]: the entry `{<ns>:cache:<channel>}:e:<key>`
-- KEYS[2]: the channel's index `{<ns>:cache:<channel>}:index` (zset: entry
--          key -> expiry in ms), which bounds the entries per channel.
-- ARGV[1]: op: `set`, `cas` (compare-and-set) or `cad` (compare-and-delete)
-- ARGV[2]: value (set, cas) or expected (cad)
-- ARGV[3]: ttl in ms (set, cas)
-- ARGV[4]: most entries per channel (set, cas)
-- ARGV[5]: cas: `1` when an expected value is given, `0` for "only if absent"
-- ARGV[6]: cas: the expected value
-- ARGV[7]: the longest ttl the host allows, in ms (the index's own ttl)
-- Returns 1 when set or deleted, 0 when the comparison failed, -1 when the
-- channel holds too many entries.
local entry, index = KEYS[1], KEYS[2]
local op = ARGV[1]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', index, '-inf', now)

local function store(value, ttl, max)
  if redis.call('ZSCORE', index, entry) == false and redis.call('ZCARD', index) >= max then
    return -1
  end
  redis.call('SET', entry, value, 'PX', ttl)
  redis.call('ZADD', index, now + ttl, entry)
  -- The index outlives every entry it counts (ttl <= the host's cap).
  redis.call('PEXPIRE', index, tonumber(ARGV[7]))
  return 1
end

if op == 'set' then
  return store(ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4]))
elseif op == 'cas' then
  local current = redis.call('GET', entry)
  if ARGV[5] == '1' then
    if current ~= ARGV[6] then return 0 end
  elseif current ~= false then
    return 0
  end
  return store(ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4]))
elseif op == 'cad' then
  if redis.call('GET', entry) ~= ARGV[2] then return 0 end
  redis.call('DEL', entry)
  redis.call('ZREM', index, entry)
  return 1
end
return redis.error_reply('unknown op ' .. tostring(op))
