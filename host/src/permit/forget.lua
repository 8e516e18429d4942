-- forget: a task that ended (settled by a receipt, a reconciler check or an
-- operator; cancelled before its first attempt; or `sent` and no longer
-- checked: the reconciler gave up waiting for its receipt) once the delivery ledger holds its outcome: it leaves Redis —
-- the hash and its event-index entry; the permit stays for its window — or,
-- when ended tasks are kept (`keep_ended_tasks`), expires after ARGV[3] ms.
-- Fenced by the status the ledger was given: a task that moved on since
-- (an operator requeued it) stays.
-- KEYS[1] task, KEYS[2] dead zset, KEYS[3] awaiting zset (the shard's held
-- index is named after it)
-- ARGV[1] task id, ARGV[2] the status the ledger holds (delivered|failed|
-- cancelled, or sent for a task the reconciler no longer checks),
-- ARGV[3] ms to keep the task, '0' = it leaves now
-- Returns {'left'} | {'kept'} | {'fenced', status}.
local id = ARGV[1]
local status = redis.call('HGET', KEYS[1], 'status')
local untracked = status == 'sent'
  and redis.call('HEXISTS', KEYS[1], 'reconcile_untracked_at') == 1
local ended = status == 'delivered' or status == 'failed' or status == 'cancelled'
if status ~= ARGV[2] or not (ended or untracked) then
  return {'fenced', status or ''}
end
redis.call('ZREM', KEYS[2], id)
redis.call('ZREM', KEYS[3], id)
redis.call('ZREM', held_index(KEYS[3], 'awaiting'), id)
local keep = tonumber(ARGV[3])
leave_or_keep(KEYS[1], id, now_ms(), keep)
if keep > 0 then
  return {'kept'}
end
return {'left'}
