-- duplicate: mark a task a possible duplicate: a resend its provider cannot
-- dedupe was decided (by a worker holding the lease, or by the reconciler
-- re-queueing an `unknown` task its status query did not find).
-- KEYS[1] task
-- A task that already left Redis is not re-created (a bare hash without
-- its fields or an expiry would linger forever).
-- Returns 1 when marked, 0 when the task is gone.
if redis.call('EXISTS', KEYS[1]) == 0 then
  return 0
end
redis.call('HSET', KEYS[1], 'possible_duplicate', '1')
return 1
