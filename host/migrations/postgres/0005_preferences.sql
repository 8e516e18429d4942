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
