-- accept: take the permit of an idempotency key and enqueue its task, atomically,
-- after the frequency caps of the message (if any) had room; quiet hours
-- (if any) schedule the first attempt for their end instead of enqueueing it.
-- In Bloom mode (ARGV[6] > 0) no permit is taken: the key's bits in the
-- shard's Bloom filters answer duplicate, else they are set (see permit/bloom.rs).
-- KEYS[1] permit   {ns:shard}:permit:<key>
-- KEYS[2] task     {ns:shard}:task:<task-id>
-- KEYS[3] ready    {ns:shard}:ready            (stream)
-- KEYS[4] delayed  {ns:shard}:delayed          (zset, for quiet hours)
-- KEYS[5 .. 4+n]   the caps' zsets {ns:s}:cap:<name>:<subject>, scored by accept time
-- KEYS[5+n] index  {ns:shard}:event:<biz_type>:<biz_id>   (optional set)
-- Bloom mode: the last two KEYS, the shard's filters of even and odd
--           window periods {ns:shard}:bloom:<name>:<window>:<m>:<k>:0|1
-- ARGV[1] task id proposed by the caller (becomes the permit's value: its owner),
--         or '' for a dry run: the answer this accept would get, nothing written
--         (but a cap's expired entries, which any accept drops)
-- ARGV[2] window in ms
-- ARGV[3] retention of ended tasks in ms (the index lives window + retention)
-- ARGV[4] n, the number of caps
-- ARGV[5] quiet hours: '' or '<offset ms>,<from ms>,<to ms>' (local time of day)
-- ARGV[6] k, the key's bit positions in Bloom mode (0: permit mode)
-- ARGV[7] Bloom mode: the filter's size in bytes (permit mode: 0)
-- ARGV[8 .. 7+k] the bit positions
-- ARGV[8+k .. 7+k+4n] per cap: name, kind ('r' rolling window, 'd' calendar day),
--           max, window ms (kind r) or the recipient's UTC offset ms (kind d)
-- ARGV[8+k+4n ..] task fields, name/value pairs; the first pair is 'key', <idempotency key>
--           (fields no script reads come packed in one JSON field, `spec`:
--           every hash field costs Redis work on this, the hottest path)
-- Returns {'accepted', id, scheduled_for or ''}, {'duplicate', owner id,
-- owner status or ''} (Bloom mode: {'duplicate', '', ''}) or
-- {'capped', cap name, next allowed ms}.
local DAY = 86400000
local id = ARGV[1]
local window = tonumber(ARGV[2])
local ncaps = tonumber(ARGV[4])
local nbits = tonumber(ARGV[6])
local capargs = 8 + nbits
local fields = capargs + 4 * ncaps
local filters = nbits > 0 and 2 or 0
local index = nil
if 5 + ncaps <= #KEYS - filters then
  index = KEYS[5 + ncaps]
end

-- The answer when the permit is held: the same request again, or a duplicate.
local function held(owner)
  if owner == id then
    -- The same request again (its first answer was lost): same answer.
    return {'accepted', id, redis.call('HGET', KEYS[2], 'scheduled_for') or ''}
  end
  -- The owner's task lives in this shard: same hash tag, same slot.
  local prefix = string.sub(KEYS[2], 1, #KEYS[2] - #id)
  local status = redis.call('HGET', prefix .. owner, 'status')
  return {'duplicate', owner, status or ''}
end

-- Cap i: its key, name, kind, max and parameter.
local function cap(i)
  local a = capargs + 4 * (i - 1)
  return KEYS[4 + i], ARGV[a], ARGV[a + 1], tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3])
end

-- Start of the span a cap counts at `now`, and the end of its period.
local function span(kind, param, now)
  if kind == 'r' then
    return now - param
  end
  local local_now = now + param
  return local_now - (local_now % DAY) - param
end

-- Drops what a cap no longer counts; returns {name, next allowed} when it is full.
local function full(i, now)
  local key, name, kind, max, param = cap(i)
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

-- Counts this message in cap i.
local function count_in(i, now)
  local key, _, kind, _, param = cap(i)
  redis.call('ZADD', key, n2s(now), id)
  if kind == 'r' then
    redis.call('PEXPIREAT', key, n2s(now + param))
  else
    redis.call('PEXPIREAT', key, n2s(span(kind, param, now) + DAY))
  end
end

-- When quiet hours hold the first attempt back: their end (ms), else nil.
local function quiet_end(now)
  if ARGV[5] == '' then
    return nil
  end
  local offset, from, to = string.match(ARGV[5], '^(-?%d+),(%d+),(%d+)$')
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

-- The first cap with no room, as the answer: {'capped', name, next allowed}.
local function capped(now)
  for i = 1, ncaps do
    local c = full(i, now)
    if c then
      return {'capped', c[1], n2s(c[2])}
    end
  end
  return nil
end

-- Writes the task and enqueues it (or schedules it after the quiet hours),
-- counts it in the caps and the event index; `permit` is false in Bloom mode.
local function enqueue(now, permit)
  local at = n2s(now)
  redis.call('HSET', KEYS[2], 'status', 'queued', 'accepted_at', at,
    'updated_at', at, 'attempts', '0', 'window_ms', ARGV[2],
    'event_index', index or '', unpack(ARGV, fields))
  if not permit then
    redis.call('HSET', KEYS[2], 'dedup', 'bloom')
  end
  local due = quiet_end(now)
  if due then
    -- Held back until the quiet time ends; the retry scheduler promotes it.
    redis.call('HSET', KEYS[2], 'scheduled_for', n2s(due), 'next_due', n2s(due))
    redis.call('ZADD', KEYS[4], n2s(due), id)
    if permit then
      redis.call('PEXPIREAT', KEYS[1], n2s(due + window), 'GT')
    end
  else
    redis.call('XADD', KEYS[3], '*', 'task', id, 'key', ARGV[fields + 1])
  end
  for i = 1, ncaps do
    count_in(i, now)
  end
  if index then
    redis.call('SADD', index, id)
    -- extend_or_set in two calls at most, one for a new index (no PTTL):
    -- NX gives an expiry to an index without one; GT only pushes one later.
    local until_ms = n2s(now + window + tonumber(ARGV[3]))
    if redis.call('PEXPIREAT', index, until_ms, 'NX') == 0 then
      redis.call('PEXPIREAT', index, until_ms, 'GT')
    end
  end
  return {'accepted', id, due and n2s(due) or ''}
end

-- Bloom mode: the filter of this window period and of the previous one
-- (the one of two periods ago has expired: each expires at the end of the
-- period after its own). A key seen in either is a duplicate, so a re-post
-- within one window is always caught; bits are set in the current one.
-- A dry run's answer once nothing holds the message back: accepted, and
-- when quiet hours would defer it, when.
local function dry_accepted(now)
  local due = quiet_end(now)
  return {'accepted', '', due and n2s(due) or ''}
end

local function bloom_accept(now)
  if redis.call('EXISTS', KEYS[2]) == 1 then
    -- The same request again (its first answer was lost): same answer.
    return {'accepted', id, redis.call('HGET', KEYS[2], 'scheduled_for') or ''}
  end
  local period = math.floor(now / window)
  local current = KEYS[#KEYS - 1 + period % 2]
  local previous = KEYS[#KEYS - period % 2]
  if bloom_has(previous, 8, nbits) or bloom_has(current, 8, nbits) then
    return {'duplicate', '', ''}
  end
  local c = capped(now)
  if c then
    return c
  end
  if id == '' then
    return dry_accepted(now)
  end
  bloom_create(current, tonumber(ARGV[7]))
  bloom_add(current, 8, nbits)
  redis.call('PEXPIREAT', current, n2s((period + 2) * window - 1))
  return enqueue(now, false)
end

local now = now_ms()
if nbits > 0 then
  return bloom_accept(now)
end
if ncaps > 0 then
  local owner = redis.call('GET', KEYS[1])
  if owner then
    return held(owner)
  end
  local c = capped(now)
  if c then
    return c
  end
end
if id == '' then
  -- A dry run (`pushonce keys --redis`): accepted, deferred or a duplicate.
  local owner = redis.call('GET', KEYS[1])
  if owner then
    return held(owner)
  end
  return dry_accepted(now)
end
if not redis.call('SET', KEYS[1], id, 'NX', 'PX', window) then
  return held(redis.call('GET', KEYS[1]))
end
return enqueue(now, true)
