-- extend: push the lease of an attempt in flight (and its permit with it).
-- KEYS[1] task, KEYS[2] permit
-- ARGV[1] task id, ARGV[2] lease token, ARGV[3] lease ms, ARGV[4] permit grace ms,
-- ARGV[5] '1' when the worker is about to hand the message to its channel
-- (`request_started_at`: a worker that vanishes after this may have sent)
-- ARGV[6] on a channel with providers, the provider instance the request goes
-- to, set with ARGV[5] (empty: none): `provider` (where the task's last
-- request went: an unknown outcome is settled there) and `provider_log`
-- (`<attempt>:<provider>` per request, space separated)
-- Returns {'extended', lease_until} or {'lost', status}.
local now = now_ms()
local status = redis.call('HGET', KEYS[1], 'status')
if status ~= 'sending' or redis.call('HGET', KEYS[1], 'lease_token') ~= ARGV[2] then
  return {'lost', status or ''}
end
local lease_until = now + tonumber(ARGV[3])
redis.call('HSET', KEYS[1], 'lease_until', n2s(lease_until))
if ARGV[5] == '1' then
  redis.call('HSET', KEYS[1], 'request_started_at', n2s(now))
  if ARGV[6] and ARGV[6] ~= '' then
    local step = (redis.call('HGET', KEYS[1], 'attempts') or '0') .. ':' .. ARGV[6]
    local log = redis.call('HGET', KEYS[1], 'provider_log')
    if log and log ~= '' then
      step = log .. ' ' .. step
    end
    redis.call('HSET', KEYS[1], 'provider', ARGV[6], 'provider_log', step)
  end
end
if redis.call('GET', KEYS[2]) == ARGV[1] then
  redis.call('PEXPIREAT', KEYS[2], n2s(lease_until + tonumber(ARGV[4])), 'GT')
end
return {'extended', n2s(lease_until)}
