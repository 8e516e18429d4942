-- When each row's task was accepted (ms since the epoch, the Redis clock,
-- as the task's `accepted_at` in Redis), so a look-up answered from the
-- ledger gives the same `accepted_at` as one answered from Redis. NULL on
-- rows written before this column existed: a look-up then shows the claim's
-- time (`claimed_at`), as before. No default and no index: adding it does
-- not rewrite the table.
ALTER TABLE deliveries ADD COLUMN IF NOT EXISTS accepted_at BIGINT;
