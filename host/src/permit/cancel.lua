-- cancel: a task whose first attempt has not begun (`queued`, no attempt
-- counted: in its shard's ready stream, or in the delayed set until quiet
-- hours end) ends `cancelled` and is never sent. Decided against
-- `begin.lua` by the status alone: both run atomically on the task's shard,
-- so whichever runs first wins (a begun task is `sending` or later here; a
-- cancelled one is `settled` there).
-- KEYS[1] task, KEYS[2] permit, KEYS[3] delayed zset, KEYS[4] ready stream,
-- KEYS[5] awaiting zset (the shard's held index is named after it),
-- KEYS[6..] the cap sets counting the task (its `caps` field; the
-- recipient's shard, the task's own on a cluster: docs/caps.md)
-- ARGV[1] task id, ARGV[2] '1' to release the permit (owner-checked), else
-- it stays for the window, ARGV[3] retention ms, ARGV[4] consumer group,
-- ARGV[5] the business id of the event cancelled (for a digest task: its
-- item is taken out, and the digest still sends the others)
-- Returns {'cancelled', permit fate (kept|released|not_owner)}
--       | {'removed', item mark fate (kept|released)} | {'too_late', status}
--       | {'missing'}.
local id, release, retention = ARGV[1], ARGV[2] == '1', tonumber(ARGV[3])
local status = redis.call('HGET', KEYS[1], 'status')
if not status then
  return {'missing'}
end
-- A queued task with attempts counted was requeued (by an operator or the
-- reconciler) after an attempt that may have reached the provider.
if status ~= 'queued' or tonumber(redis.call('HGET', KEYS[1], 'tries') or '0') > 0 then
  return {'too_late', status}
end
-- A digest task: the event's item mark ({ns:shard}:digested:<key>:<biz
-- id>, the key without its generation), when it names this digest. A mark
-- ending ' removed' is an item a cancel already took out (its permit
-- kept); an event whose mark is gone (released) is not in the digest: a
-- retried cancel of either answers as the first did and changes nothing.
local mark = nil
local digest = redis.call('HEXISTS', KEYS[1], 'items') == 1
local tag = shard_tag(KEYS[1], id)
local base = (string.gsub(redis.call('HGET', KEYS[1], 'key') or '', '#%d+$', ''))
if digest then
  local m = tag .. 'digested:' .. base .. ':' .. ARGV[5]
  local v = redis.call('GET', m) or ''
  if string.match(v, '^%S+') == id then
    if string.find(v, ' removed$') then
      return {'removed', 'kept'}
    end
    mark = m
  elseif ARGV[5] ~= '' then
    return {'removed', 'released'}
  end
end
-- One event of several in the digest: its item is taken out, the digest
-- sends the others (its kept JSON, if within max items, is dropped).
if mark and tonumber(redis.call('HGET', KEYS[1], 'items') or '0') > 1 then
  local ev = event_of(KEYS[1], id)
  if ev then
    for _, item in ipairs(digest_item_fields(ev, id)) do
      local ok, v = pcall(cjson.decode, item[3])
      if ok and type(v) == 'table' and v.biz_id == ARGV[5] then
        rec_del(ev, item[2])
      end
    end
  end
  redis.call('HINCRBY', KEYS[1], 'items', -1)
  if release then
    redis.call('DEL', mark)
    return {'removed', 'released'}
  end
  redis.call('SET', mark, redis.call('GET', mark) .. ' removed', 'KEEPTTL')
  return {'removed', 'kept'}
end
if mark and release then
  redis.call('DEL', mark)
end
local now = now_ms()
local at = n2s(now)
local owner = redis.call('GET', KEYS[2])
local fate = 'not_owner'
if owner == id then
  if release or bloom_task(KEYS[1]) then
    -- Nothing was sent: compare-and-delete (the owner was checked above).
    -- In Bloom mode the filter's bits guard re-posts, never the permit.
    redis.call('DEL', KEYS[2])
    fate = 'released'
  else
    -- Kept as the accept set it: the window (from the quiet hours' end
    -- for a task they held back), so a re-post stays `duplicate`.
    fate = 'kept'
  end
end
redis.call('HSET', KEYS[1], 'status', 'cancelled', 'cancelled_at', at,
  'finished_at', at, 'updated_at', at, 'lease_token', '', 'permit_released',
  fate == 'released' and '1' or '0')
redis.call('ZREM', KEYS[3], id)
redis.call('ZREM', KEYS[5], id)
-- Never sent, it takes no room in its caps (their sets are KEYS[6] on).
for i = 6, #KEYS do
  redis.call('ZREM', KEYS[i], id)
end
-- A digest cancelled whole never began: its key's head forgets it, keeping
-- its generation, so the next event opens the next digest (accept.lua),
-- also once this task has left Redis (a head naming a task that is gone
-- is a digest that began and was sent).
if digest then
  local head = tag .. 'digest:' .. base
  if redis.call('HGET', head, 'task') == id then
    redis.call('HDEL', head, 'task')
  end
end
redis.call('ZREM', held_index(KEYS[5], 'awaiting'), id)
-- Its ready entry, when it still has one: written by the accept in the same
-- millisecond as `accepted_at` (looked for from a second before, among the
-- next 200 entries); one not found here is acked by the worker that reads
-- it (`begin.lua` answers `settled` or `missing`).
local accepted = tonumber(redis.call('HGET', KEYS[1], 'at') or '0')
local entries = redis.call('XRANGE', KEYS[4], n2s(math.max(accepted - 1000, 0)), '+', 'COUNT', 200)
-- An entry that also names other tasks of the event stays while one of
-- them needs it (lib.lua's ack_entry).
local prefix = string.sub(KEYS[1], 1, #KEYS[1] - #id)
for _, entry in ipairs(entries) do
  for _, named in ipairs(entry_tasks(entry[2])) do
    if named == id then
      ack_entry(KEYS[4], ARGV[4], entry[1], prefix)
      break
    end
  end
end
redis.call('PEXPIRE', KEYS[1], retention)
event_follower(KEYS[1], id)()
return {'cancelled', fate}
