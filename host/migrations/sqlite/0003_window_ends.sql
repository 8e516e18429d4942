-- When the window of each row's key ends (ms since the epoch, the host's
-- clock): until then the row is the last line of defence for its key; it is
-- removed once `ledger_history` has passed after that (docs/ledger.md,
-- "Retention"). NULL on rows claimed before this column existed: those are
-- kept until an operator backfills it (the ledger cannot know their windows).
ALTER TABLE deliveries ADD COLUMN window_ends_at INTEGER;
CREATE INDEX deliveries_window_ends ON deliveries (window_ends_at);
