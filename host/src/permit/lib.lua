-- pushonce: helpers prepended to every script (see permit/scripts.rs).
-- Time always comes from the Redis server's clock, never from a host.

-- Milliseconds since the epoch on the Redis server.
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- An integer as a decimal string (tostring would switch to exponents).
local function n2s(n)
  return string.format('%.0f', n)
end

-- Sets an expiry at `at` on a key that has none, or pushes a later one;
-- never shortens. For index keys only: a permit without expiry is held on
-- purpose and must stay so (permits use PEXPIREAT ... GT).
local function extend_or_set(key, at)
  local ttl = redis.call('PTTL', key)
  if ttl == -1 then
    redis.call('PEXPIREAT', key, n2s(at))
  elseif ttl >= 0 then
    redis.call('PEXPIREAT', key, n2s(at), 'GT')
  end
end

-- The start of every key of the shard of task hash `task` (id `id`):
-- `{ns:shard}:`, its hash tag (one slot on a cluster).
local function shard_tag(task, id)
  return string.sub(task, 1, #task - #id - #'task:')
end

-- The permit of idempotency key `key` in the shard of task hash `task`
-- (id `id`): named by the first PERMIT_DIGITS hex digits of the key's
-- SHA-1, as permit/keys.rs's permit_digest names it (its PERMIT_DIGITS
-- says why 29), so a permit's name has one length whatever the key's.
local PERMIT_DIGITS = 29
local function permit_name(task, id, key)
  return shard_tag(task, id) .. 'permit:' .. string.sub(redis.sha1hex(key), 1, PERMIT_DIGITS)
end

-- An event record stays a listpack (Redis's compact encoding, kept while
-- every value is at most `hash-max-listpack-value`): a longer value is
-- stored in pieces of that length, the first under its own field name and
-- the k-th after it under `+<k>:<name>` (layout 4). The writer (accept.lua)
-- sets PIECE to the setting the host read from Redis (64, Redis's default,
-- when it could not); readers follow `+<k>:` fields while they exist, so a
-- record written under another setting reads the same.
local PIECE = 64

-- Appends to `out` the field/value pairs that store `value` under `name`
-- in an event record; returns `out`.
local function rec_pairs(out, name, value)
  out[#out + 1] = name
  out[#out + 1] = string.sub(value, 1, PIECE)
  local k = 1
  while #value > k * PIECE do
    out[#out + 1] = '+' .. k .. ':' .. name
    out[#out + 1] = string.sub(value, k * PIECE + 1, (k + 1) * PIECE)
    k = k + 1
  end
  return out
end

-- The fields to read of value `name` with one HMGET: its first piece and
-- the name of its second (present only when the value is in pieces).
local function rec_fields(out, name)
  out[#out + 1] = name
  out[#out + 1] = '+1:' .. name
  return out
end

-- The whole value of field `name` of event record `ev`, given its first
-- piece `first` and its second `second` as rec_fields read them (nil when
-- the field is missing: nil).
local function rec_join(ev, name, first, second)
  if not first or not second then
    return first
  end
  local parts = {first, second}
  local k = 2
  while true do
    local v = redis.call('HGET', ev, '+' .. k .. ':' .. name)
    if not v then
      break
    end
    parts[#parts + 1] = v
    k = k + 1
  end
  return table.concat(parts)
end

-- Takes field `name` and its pieces out of event record `ev`.
local function rec_del(ev, name)
  local fields = {name}
  local k = 1
  while redis.call('HEXISTS', ev, '+' .. k .. ':' .. name) == 1 do
    fields[#fields + 1] = '+' .. k .. ':' .. name
    k = k + 1
  end
  redis.call('HDEL', ev, unpack(fields))
end

-- The task ids ready entry `fields` names: its `task` field holds one id,
-- or the ids of one event's tasks accepted together, space-separated
-- (accept.lua writes one entry per event and shard).
local function entry_tasks(fields)
  local ids = {}
  for i = 1, #fields, 2 do
    if fields[i] == 'task' then
      for id in string.gmatch(fields[i + 1], '%S+') do
        ids[#ids + 1] = id
      end
    end
  end
  return ids
end

-- Acks and deletes ready entry `entry` of `stream` (consumer group
-- `group`) once none of its tasks (hashes `prefix .. id`) needs it: a task
-- needs its entry while `queued` (not begun from it yet) or `sending` (if
-- its worker dies, it is re-claimed from the entry). A task that moved on
-- (retry_wait, held, ended) is queued again by an entry of its own.
-- Returns whether the entry was acked.
local function ack_entry(stream, group, entry, prefix)
  local found = redis.call('XRANGE', stream, entry, entry)
  if #found == 1 then
    for _, id in ipairs(entry_tasks(found[1][2])) do
      local status = redis.call('HGET', prefix .. id, 'status')
      if status == 'queued' or status == 'sending' then
        return false
      end
    end
  end
  redis.call('XACK', stream, group, entry)
  redis.call('XDEL', stream, entry)
  return true
end

-- When the permit of a task that ended keeps to: the whole window from the
-- latest of now, its accept and its scheduled first attempt (send_at, quiet
-- hours), as the ledger counts its row's (`Task::claim`: from the claim).
-- A message that went out (or was settled) late — after retries, a backlog
-- or an operator's requeue — keeps its key a whole window from then: the
-- permit never ends before the ledger's row, which would refuse a re-post
-- Redis accepted (a miss), and never right after a late send (a duplicate).
local function window_end(task, now)
  local t = redis.call('HMGET', task, 'at', 'window', 'scheduled_for')
  local start = math.max(now, tonumber(t[1] or '0'), tonumber(t[3] or '0'))
  return math.max(start + tonumber(t[2] or '0'), now + 1)
end

-- The event record of task `task` (id `id`) and which of its event texts
-- the task names: its field `ev` is `<n>:<biz_type>:<biz_id>`, the record
-- `{ns:shard}:event:<biz_type>:<biz_id>` and the text `e<n>` (layout 5);
-- nil for a task without one.
local function event_of(task, id)
  local ev = redis.call('HGET', task, 'ev')
  if not ev then
    return nil
  end
  local n, name = string.match(ev, '^(%d+):(.*)$')
  if not n then
    return nil
  end
  return shard_tag(task, id) .. 'event:' .. name, n
end

-- Keeps event record `ev` (its tasks' keys start with `prefix`) alive as
-- long as its tasks: without an expiry while one of them has none, else
-- until the last of them expires; once none is left, until the digests the
-- event joined are due and past (`xt`, set by accept.lua), else deleted.
-- Its tasks are the ids of its `p:<task id>` fields; a gone task's payload
-- is dropped, and with it a gone digest's items (`i:<task id>:<seq>`) and
-- a gone digest's mark (`x:<task id>`), pieces and all.
-- Derived from the tasks each time, so calling it again changes nothing.
local function follow_event(ev, prefix)
  local latest = -1
  local persist = false
  local fields = redis.call('HKEYS', ev)
  local gone = {}
  local xt = nil
  for _, field in ipairs(fields) do
    local kind = string.sub(field, 1, 2)
    if kind == 'p:' then
      local ttl = redis.call('PTTL', prefix .. string.sub(field, 3))
      if ttl == -1 then
        persist = true
      elseif ttl == -2 then
        gone[string.sub(field, 3)] = true
      elseif ttl > latest then
        latest = ttl
      end
    elseif kind == 'x:' then
      if redis.call('EXISTS', prefix .. string.sub(field, 3)) == 0 then
        gone[string.sub(field, 3)] = true
      end
    elseif field == 'xt' then
      xt = tonumber(redis.call('HGET', ev, 'xt'))
    end
  end
  if xt then
    xt = xt - now_ms()
  end
  if persist then
    redis.call('PERSIST', ev)
  elseif latest < 0 and not (xt and xt > 0) then
    redis.call('DEL', ev)
    return
  else
    redis.call('PEXPIRE', ev, math.max(latest, xt or 0))
  end
  local drop = {}
  for _, field in ipairs(fields) do
    local base = string.match(field, '^%+%d+:(.+)$') or field
    local of = string.match(base, '^[px]:(.+)$') or string.match(base, '^i:(.+):%d+$')
    if of and gone[of] then
      drop[#drop + 1] = field
    end
  end
  if #drop > 0 then
    redis.call('HDEL', ev, unpack(drop))
  end
end

-- follow_event for the record of task `task` (id `id`), looked up before
-- the task may be deleted: call the returned function after the change.
local function event_follower(task, id)
  local ev = event_of(task, id)
  if not ev then
    return function() end
  end
  local prefix = string.sub(task, 1, #task - #id)
  return function()
    follow_event(ev, prefix)
  end
end

-- A digest task's items kept in its event record `ev`: {seq, field, JSON
-- text} each, in the order they joined (each text joined from its pieces).
local function digest_item_fields(ev, id)
  local items = {}
  local all = redis.call('HGETALL', ev)
  local values = {}
  for i = 1, #all, 2 do
    values[all[i]] = all[i + 1]
  end
  local head = 'i:' .. id .. ':'
  for i = 1, #all, 2 do
    local field = all[i]
    if string.sub(field, 1, #head) == head then
      local parts = {all[i + 1]}
      local k = 1
      while values['+' .. k .. ':' .. field] do
        parts[#parts + 1] = values['+' .. k .. ':' .. field]
        k = k + 1
      end
      items[#items + 1] = {tonumber(string.sub(field, #head + 1)), field, table.concat(parts)}
    end
  end
  table.sort(items, function(x, y) return x[1] < y[1] end)
  return items
end

-- A digest task's items, in the order they joined, as one JSON array text.
local function digest_items(ev, id)
  local texts = {}
  for i, item in ipairs(digest_item_fields(ev, id)) do
    texts[i] = item[3]
  end
  return '[' .. table.concat(texts, ',') .. ']'
end

-- What task `task` (id `id`) takes from its event record, as field/value
-- pairs the host merges into the task's own: the event, what its channels
-- share (`meta`), its payload, and a digest's items (`digest_items`); none
-- for a task without a record.
local function event_fields(task, id)
  local ev, n = event_of(task, id)
  if not ev then
    return {}
  end
  local names = rec_fields(rec_fields(rec_fields({}, 'e' .. n), 'm' .. n), 'p:' .. id)
  local v = redis.call('HMGET', ev, unpack(names))
  local fields = {'event', rec_join(ev, names[1], v[1], v[2]) or '',
    'meta', rec_join(ev, names[3], v[3], v[4]) or '',
    'payload', rec_join(ev, names[5], v[5], v[6]) or ''}
  if redis.call('HEXISTS', task, 'items') == 1 then
    fields[#fields + 1] = 'digest_items'
    fields[#fields + 1] = digest_items(ev, id)
  end
  return fields
end

-- What becomes of task `task` (id `id`) once it ended: with `keep` > 0 it
-- expires after `keep` ms (its event record lives at least as long); with
-- 0 it leaves Redis now, the delivery ledger holding its outcome: the hash
-- is deleted, and with it its place in its event record (follow_event).
-- The permit is never touched here.
local function leave_or_keep(task, id, now, keep)
  local follow = event_follower(task, id)
  if keep > 0 then
    redis.call('PEXPIRE', task, keep)
  else
    redis.call('DEL', task)
  end
  follow()
end

-- Puts task `id` (hash `task`) in the awaiting index `awaiting`, due for a
-- reconciler check `after` ms from `now`; the check count starts again.
local function await(task, awaiting, id, now, after)
  redis.call('ZADD', awaiting, n2s(now + after), id)
  redis.call('HSET', task, 'awaiting_since', n2s(now), 'reconcile_checks', '0')
end

-- The shard's index of held (`unknown`) tasks, named after another index of
-- the same shard (same hash tag, same slot): `{ns:shard}:held`.
local function held_index(sibling, suffix)
  return string.sub(sibling, 1, #sibling - #suffix) .. 'held'
end

-- Records why task `task` (id `id`) is held: its cause (JSON) and the
-- provider's last answer, as the attempt that held it saw them; `index`
-- (the shard's held index, or nil) lists it for operators from `now`.
local function hold(task, index, id, now, cause, answer)
  redis.call('HSET', task, 'held_cause', cause, 'held_at', n2s(now))
  if answer ~= '' then
    redis.call('HSET', task, 'provider_answer', answer)
  else
    redis.call('HDEL', task, 'provider_answer')
  end
  if index then
    redis.call('ZADD', index, n2s(now), id)
  end
end

-- Appends one step (a JSON object, one line) to a task's `reconcile_log`,
-- keeping the newest 32 (the oldest are dropped first).
local function log_step(task, step)
  local log = redis.call('HGET', task, 'reconcile_log') or ''
  if log ~= '' then
    log = log .. '\n'
  end
  log = log .. step
  local _, breaks = string.gsub(log, '\n', '\n')
  while breaks >= 32 do
    log = string.sub(log, string.find(log, '\n', 1, true) + 1)
    breaks = breaks - 1
  end
  redis.call('HSET', task, 'reconcile_log', log)
end

-- Appends one operator action (a JSON object, one line) to a task's
-- `operator_log`: who, when, what and why (never trimmed: operators act rarely).
local function log_operator(task, now, by, action, why)
  local entry = cjson.encode({at = now, by = by, action = action, why = why})
  local log = redis.call('HGET', task, 'operator_log') or ''
  if log ~= '' then
    log = log .. '\n'
  end
  redis.call('HSET', task, 'operator_log', log .. entry)
end

-- Bloom mode: whether all `k` bit positions ARGV[first .. first+k-1] are
-- set in the filter `filter` (a missing filter has none set).
local function bloom_has(filter, first, k)
  for i = first, first + k - 1 do
    if redis.call('GETBIT', filter, ARGV[i]) == 0 then
      return false
    end
  end
  return true
end

-- Bloom mode: creates filter `filter` of `bytes` bytes (all bits 0) when it
-- does not exist. Allocated whole up front: a string grown by SETBIT is
-- allocated greedily (up to twice its length below 1 MB); above 4 MB (too
-- large to build in Lua) SETBIT of the last bit sizes it, with at most
-- 1 MB to spare.
local function bloom_create(filter, bytes)
  if redis.call('EXISTS', filter) == 1 then
    return
  end
  if bytes <= 4194304 then
    redis.call('SET', filter, string.rep('\0', bytes))
  else
    redis.call('SETBIT', filter, n2s(bytes * 8 - 1), 0)
  end
end

-- Bloom mode: sets the `k` bit positions ARGV[first .. first+k-1] in `filter`.
local function bloom_add(filter, first, k)
  for i = first, first + k - 1 do
    redis.call('SETBIT', filter, ARGV[i], 1)
  end
end

-- Bloom mode: whether task `task` was accepted by a Bloom filter (it keeps
-- a permit only while it is open, never for the window after it ends).
local function bloom_task(task)
  return redis.call('HGET', task, 'dedup') == 'bloom'
end

-- The permit `permit` of task `task` (id `id`) once the task ended and its
-- message may be at the provider: it lasts a window from then (until
-- `until_ms`, `window_end`; re-taken if it lapsed and `retake`), except in Bloom mode,
-- where the filter's bits guard re-posts and the permit goes. Another
-- task's permit is left alone. Returns its fate: kept, retaken, released
-- or not_owner.
local function end_permit(task, permit, id, owner, until_ms, retake)
  if owner and owner ~= id then
    return 'not_owner'
  end
  if bloom_task(task) then
    if owner then
      redis.call('DEL', permit)
      return 'released'
    end
    return 'not_owner'
  end
  if owner then
    redis.call('PEXPIREAT', permit, until_ms)
    return 'kept'
  end
  if retake then
    redis.call('SET', permit, id, 'NX', 'PXAT', until_ms)
    return 'retaken'
  end
  return 'not_owner'
end
