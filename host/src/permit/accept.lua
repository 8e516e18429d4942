-- accept: every channel of one event that lands in one shard, in one call.
-- For each channel: take the permit of its idempotency key and enqueue its
-- task, atomically, after the channel's frequency caps (if any) had room;
-- quiet hours (if any) schedule the first attempt for their end instead of
-- enqueueing it. In Bloom mode (a channel's nbits > 0) no permit is taken:
-- the key's bits in the shard's Bloom filters answer duplicate, else they
-- are set (see permit/bloom.rs).
-- The event is stored once, in the event record, with the payload of each
-- channel accepted; a task holds only its own small state and the record's
-- id (field `ev`). See lib.lua's follow_event for how long the record lives.
-- KEYS[1] ready    {ns:shard}:ready            (stream)
-- KEYS[2] delayed  {ns:shard}:delayed          (zset, for quiet hours)
-- KEYS[3] event    {ns:shard}:ev:<record id>   (hash: event, meta, p:<task id>)
-- KEYS[4] index    {ns:shard}:event:<biz_type>:<biz_id>   (when ARGV[6] is '1')
-- then per channel: its permit {ns:shard}:permit:<key>, its task
--   {ns:shard}:task:<task-id>, its caps' zsets {ns:s}:cap:<name>:<subject>
--   (scored by accept time), and in Bloom mode the shard's filters of even
--   and odd window periods {ns:shard}:bloom:<name>:<window>:<m>:<k>:0|1
-- ARGV[1] the event record's id, or '' for a dry run: the answers this accept
--         would get, nothing written (but a cap's expired entries, which any
--         accept drops)
-- ARGV[2] retention of ended tasks in ms (the index lives window + retention)
-- ARGV[3] the event (JSON), ARGV[4] what the channels share (JSON: biz_type,
--         biz_id, policy, policy_version), ARGV[5] n, the number of channels,
-- ARGV[6] '1' when KEYS[4] is the event index, else '0'
-- then per channel: task id ('' in a dry run), window ms, number of caps,
--   quiet hours ('' or '<offset ms>,<from ms>,<to ms>', local time of day),
--   k (the key's bit positions in Bloom mode; 0: permit mode), the filter's
--   size in bytes (permit mode: 0), the k bit positions, per cap: name, kind
--   ('r' rolling window, 'd' calendar day), max, window ms (kind r) or the
--   recipient's UTC offset ms (kind d); then the idempotency key,
--   retry_max_attempts, the channel, the retry schedule
--   ('<initial ms>,<factor>,<max delay ms>,<jitter 0|1>') and the payload.
-- Returns one answer per channel, in order: {'accepted', id, scheduled_for
-- or ''}, {'duplicate', owner id, owner status or ''} (Bloom mode:
-- {'duplicate', '', ''}) or {'capped', cap name, next allowed ms}.
local DAY = 86400000
local record_id = ARGV[1]
local retention = tonumber(ARGV[2])
local index = nil
local k = 4
if ARGV[6] == '1' then
  index = KEYS[4]
  k = 5
end

-- The channels' blocks of KEYS and ARGV, read into one table each.
local channels = {}
local a = 7
for i = 1, tonumber(ARGV[5]) do
  local c = {permit = KEYS[k], task = KEYS[k + 1], id = ARGV[a],
    window = tonumber(ARGV[a + 1]), ncaps = tonumber(ARGV[a + 2]),
    quiet = ARGV[a + 3], nbits = tonumber(ARGV[a + 4]), bytes = tonumber(ARGV[a + 5])}
  k = k + 2
  a = a + 6
  c.bits = a
  a = a + c.nbits
  c.capargs = a
  a = a + 4 * c.ncaps
  c.capkeys = k
  k = k + c.ncaps
  if c.nbits > 0 then
    c.filters = k
    k = k + 2
  end
  c.key, c.max_attempts, c.channel, c.retry, c.payload =
    ARGV[a], ARGV[a + 1], ARGV[a + 2], ARGV[a + 3], ARGV[a + 4]
  a = a + 5
  channels[i] = c
end

-- The answer when channel c's permit is held: the same request again, or a duplicate.
local function held(c, owner)
  if owner == c.id then
    -- The same request again (its first answer was lost): same answer.
    return {'accepted', c.id, redis.call('HGET', c.task, 'scheduled_for') or ''}
  end
  -- The owner's task lives in this shard: same hash tag, same slot.
  local prefix = string.sub(c.task, 1, #c.task - #c.id)
  local status = redis.call('HGET', prefix .. owner, 'status')
  return {'duplicate', owner, status or ''}
end

-- Cap i of channel c: its key, name, kind, max and parameter.
local function cap(c, i)
  local at = c.capargs + 4 * (i - 1)
  return KEYS[c.capkeys + i - 1], ARGV[at], ARGV[at + 1], tonumber(ARGV[at + 2]),
    tonumber(ARGV[at + 3])
end

-- Start of the span a cap counts at `now`, and the end of its period.
local function span(kind, param, now)
  if kind == 'r' then
    return now - param
  end
  local local_now = now + param
  return local_now - (local_now % DAY) - param
end

-- Drops what cap i of channel c no longer counts; returns {name, next
-- allowed} when it is full.
local function full(c, i, now)
  local key, name, kind, max, param = cap(c, i)
  local since = span(kind, param, now)
  if kind == 'r' then
    redis.call('ZREMRANGEBYSCORE', key, '-inf', n2s(since))
  else
    redis.call('ZREMRANGEBYSCORE', key, '-inf', '(' .. n2s(since))
  end
  local count = redis.call('ZCARD', key)
  if count < max then
    return nil
  end
  if kind == 'd' then
    return {name, since + DAY}
  end
  -- Room again once all but max-1 of the counted messages left the window.
  local oldest = redis.call('ZRANGE', key, count - max, count - max, 'WITHSCORES')
  return {name, tonumber(oldest[2]) + param}
end

-- Counts channel c's message in its cap i.
local function count_in(c, i, now)
  local key, _, kind, _, param = cap(c, i)
  redis.call('ZADD', key, n2s(now), c.id)
  if kind == 'r' then
    redis.call('PEXPIREAT', key, n2s(now + param))
  else
    redis.call('PEXPIREAT', key, n2s(span(kind, param, now) + DAY))
  end
end

-- When channel c's quiet hours hold the first attempt back: their end (ms), else nil.
local function quiet_end(c, now)
  if c.quiet == '' then
    return nil
  end
  local offset, from, to = string.match(c.quiet, '^(-?%d+),(%d+),(%d+)$')
  offset, from, to = tonumber(offset), tonumber(from), tonumber(to)
  local t = (now + offset) % DAY
  local inside
  if from < to then
    inside = t >= from and t < to
  else
    inside = t >= from or t < to
  end
  if not inside then
    return nil
  end
  return now + (to - t) % DAY
end

-- The first cap of channel c with no room, as the answer: {'capped', name, next allowed}.
local function capped(c, now)
  for i = 1, c.ncaps do
    local f = full(c, i, now)
    if f then
      return {'capped', f[1], n2s(f[2])}
    end
  end
  return nil
end

-- Ids of the tasks this call created (for the event index and the record),
-- and their payloads as the record's field/value pairs.
local created = {}
local payloads = {}

-- Writes channel c's task and enqueues it (or schedules it after the quiet
-- hours), puts its payload in the event record and counts it in the caps;
-- `permit` is false in Bloom mode.
local function enqueue(c, now, permit)
  local at = n2s(now)
  redis.call('HSET', c.task, 'status', 'queued', 'accepted_at', at, 'updated_at', at,
    'attempts', '0', 'window_ms', n2s(c.window), 'event_index', index or '', 'key', c.key,
    'retry_max_attempts', c.max_attempts, 'channel', c.channel, 'retry', c.retry,
    'ev', record_id)
  if not permit then
    redis.call('HSET', c.task, 'dedup', 'bloom')
  end
  -- Its payload goes into the event record with the event, in one HSET below.
  payloads[#payloads + 1] = 'p:' .. c.id
  payloads[#payloads + 1] = c.payload
  local due = quiet_end(c, now)
  if due then
    -- Held back until the quiet time ends; the retry scheduler promotes it.
    redis.call('HSET', c.task, 'scheduled_for', n2s(due), 'next_due', n2s(due))
    redis.call('ZADD', KEYS[2], n2s(due), c.id)
    if permit then
      redis.call('PEXPIREAT', c.permit, n2s(due + c.window), 'GT')
    end
  else
    redis.call('XADD', KEYS[1], '*', 'task', c.id, 'key', c.key)
  end
  for i = 1, c.ncaps do
    count_in(c, i, now)
  end
  created[#created + 1] = c.id
  return {'accepted', c.id, due and n2s(due) or ''}
end

-- A dry run's answer once nothing holds the message back: accepted, and
-- when quiet hours would defer it, when.
local function dry_accepted(c, now)
  local due = quiet_end(c, now)
  return {'accepted', '', due and n2s(due) or ''}
end

-- Bloom mode: the filter of this window period and of the previous one
-- (the one of two periods ago has expired: each expires at the end of the
-- period after its own). A key seen in either is a duplicate, so a re-post
-- within one window is always caught; bits are set in the current one.
local function bloom_accept(c, now)
  if redis.call('EXISTS', c.task) == 1 then
    -- The same request again (its first answer was lost): same answer.
    return {'accepted', c.id, redis.call('HGET', c.task, 'scheduled_for') or ''}
  end
  local period = math.floor(now / c.window)
  local current = KEYS[c.filters + period % 2]
  local previous = KEYS[c.filters + 1 - period % 2]
  if bloom_has(previous, c.bits, c.nbits) or bloom_has(current, c.bits, c.nbits) then
    return {'duplicate', '', ''}
  end
  local r = capped(c, now)
  if r then
    return r
  end
  if c.id == '' then
    return dry_accepted(c, now)
  end
  bloom_create(current, c.bytes)
  bloom_add(current, c.bits, c.nbits)
  redis.call('PEXPIREAT', current, n2s((period + 2) * c.window - 1))
  return enqueue(c, now, false)
end

-- Channel c's answer (permit mode unless its nbits > 0).
local function accept(c, now)
  if c.nbits > 0 then
    return bloom_accept(c, now)
  end
  if c.ncaps > 0 then
    local owner = redis.call('GET', c.permit)
    if owner then
      return held(c, owner)
    end
    local r = capped(c, now)
    if r then
      return r
    end
  end
  if c.id == '' then
    -- A dry run (`pushonce keys --redis`): accepted, deferred or a duplicate.
    local owner = redis.call('GET', c.permit)
    if owner then
      return held(c, owner)
    end
    return dry_accepted(c, now)
  end
  if not redis.call('SET', c.permit, c.id, 'NX', 'PX', c.window) then
    return held(c, redis.call('GET', c.permit))
  end
  return enqueue(c, now, true)
end

local now = now_ms()
local answers = {}
local longest = 0
for i, c in ipairs(channels) do
  answers[i] = accept(c, now)
  longest = math.max(longest, c.window)
end
if #created > 0 then
  -- The event once, for every channel accepted; no expiry while one of its
  -- tasks has none (lib.lua's follow_event).
  redis.call('HSET', KEYS[3], 'event', ARGV[3], 'meta', ARGV[4], unpack(payloads))
  if index then
    redis.call('SADD', index, unpack(created))
    -- extend_or_set in two calls at most, one for a new index (no PTTL):
    -- NX gives an expiry to an index without one; GT only pushes one later.
    local until_ms = n2s(now + longest + retention)
    if redis.call('PEXPIREAT', index, until_ms, 'NX') == 0 then
      redis.call('PEXPIREAT', index, until_ms, 'GT')
    end
  end
end
return answers
