-- The delivery ledger: one row per idempotency key (the last line of defence
-- against a Redis that lost permits). Times are ms since the epoch.
CREATE TABLE deliveries (
    key                 TEXT    NOT NULL,
    task_id             TEXT    NOT NULL,
    channel             TEXT    NOT NULL,
    policy              TEXT    NOT NULL,
    recipient_digest    TEXT    NOT NULL,
    biz_type            TEXT    NOT NULL,
    biz_id              TEXT    NOT NULL,
    status              TEXT    NOT NULL,
    attempts            INTEGER NOT NULL,
    provider_message_id TEXT,
    last_error          TEXT,
    claimed_at          BIGINT  NOT NULL,
    updated_at          BIGINT  NOT NULL,
    CONSTRAINT deliveries_key UNIQUE (key)
);
CREATE INDEX deliveries_task ON deliveries (task_id);
CREATE INDEX deliveries_event ON deliveries (biz_type, biz_id);
CREATE INDEX deliveries_updated ON deliveries (updated_at);
