-- listing: a task as look-ups show it, read-only: its own fields and what
-- it takes from its event record (the event, `meta`, its payload).
-- KEYS[1] task
-- ARGV[1] task id
-- Returns {{task field/value pairs}, {event record field/value pairs}};
-- the first is empty when the task does not exist.
local fields = redis.call('HGETALL', KEYS[1])
if #fields == 0 then
  return {{}, {}}
end
return {fields, event_fields(KEYS[1], ARGV[1])}
