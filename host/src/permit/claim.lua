-- claim: the reconciler of one host takes up to N due entries of one shard's
-- awaiting index, so no other host checks them at the same time.
-- KEYS[1] awaiting zset {ns:shard}:awaiting (task ids scored by when their next check is due)
-- ARGV[1] most entries to take, ARGV[2] hold ms (a taken entry is due again
-- only after it: the check's time budget), ARGV[3] check token of this claim,
-- ARGV[4] task key prefix of the shard ({ns:shard}:task:)
-- Each taken task gets `check_token` = ARGV[3] (the settle script is fenced by
-- it). `reconcile_checks` counts completed checks only: reconcile.lua adds
-- one when it records a check, so a check lost to a crash or a Redis
-- restart is not counted. Entries whose task is no longer sent/unknown
-- (or is gone) are dropped. An `unknown` task missing from the shard's held
-- index ({ns:shard}:held) is added to it.
-- Returns {now, score of the oldest entry or '', entries left in the index,
--          {{id, status, checks completed, re-queues by the reconciler so far}, ...}}.
local now = now_ms()
local hold = tonumber(ARGV[2])
local oldest = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', n2s(now), 'LIMIT', 0, tonumber(ARGV[1]))
local taken = {}
local held = held_index(KEYS[1], 'awaiting')
for _, id in ipairs(due) do
  -- Same hash tag as KEYS[1]: same slot on a cluster.
  local task = ARGV[4] .. id
  local status = redis.call('HGET', task, 'status')
  if status == 'sent' or status == 'unknown' then
    redis.call('ZADD', KEYS[1], n2s(now + hold), id)
    if status == 'unknown' then
      -- Listed for operators (a task held before the held index existed
      -- enters it here), scored by when it was held.
      local at = redis.call('HGET', task, 'held_at') or redis.call('HGET', task, 'updated_at')
      redis.call('ZADD', held, 'NX', at or n2s(now), id)
    end
    local checks = redis.call('HGET', task, 'reconcile_checks') or '0'
    redis.call('HSET', task, 'check_token', ARGV[3])
    local requeues = redis.call('HGET', task, 'reconcile_requeues') or '0'
    taken[#taken + 1] = {id, status, checks, requeues}
  else
    redis.call('ZREM', KEYS[1], id)
  end
end
return {n2s(now), oldest[2] or '', redis.call('ZCARD', KEYS[1]), taken}
