-- record: the outcomes of attempts of one shard's tasks (a batch: one call for what
-- would be one call per task; each fenced by its own lease token and decided as
-- if it were alone); acks each one's stream entry once no task it names
-- needs it (lib.lua's ack_entry).
-- Per task i (from 1), the KEYS and ARGV below at offsets 5*(i-1) and 17*(i-1):
-- KEYS[1] task, KEYS[2] permit, KEYS[3] ready stream, KEYS[4] delayed zset,
-- KEYS[5] awaiting zset (tasks the reconciler checks, scored by when the next check is due)
-- ARGV[1] task id, ARGV[2] lease token, ARGV[3] outcome
-- (sent|retry|resend|resend_by_reference|unknown|failed|dead|duplicate_prevented|opted_out|release)
-- (resend = retry after an unknown outcome: also marks the task maybe_sent;
-- resend_by_reference = a resend that leans on the provider's dedupe of the
-- same client reference: also sets `resend_by` = 'reference', which every
-- other outcome clears, so the worker looks at it again when it is due)
-- ARGV[4] stream entry id or '', ARGV[5] consumer group, ARGV[6] retention ms,
-- ARGV[7] permit grace ms, ARGV[8] retry delay ms, ARGV[9] provider message id,
-- ARGV[10] reason (for duplicate_prevented: the ledger's owner of the key),
-- ARGV[11] ms after which a sent task without receipt is checked,
-- ARGV[12] ms after which an unknown task is checked
-- ARGV[13] sent: the client reference the receipt named, or ''
-- ARGV[14] unknown/dead: why the task is held (held cause JSON),
-- ARGV[15] unknown/dead: the provider's last answer as the plugin saw it, or ''
-- ARGV[16] what a task that ended for good (sent with nothing to await, or
--           failed with its fallback taken) keeps once the delivery ledger holds
--           its outcome: ms to expire after, '0' = it leaves Redis now (hash and
--           event-index entry; the permit stays); '' = the ledger does not hold
--           it (off, or not confirmed): ARGV[6], the retention
-- ARGV[17] '1': a failed or dead task keeps its permit for the window even
--           with nothing sent (the delivery ledger may still hold its row of
--           the key, which would refuse a re-post's claim); '0': released
-- A sent task enters the awaiting index only when ARGV[11] is not '-1' (its
-- channel can confirm it later: a status query or receipts); else sent is final.
-- An unknown task is listed in the shard's held index ({ns:shard}:held)
-- until it moves on.
-- Returns one answer per task, in order, each {'recorded', permit fate (kept|released|retaken|not_owner)} or {'fenced', status}.
-- A task accepted in Bloom mode (field dedup = bloom) keeps its permit only
-- while it is open: when it ends the permit is deleted (owner-checked),
-- never kept or retaken for the window (its filter bits block re-posts).
-- The task the ledger holds the key for (`owner`, named by a claim this
-- task `id` was refused) takes the key's permit back from this task, when
-- it lives in this shard and either is open (queued, waiting for a retry,
-- sending) or was superseded by this very task with nothing ever sent. Its
-- permit lapsed after its claim (it waited past its window and grace), and
-- this task, a re-post Redis then accepted, can never claim the key: unless
-- the owner sends, the message would not go out at all (a miss). A
-- superseded owner is queued again (a ready entry of its own). `task` and
-- `permit` are this task's hash and permit, `stream` the shard's ready
-- stream. Returns whether the permit was handed back.
local function hand_back(task, permit, stream, id, owner, now)
  local shard = string.match(id, '^(%d+)%-')
  if not shard or string.match(owner, '^(%d+)%-') ~= shard
    or redis.call('GET', permit) ~= id then
    return false
  end
  local other = string.sub(task, 1, #task - #id) .. owner
  local t = redis.call('HMGET', other, 'status', 'superseded_by', 'ever_sent', 'maybe_sent')
  local open = t[1] == 'queued' or t[1] == 'retry_wait' or t[1] == 'sending'
  local revive = t[1] == 'superseded' and t[2] == id and not t[3] and not t[4]
  if not (open or revive) then
    return false
  end
  redis.call('SET', permit, owner, 'KEEPTTL')
  if revive then
    redis.call('HSET', other, 'status', 'queued', 'updated_at', n2s(now),
      'last_error', 'queued again: the delivery ledger refused task ' .. id ..
      ' (the re-post that superseded it), as it holds the key for this task')
    redis.call('HDEL', other, 'superseded_by', 'finished_at')
    redis.call('PERSIST', other)
    redis.call('XADD', stream, '*', 'task', owner)
    event_follower(other, owner)()
  end
  return true
end

-- The permit (K[2]) of a task (K[1]) that ended unsent by this attempt,
-- which its owner holds: kept for the window when something may have
-- reached the provider (or `keep`: the ledger may still hold the key for
-- this task), else released, owner-checked (compare-and-delete). A task in
-- Bloom mode always releases (its filter bits guard the key). The fate.
local function keep_or_release(K, now, keep, bloom)
  local t = redis.call('HMGET', K[1], 'ever_sent', 'maybe_sent')
  if (t[1] == '1' or t[2] == '1' or keep) and not bloom then
    redis.call('PEXPIREAT', K[2], n2s(window_end(K[1], now)))
    return 'kept'
  end
  redis.call('DEL', K[2])
  return 'released'
end

local function record_one(K, A, now)
  local id, token, outcome, entry = A[1], A[2], A[3], A[4]
  local retention, grace = tonumber(A[6]), tonumber(A[7])
  local held = held_index(K[5], 'awaiting')
  local status = redis.call('HGET', K[1], 'status')
  if status ~= 'sending' or redis.call('HGET', K[1], 'lease_token') ~= token then
    return {'fenced', status or ''}
  end
  if outcome == 'release' then
    -- Nothing sent: the attempt is given back, uncounted; the stream entry
    -- stays pending (not acked) and is re-claimed after a lease. A re-claim
    -- given back keeps `reclaim_open`: the next begin re-claims it again.
    redis.call('HSET', K[1], 'status', 'queued', 'lease_token', '', 'updated_at', n2s(now))
    redis.call('HINCRBY', K[1], 'tries', -1)
    return {'recorded', 'kept'}
  end
  local owner = redis.call('GET', K[2])
  local fate = 'not_owner'
  -- Whether leave_or_keep already made the event record follow the task.
  local followed = false
  local bloom = bloom_task(K[1])
  if outcome == 'sent' then
    redis.call('HSET', K[1], 'status', 'sent', 'provider_message_id', A[9],
      'ever_sent', '1', 'sent_at', n2s(now), 'finished_at', n2s(now),
      'lease_token', '', 'updated_at', n2s(now))
    if A[13] ~= '' then
      redis.call('HSET', K[1], 'reference', A[13])
    end
    -- Sent: the permit now lasts a window from the send (window_end).
    fate = end_permit(K[1], K[2], id, owner, n2s(window_end(K[1], now)), true)
    if A[11] ~= '-1' then
      -- Awaiting its receipt (in flight): the record stays for the retention
      -- (the receipt settles it); the reconciler asks the provider if none comes.
      redis.call('PEXPIRE', K[1], retention)
      await(K[1], K[5], id, now, tonumber(A[11]))
    else
      -- Nothing could confirm it later: sent is final, nothing to check; it
      -- leaves Redis when the ledger holds it (A[16]).
      redis.call('ZREM', K[5], id)
      leave_or_keep(K[1], id, now, A[16] == '' and retention or tonumber(A[16]))
      followed = true
    end
  elseif outcome == 'retry' or outcome == 'resend' or outcome == 'resend_by_reference' then
    if outcome ~= 'retry' then
      redis.call('HSET', K[1], 'maybe_sent', '1')
    end
    if outcome == 'resend_by_reference' then
      redis.call('HSET', K[1], 'resend_by', 'reference')
    else
      redis.call('HDEL', K[1], 'resend_by')
    end
    local due = now + tonumber(A[8])
    redis.call('HSET', K[1], 'status', 'retry_wait', 'next_due', n2s(due),
      'last_error', A[10], 'lease_token', '', 'updated_at', n2s(now))
    redis.call('ZADD', K[4], n2s(due), id)
    if owner == id then
      redis.call('PEXPIREAT', K[2], n2s(due + grace), 'GT')
      fate = 'kept'
    end
  elseif outcome == 'unknown' then
    -- Sent, no answer: held until a receipt, a query or an operator settles it.
    redis.call('HSET', K[1], 'status', 'unknown', 'last_error', A[10],
      'lease_token', '', 'updated_at', n2s(now), 'maybe_sent', '1')
    hold(K[1], held, id, now, A[14], A[15])
    if owner == id then
      redis.call('PERSIST', K[2])
      fate = 'kept'
    end
    await(K[1], K[5], id, now, tonumber(A[12]))
  elseif outcome == 'failed' or outcome == 'dead' then
    redis.call('HSET', K[1], 'status', outcome, 'last_error', A[10],
      'finished_at', n2s(now), 'lease_token', '', 'updated_at', n2s(now))
    if outcome == 'dead' then
      hold(K[1], nil, id, now, A[14], A[15])
    end
    if owner == id then
      fate = keep_or_release(K, now, A[17] == '1', bloom)
    end
    if outcome == 'failed' and A[16] ~= '' then
      -- Failed with its fallback taken, the ledger holding it: it ended for
      -- good and leaves Redis (or keeps A[16] ms); not listed for operators.
      leave_or_keep(K[1], id, now, tonumber(A[16]))
      followed = true
    else
      redis.call('PEXPIRE', K[1], retention)
      -- The operators' index of failed and dead tasks ({ns:shard}:dead, same hash
      -- tag as the delayed set), scored by when they ended; entries older than
      -- the retention (their task records are gone) are trimmed here.
      local dead = string.sub(K[4], 1, #K[4] - #'delayed') .. 'dead'
      redis.call('ZADD', dead, n2s(now), id)
      redis.call('ZREMRANGEBYSCORE', dead, '-inf', n2s(now - retention))
    end
  elseif outcome == 'duplicate_prevented' then
    -- The ledger holds the key for another task (Redis lost its permit): this
    -- task ends without sending. Its permit is kept for the window, so later
    -- re-posts of the event are answered duplicate by Redis again; the
    -- owner takes it back if it may still send (hand_back).
    redis.call('HSET', K[1], 'status', 'duplicate_prevented', 'duplicate_of', A[10],
      'last_error', 'the delivery ledger holds this key for task ' .. A[10],
      'finished_at', n2s(now), 'lease_token', '', 'updated_at', n2s(now))
    fate = end_permit(K[1], K[2], id, owner, n2s(window_end(K[1], now)), false)
    redis.call('PEXPIRE', K[1], retention)
    if hand_back(K[1], K[2], K[3], id, A[10], now) then
      fate = 'not_owner'
    end
  elseif outcome == 'opted_out' then
    -- The recipient switched the channel (or its category) off since the
    -- accept: this attempt sent nothing (uncounted) and the task ends
    -- `cancelled`, with why as its error (ARGV[10]), as a cancel ends it.
    redis.call('HSET', K[1], 'status', 'cancelled', 'last_error', A[10],
      'cancelled_at', n2s(now), 'finished_at', n2s(now), 'lease_token', '',
      'updated_at', n2s(now))
    redis.call('HINCRBY', K[1], 'tries', -1)
    if owner == id then
      -- Released when nothing was sent: a re-post once the recipient
      -- switched it back on is accepted.
      fate = keep_or_release(K, now, false, bloom)
    end
    redis.call('HSET', K[1], 'permit_released', fate == 'released' and '1' or '0')
    redis.call('PEXPIRE', K[1], retention)
  else
    return redis.error_reply('unknown outcome ' .. outcome)
  end
  if outcome ~= 'sent' and outcome ~= 'unknown' then
    -- Out of sent/unknown (a task the reconciler re-queued, sent again): not awaited.
    redis.call('ZREM', K[5], id)
  end
  if outcome ~= 'unknown' then
    redis.call('ZREM', held, id)
  end
  -- An outcome was decided: a re-claim's question is answered (one HDEL
  -- with `resend_by`, which only a resend keeps).
  if outcome ~= 'retry' and outcome ~= 'resend' and outcome ~= 'resend_by_reference' then
    redis.call('HDEL', K[1], 'resend_by', 'reclaim_open')
  else
    redis.call('HDEL', K[1], 'reclaim_open')
  end
  if outcome ~= 'retry' and outcome ~= 'resend' and outcome ~= 'resend_by_reference'
      and outcome ~= 'unknown' and not followed then
    -- The task's expiry changed: its event record follows (leave_or_keep
    -- already made it follow where it ran).
    event_follower(K[1], id)()
  end
  -- Acked last: a script that stops on an error before this line (its
  -- writes so far stay) leaves the entry pending, so the task, still
  -- `sending`, is re-claimed after its lease instead of stranded.
  -- An entry naming other tasks of the event waits for them (ack_entry).
  if entry ~= '' then
    ack_entry(K[3], A[5], entry, string.sub(K[1], 1, #K[1] - #id))
  end
  return {'recorded', fate}
end
local n = #KEYS / 5
if n ~= math.floor(n) or #ARGV ~= 17 * n then
  return redis.error_reply('record: KEYS and ARGV do not hold whole tasks')
end
local now = now_ms()
local answers = {}
for i = 1, n do
  local k, a = 5 * (i - 1), 17 * (i - 1)
  answers[i] = record_one({KEYS[k + 1], KEYS[k + 2], KEYS[k + 3], KEYS[k + 4], KEYS[k + 5]},
    {unpack(ARGV, a + 1, a + 17)}, now)
end
return answers
