-- accept: every channel of one event that lands in one shard, in one call.
-- For each channel: take the permit of its idempotency key and enqueue its
-- task, atomically, after the channel's frequency caps (if any) had room;
-- quiet hours (if any) schedule the first attempt for their end instead of
-- enqueueing it. An event with a later send_at is scheduled for then, and
-- its caps and quiet hours are judged at send_at (t0 below), not now; a
-- cap judges and counts a message when it is sent: t0, or the end of the
-- quiet hours t0 is in. In Bloom mode (a channel's nbits > 0) no permit is taken:
-- the key's bits in the shard's Bloom filters answer duplicate, else they
-- are set (see permit/bloom.rs).
-- The event is stored once, in the event's record in this shard, with the
-- payload of each channel accepted; a task holds only its own small state
-- and where its event is (field `ev`: `<n>:<biz_type>:<biz_id>`, the n-th
-- event text of the record). The record is also the event's index: its
-- `p:<task id>` fields are the event's tasks in this shard, its
-- `x:<task id>` fields the digests the event joined (layout 5). See
-- lib.lua's follow_event for how long the record lives.
-- KEYS[1] ready    {ns:shard}:ready            (stream)
-- KEYS[2] delayed  {ns:shard}:delayed          (zset, for quiet hours)
-- KEYS[3] record   {ns:shard}:event:<biz_type>:<biz_id>   (hash: n, e<n>, m<n>,
--                  p:<task id>, x:<task id>, i:<digest id>:<seq>; a value over
--                  ARGV[7] bytes in pieces, lib.lua's rec_pairs)
-- then per channel: its permit {ns:shard}:permit:<SHA-1 of the key, 29 hex
--   digits> (lib.lua's permit_name), its task
--   {ns:shard}:task:<task-id>, its caps' zsets {ns:s}:cap:<name>:<subject>
--   (scored by send time: t0, or the end of the quiet hours it is in;
--   a task's `caps` field names them for a cancel), and in Bloom mode the
--   shard's filters of even and odd window periods
--   {ns:shard}:bloom:<name>:<window>:<m>:<k>:0|1,
--   and with a digest the key's digest head {ns:shard}:digest:<key> (hash:
--   task, gen) and the event's item mark {ns:shard}:digested:<key>:<item id>
-- ARGV[1] the record's name after `event:` (`<biz_type>:<biz_id>`), or ''
--         for a dry run: the answers this accept would get, nothing written
--         (but a cap's expired entries, which any accept drops)
-- ARGV[2] retention of ended tasks in ms (a record holding only digests
--         the event joined lives window + retention)
-- ARGV[3] the event (JSON, without the business ids the record's name
--         holds: permit/stored.rs), ARGV[4] what the channels share
--         ('<policy> <policy_version>[ <biz_type>]'), ARGV[5] n, the number of
--         channels,
-- ARGV[6] the event's send_at (ms since the epoch), or '' to send now; one
--         not later than now is now
-- ARGV[7] the length of an event record's value pieces: Redis's
--         `hash-max-listpack-value` as the host read it (lib.lua's PIECE)
-- then per channel: task id ('' in a dry run), window ms, number of caps,
--   quiet hours ('' or '<offset ms>,<from ms>,<to ms>', local time of day),
--   k (the key's bit positions in Bloom mode; 0: permit mode), the filter's
--   size in bytes (permit mode: 0), the k bit positions, per cap: name, kind
--   ('r' rolling window, 'd' calendar day), max, window ms (kind r) or the
--   recipient's UTC offset ms (kind d); then the idempotency key,
--   retry_max_attempts, the channel, the retry schedule
--   ('<initial ms>,<factor>,<max delay ms>,<jitter 0|1>'), the payload, the
--   digest ('' or 'w,<ms>,<max items>,<n|d>' or
--   'a,<offset ms>,<time of day ms>,<max items>,<n|d>'; n: after the
--   digest began a new event opens the next one, d: it is a duplicate), the
--   event's item id and the item (JSON; both '' without a digest).
-- Returns one answer per channel, in order: {'accepted', id, scheduled_for
-- or ''} (scheduled_for: send_at, or the end of the quiet hours it is in), {'duplicate', owner id, owner status or ''} (Bloom mode:
-- {'duplicate', '', ''}), {'capped', cap name, next allowed ms} or
-- {'digested', digest task id, scheduled_for} (added to the open digest).
local DAY = 86400000
local record = KEYS[3]
local retention = tonumber(ARGV[2])
local k = 4
PIECE = tonumber(ARGV[7])

-- The channels' blocks of KEYS and ARGV, read into one table each.
local channels = {}
local a = 8
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
  if ARGV[a + 5] ~= '' then
    local d = {}
    for part in string.gmatch(ARGV[a + 5], '[^,]+') do
      d[#d + 1] = part
    end
    c.head, c.mark = KEYS[k], KEYS[k + 1]
    k = k + 2
    c.dkind, c.dx = d[1], tonumber(d[2])
    if c.dkind == 'a' then
      c.dy = tonumber(d[3])
      table.remove(d, 3)
    end
    c.dmax, c.dafter = tonumber(d[3]), d[4]
    c.item_id, c.item = ARGV[a + 6], ARGV[a + 7]
  end
  a = a + 8
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

-- The scores of cap set `key` in (lo, hi), ascending.
local function scores(key, lo, hi)
  local r = redis.call('ZRANGEBYSCORE', key, '(' .. n2s(lo), hi, 'WITHSCORES')
  local xs = {}
  for j = 2, #r, 2 do
    xs[#xs + 1] = tonumber(r[j])
  end
  return xs
end

-- How many of xs (ascending) are at or below v.
local function rank(xs, v)
  local lo, hi = 1, #xs + 1
  while lo < hi do
    local mid = math.floor((lo + hi) / 2)
    if xs[mid] <= v then
      lo = mid + 1
    else
      hi = mid
    end
  end
  return lo - 1
end

-- Whether a rolling cap of `max` per `period` has room for a message sent
-- at t, the messages already counted sent at xs (ascending, holding at
-- least every one in (t - period, t + period)): every window
-- (s, s + period] holding t must hold fewer than max of them. The fullest
-- such windows end at t or at a counted message in [t, t + period), so
-- those are the ones checked.
local function rolling_room(xs, t, period, max)
  if rank(xs, t) - rank(xs, t - period) >= max then
    return false
  end
  for j = rank(xs, t - 1) + 1, #xs do
    local x = xs[j]
    if x >= t + period then
      break
    end
    if rank(xs, x) - rank(xs, x - period) >= max then
      return false
    end
  end
  return true
end

-- The first time after t0 a rolling cap has room: room comes back only when
-- a counted message leaves a window, at its time + period, so those times
-- are tried in order (at most 1000; the last message's time + period
-- always has room).
local function rolling_next(key, t0, period, max)
  local xs = scores(key, t0 - period, '+inf')
  for j = 1, math.min(#xs, 1000) do
    local t = xs[j] + period
    if t > t0 and rolling_room(xs, t, period, max) then
      return t
    end
  end
  return xs[#xs] + period
end

-- Drops what cap i of channel c counts for no send from now on; returns
-- {name, next allowed} when it has no room for a message sent at t0
-- (now, a later send_at, or the end of the quiet hours holding it back).
-- A calendar cap counts the recipient's day holding t0; a rolling cap
-- every window of its length holding t0.
local function full(c, i, now, t0)
  local key, name, kind, max, param = cap(c, i)
  if kind == 'r' then
    redis.call('ZREMRANGEBYSCORE', key, '-inf', n2s(now - param))
    if rolling_room(scores(key, t0 - param, '(' .. n2s(t0 + param)), t0, param, max) then
      return nil
    end
    return {name, rolling_next(key, t0, param, max)}
  end
  redis.call('ZREMRANGEBYSCORE', key, '-inf', '(' .. n2s(span(kind, param, now)))
  local first = span(kind, param, t0)
  local day = first
  while redis.call('ZCOUNT', key, n2s(day), '(' .. n2s(day + DAY)) >= max do
    day = day + DAY
  end
  if day == first then
    return nil
  end
  return {name, day}
end

-- Counts channel c's message, sent at t0 (`capped`'s time), in its cap i;
-- the set lives as long as its latest message counts (never shortened: a
-- scheduled message may be counted after a later one).
local function count_in(c, i, t0)
  local key, _, kind, _, param = cap(c, i)
  redis.call('ZADD', key, n2s(t0), c.id)
  if kind == 'r' then
    extend_or_set(key, t0 + param)
  else
    extend_or_set(key, span(kind, param, t0) + DAY)
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

-- When channel c's first attempt is due, if not now: the end of the quiet
-- hours t0 falls in, else t0 when it is later than now (send_at); else nil.
local function due_of(c, now, t0)
  local due = quiet_end(c, t0)
  if not due and t0 > now then
    due = t0
  end
  return due
end

-- The first cap of channel c with no room for its message, as the answer:
-- {'capped', name, next allowed}. A cap counts a message at its send time:
-- its first attempt's due time (the end of the quiet hours t0 falls in,
-- or t0), so messages held back together are judged together.
local function capped(c, now, t0)
  local at = due_of(c, now, t0) or t0
  for i = 1, c.ncaps do
    local f = full(c, i, now, at)
    if f then
      return {'capped', f[1], n2s(f[2])}
    end
  end
  return nil
end

-- Ids of the tasks this call created, and their payloads as the record's
-- field/value pairs; the latest first attempt scheduled (a record holding
-- only digests lives a window and retention past it).
local created = {}
-- Of those, the ones due now: one ready entry names them all (below).
local ready = {}
local payloads = {}
local latest_due = 0
-- Digests this event joined (the record lists them as `x:<id>`).
local joined = {}

-- Which event text of the record this accept's tasks name (`e<n>`), and
-- whether it must be written: a new record's first (`n` set here, in the
-- same command that finds the record new); else the record's latest when
-- it is this very event (a re-post with another channel), else the next.
-- Decided once, at the first task created.
local text_n = nil
local text_new = false
local fresh = false
local function event_n()
  if text_n then
    return text_n
  end
  if redis.call('HSETNX', record, 'n', '1') == 1 then
    fresh = true
    text_n = '1'
    text_new = true
    return text_n
  end
  local last = redis.call('HGET', record, 'n')
  local names = rec_fields(rec_fields({}, 'e' .. last), 'm' .. last)
  local v = redis.call('HMGET', record, unpack(names))
  if rec_join(record, names[1], v[1], v[2]) == ARGV[3]
    and rec_join(record, names[3], v[3], v[4]) == ARGV[4] then
    text_n = last
    return text_n
  end
  text_n = n2s(tonumber(last) + 1)
  text_new = true
  return text_n
end

-- Writes channel c's task and enqueues it (or schedules it for send_at or
-- after the quiet hours), puts its payload in the event record and counts
-- it in the caps at its send time (as `capped` judged them); `permit` is
-- false in Bloom mode.
local function enqueue(c, now, t0, permit)
  local at = n2s(now)
  -- No `updated_at` yet (a reader takes accepted_at).
  local fields = {'status', 'queued', 'at', at,
    'tries', '0', 'window', n2s(c.window), 'key', c.key,
    'max', c.max_attempts, 'ch', c.channel, 'retry', c.retry,
    'ev', event_n() .. ':' .. ARGV[1]}
  if not permit then
    fields[#fields + 1] = 'dedup'
    fields[#fields + 1] = 'bloom'
  end
  if c.ncaps > 0 then
    -- The cap sets counting it, one a line: a cancel takes it out of them.
    fields[#fields + 1] = 'caps'
    fields[#fields + 1] = table.concat({unpack(KEYS, c.capkeys, c.capkeys + c.ncaps - 1)}, '\n')
  end
  -- One HSET per task: a command per field group is Redis time per channel.
  redis.call('HSET', c.task, unpack(fields))
  -- Its payload goes into the event record with the event, in one HSET below.
  rec_pairs(payloads, 'p:' .. c.id, c.payload)
  local due = due_of(c, now, t0)
  if due then
    -- Held back until send_at or the end of the quiet time; the retry
    -- scheduler promotes it. The permit's window starts then (lib.lua's
    -- window_end).
    latest_due = math.max(latest_due, due)
    redis.call('HSET', c.task, 'scheduled_for', n2s(due), 'next_due', n2s(due))
    redis.call('ZADD', KEYS[2], n2s(due), c.id)
    if permit then
      redis.call('PEXPIREAT', c.permit, n2s(due + c.window), 'GT')
    end
  else
    ready[#ready + 1] = c.id
  end
  for i = 1, c.ncaps do
    count_in(c, i, due or t0)
  end
  created[#created + 1] = c.id
  return {'accepted', c.id, due and n2s(due) or ''}
end

-- A dry run's answer once nothing holds the message back: accepted, and
-- when send_at or quiet hours would defer it, when.
local function dry_accepted(c, now, t0)
  local due = due_of(c, now, t0)
  return {'accepted', '', due and n2s(due) or ''}
end

-- Bloom mode: the filter of this window period and of the previous one
-- (the one of two periods ago has expired: each expires at the end of the
-- period after its own). A key seen in either is a duplicate, so a re-post
-- within one window is always caught; bits are set in the current one
-- (the API refuses a send_at more than a window ahead in Bloom mode).
local function bloom_accept(c, now, t0)
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
  local r = capped(c, now, t0)
  if r then
    return r
  end
  if c.id == '' then
    return dry_accepted(c, now, t0)
  end
  bloom_create(current, c.bytes)
  bloom_add(current, c.bits, c.nbits)
  redis.call('PEXPIREAT', current, n2s((period + 2) * c.window - 1))
  return enqueue(c, now, t0, false)
end

-- Digest: when a digest that channel c's event opens at t0 is due: the
-- window after it, or the first local time of day `at` after it.
local function digest_due(c, t0)
  if c.dkind == 'w' then
    return t0 + c.dx
  end
  return t0 + (c.dy - (t0 + c.dx) % DAY) % DAY
end

-- Digest: adds channel c's event as an item of open digest `open` (task
-- hash `otask`): counted in `items`, its JSON kept in the digest's event
-- record under its place (`i:<digest id>:<seq>`) while the digest carries fewer than
-- max items; the item mark names the digest (and this request) for as
-- long as the digest's head lives.
local function digest_append(c, open, otask, scheduled)
  redis.call('HINCRBY', otask, 'items', 1)
  local seq = redis.call('HINCRBY', otask, 'dseq', 1)
  if seq <= c.dmax then
    local ev = event_of(otask, open)
    if ev then
      redis.call('HSET', ev, unpack(rec_pairs({}, 'i:' .. open .. ':' .. seq, c.item)))
    end
  end
  redis.call('SET', c.mark, open .. ' ' .. c.id, 'PX', math.max(redis.call('PTTL', c.head), 1))
  latest_due = math.max(latest_due, tonumber(scheduled) or 0)
  joined[#joined + 1] = open
  return {'digested', open, scheduled or ''}
end

-- Digest: channel c's event joins the open digest under its key (one whose
-- first attempt has not begun: `queued`, no attempt counted — the fence
-- begin.lua and cancel.lua use, so an append racing the begin lands in
-- exactly one digest), or opens the next one, scheduled for digest_due
-- (caps and quiet hours judged then). The first digest under a key holds
-- the key's own permit; the g-th holds `<key>#<g>`. An event already in a
-- digest (its item mark) is a duplicate of that digest.
local function digest_accept(c, now, t0)
  local prefix = string.sub(c.task, 1, #c.task - #c.id)
  local mark = redis.call('GET', c.mark)
  if mark then
    local into, by = string.match(mark, '^(%S+) (%S*)')
    if c.id ~= '' and by == c.id then
      -- The same request again (its first answer was lost): same answer.
      local scheduled = redis.call('HGET', prefix .. into, 'scheduled_for') or ''
      return {into == c.id and 'accepted' or 'digested', into, scheduled}
    end
    return {'duplicate', into, redis.call('HGET', prefix .. into, 'status') or ''}
  end
  local head = redis.call('HMGET', c.head, 'task', 'gen')
  local open, gen = head[1], tonumber(head[2] or '0')
  if open then
    local t = redis.call('HMGET', prefix .. open, 'status', 'tries', 'scheduled_for')
    if t[1] == 'queued' and t[2] == '0' then
      if c.id == '' then
        return {'digested', open, t[3] or ''}
      end
      return digest_append(c, open, prefix .. open, t[3])
    end
    -- A cancelled digest never began: it swallows no later event
    -- (cancel.lua takes it out of the head; a head written before that
    -- still names it).
    if c.dafter == 'd' and t[1] ~= 'cancelled' then
      return {'duplicate', open, t[1] or ''}
    end
  end
  local t1 = digest_due(c, t0)
  local r = capped(c, now, t1)
  if r then
    return r
  end
  if c.id == '' then
    return dry_accepted(c, now, t1)
  end
  gen = gen + 1
  if gen > 1 then
    c.key = c.key .. '#' .. gen
    c.permit = permit_name(c.task, c.id, c.key)
  end
  if not redis.call('SET', c.permit, c.id, 'NX', 'PX', c.window) then
    return held(c, redis.call('GET', c.permit))
  end
  local answer = enqueue(c, now, t1, true)
  redis.call('HSET', c.task, 'items', '1', 'dseq', '1', 'dgen', n2s(gen))
  rec_pairs(payloads, 'i:' .. c.id .. ':1', c.item)
  redis.call('HSET', c.head, 'task', c.id, 'gen', n2s(gen))
  local ttl = math.max(redis.call('PTTL', c.permit), 1)
  redis.call('PEXPIRE', c.head, ttl)
  redis.call('SET', c.mark, c.id .. ' ' .. c.id, 'PX', ttl)
  return answer
end

-- Channel c's answer (permit mode unless its nbits > 0), sent at t0.
local function accept(c, now, t0)
  if c.head then
    return digest_accept(c, now, t0)
  end
  if c.nbits > 0 then
    return bloom_accept(c, now, t0)
  end
  if c.ncaps > 0 then
    local owner = redis.call('GET', c.permit)
    if owner then
      return held(c, owner)
    end
    local r = capped(c, now, t0)
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
    return dry_accepted(c, now, t0)
  end
  if not redis.call('SET', c.permit, c.id, 'NX', 'PX', c.window) then
    return held(c, redis.call('GET', c.permit))
  end
  return enqueue(c, now, t0, true)
end

local now = now_ms()
-- When the event is sent: its send_at when later than now.
local t0 = math.max(now, tonumber(ARGV[6]) or 0)
local answers = {}
local longest = 0
for i, c in ipairs(channels) do
  answers[i] = accept(c, now, t0)
  longest = math.max(longest, c.window)
end
if #created > 0 then
  -- The event once, for every channel accepted, and the tasks' payloads;
  -- no expiry while one of its tasks has none (lib.lua's follow_event).
  -- Values longer than PIECE bytes in pieces (lib.lua's rec_pairs), so the
  -- record stays a listpack.
  local fields = {}
  if text_new then
    -- A fresh record's `n` is set already (event_n's HSETNX).
    local head = fresh and {} or {'n', text_n}
    fields = rec_pairs(rec_pairs(head, 'e' .. text_n, ARGV[3]), 'm' .. text_n, ARGV[4])
  end
  for _, v in ipairs(payloads) do
    fields[#fields + 1] = v
  end
  redis.call('HSET', record, unpack(fields))
  if not fresh then
    -- A record of earlier tasks may expire with them; it holds open ones now.
    redis.call('PERSIST', record)
  end
end
if #ready > 0 then
  -- One queue entry for the event's tasks due now, not one per channel: a
  -- worker begins each, and the entry is acked once none needs it
  -- (lib.lua's ack_entry).
  redis.call('XADD', KEYS[1], '*', 'task', table.concat(ready, ' '))
end
if #joined > 0 then
  -- The digests the event joined, listed for look-ups by event (`x:<id>`).
  -- With no task of its own open, the record lives until `xt`: a window
  -- and retention past the latest digest's send (never shortened; a record
  -- with open tasks keeps no expiry, follow_event applies `xt` later).
  local until_ms = math.max(now, latest_due) + longest + retention
  until_ms = math.max(until_ms, tonumber(redis.call('HGET', record, 'xt') or '0'))
  local members = {'xt', n2s(until_ms)}
  for _, id in ipairs(joined) do
    members[#members + 1] = 'x:' .. id
    members[#members + 1] = ''
  end
  local ttl = redis.call('PTTL', record)
  -- `n` = 0 (no event text yet) unless set: a later accept's event_n then
  -- sees a record that may have an expiry, and persists it.
  redis.call('HSETNX', record, 'n', '0')
  redis.call('HSET', record, unpack(members))
  if ttl == -2 then
    redis.call('PEXPIREAT', record, n2s(until_ms))
  elseif ttl >= 0 then
    -- Never shortened: the record outlives every task of it kept ended.
    redis.call('PEXPIREAT', record, n2s(until_ms), 'GT')
  end
end
return answers
