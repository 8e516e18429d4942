-- When the window of each row's key ends (ms since the epoch, the host's
-- clock): until then the row is the last line of defence for its key; it is
-- removed once `ledger_history` has passed after that (docs/ledger.md,
-- "Retention"). NULL on rows claimed before this column existed: those are
-- kept until an operator backfills it (the ledger cannot know their windows).
-- IF NOT EXISTS: on a large ledger an operator may add the column and build
-- the index (CREATE INDEX CONCURRENTLY) before upgrading, so that claims
-- never wait on the index build (docs/ledger.md, "Upgrading a large ledger").
ALTER TABLE deliveries ADD COLUMN IF NOT EXISTS window_ends_at BIGINT;
CREATE INDEX IF NOT EXISTS deliveries_window_ends ON deliveries (window_ends_at);
