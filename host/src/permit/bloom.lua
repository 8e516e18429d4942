-- bloom: adds or checks many keys in one Bloom filter with the accept
-- script's own bit functions (lib.lua), without tasks: for measuring a
-- filter's false-positive rate and its memory (tests, the benchmark).
-- KEYS[1] filter (a Redis string of bits)
-- ARGV[1] 'add' or 'check', ARGV[2] k, ARGV[3] the filter's size in bytes,
-- ARGV[4 ..] k bit positions per key, key after key
-- Returns how many of the keys had all their bits set (for 'add': before they were set).
local k = tonumber(ARGV[2])
local found = 0
if ARGV[1] == 'add' then
  bloom_create(KEYS[1], tonumber(ARGV[3]))
end
for first = 4, #ARGV, k do
  if bloom_has(KEYS[1], first, k) then
    found = found + 1
  end
  if ARGV[1] == 'add' then
    bloom_add(KEYS[1], first, k)
  end
end
return found
