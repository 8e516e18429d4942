-- ack: ready entries of one shard a worker read and has nothing more to
-- do with (their tasks need no attempt: settled, superseded, missing);
-- each is acked and deleted once none of the tasks it names needs it
-- (lib.lua's ack_entry), so an entry naming several tasks of one event
-- stays for those still queued or sending.
-- KEYS[1] the shard's ready stream
-- ARGV[1] consumer group, ARGV[2] the shard's task key prefix
-- ({ns:shard}:task:, same hash tag as KEYS[1]: same slot on a cluster),
-- then the entry ids
-- Returns how many entries were acked.
local acked = 0
for i = 3, #ARGV do
  if ack_entry(KEYS[1], ARGV[1], ARGV[i], ARGV[2]) then
    acked = acked + 1
  end
end
return acked
