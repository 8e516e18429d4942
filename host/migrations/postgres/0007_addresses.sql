-- The SHA-256 (hex) of the address a row's message was sent to (the
-- phone number, as the event gave it), so that an opt-out a provider
-- reports by address (an SMS answered "TD") finds the users the host sent
-- to there (docs/preferences.md, "Opt-out by reply"). NULL on rows claimed
-- before this column existed.
ALTER TABLE deliveries ADD COLUMN IF NOT EXISTS address_digest TEXT;
CREATE INDEX IF NOT EXISTS deliveries_address ON deliveries (channel, address_digest);
