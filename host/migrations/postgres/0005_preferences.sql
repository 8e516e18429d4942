-- Recipient preferences (docs/preferences.md): what each user switched
-- off, by the SHA-256 (hex) of the user id, as the deliveries table keys
-- recipients. Channels and categories are JSON arrays of names, sorted.
-- Times are ms since the epoch. A user back to defaults keeps a row with
-- empty arrays, so the change is dated.
CREATE TABLE preferences (
    user_digest    TEXT   NOT NULL PRIMARY KEY,
    channels_off   TEXT   NOT NULL,
    categories_off TEXT   NOT NULL,
    updated_at     BIGINT NOT NULL
);
-- Every change, append-only: when, by which route (`api`, later
-- `sms_reply`, `email_bounce`, `unsubscribe_link`), by whom (the token
-- kind, or the route's own name), what changed, and the document after it.
CREATE TABLE preference_changes (
    id             BIGSERIAL PRIMARY KEY,
    user_digest    TEXT   NOT NULL,
    at             BIGINT NOT NULL,
    route          TEXT   NOT NULL,
    changed_by     TEXT   NOT NULL,
    action         TEXT   NOT NULL,
    what           TEXT   NOT NULL,
    channels_off   TEXT   NOT NULL,
    categories_off TEXT   NOT NULL
);
CREATE INDEX preference_changes_user ON preference_changes (user_digest, id);
-- The channels of events answered `opted_out` (nothing was accepted for
-- them), so that an event's look-up shows them; written in the background
-- after the answer, removed `ledger_history` after `at`.
CREATE TABLE opted_out (
    biz_type    TEXT   NOT NULL,
    biz_id      TEXT   NOT NULL,
    user_digest TEXT   NOT NULL,
    channel     TEXT   NOT NULL,
    key         TEXT   NOT NULL,
    at          BIGINT NOT NULL,
    CONSTRAINT opted_out_answer UNIQUE (biz_type, biz_id, user_digest, channel)
);
CREATE INDEX opted_out_at ON opted_out (at);
