-- extend: push the leases of attempts in flight of one shard's tasks (and their permits
-- with them; a batch: one call for what would be one call per task, each fenced by its
-- own lease token).
-- Per task i (from 1), the KEYS and ARGV below at offsets 2*(i-1) and 6*(i-1):
-- KEYS[1] task, KEYS[2] permit
-- ARGV[1] task id, ARGV[2] lease token, ARGV[3] lease ms, ARGV[4] permit grace ms,
-- ARGV[5] '1' when the worker is about to hand the message to its channel
-- (`request_started_at`: a worker that vanishes after this may have sent)
-- ARGV[6] on a channel with providers, the provider instance the request goes
-- to, set with ARGV[5] (empty: none): `provider` (where the task's last
-- request went: an unknown outcome is settled there) and `provider_log`
-- (`<attempt>:<provider>` per request, space separated)
-- Returns one answer per task, in order, each {'extended', lease_until} or {'lost', status}.
local function extend_one(K, A, now)
  local status = redis.call('HGET', K[1], 'status')
  if status ~= 'sending' or redis.call('HGET', K[1], 'lease_token') ~= A[2] then
    return {'lost', status or ''}
  end
  local lease_until = now + tonumber(A[3])
  redis.call('HSET', K[1], 'lease_until', n2s(lease_until))
  if A[5] == '1' then
    redis.call('HSET', K[1], 'request_started_at', n2s(now))
    if A[6] ~= '' then
      local step = (redis.call('HGET', K[1], 'tries') or '0') .. ':' .. A[6]
      local log = redis.call('HGET', K[1], 'provider_log')
      if log and log ~= '' then
        step = log .. ' ' .. step
      end
      redis.call('HSET', K[1], 'provider', A[6], 'provider_log', step)
    end
  end
  if redis.call('GET', K[2]) == A[1] then
    redis.call('PEXPIREAT', K[2], n2s(lease_until + tonumber(A[4])), 'GT')
  end
  return {'extended', n2s(lease_until)}
end
local n = #KEYS / 2
if n ~= math.floor(n) or #ARGV ~= 6 * n then
  return redis.error_reply('extend: KEYS and ARGV do not hold whole tasks')
end
local now = now_ms()
local answers = {}
for i = 1, n do
  local a = 6 * (i - 1)
  answers[i] = extend_one({KEYS[2 * i - 1], KEYS[2 * i]}, {unpack(ARGV, a + 1, a + 6)}, now)
end
return answers
