-- Who settled a row by hand and why ("delivered by alice: the user confirmed"),
-- when an operator marked the task delivered or gave it up.
ALTER TABLE deliveries ADD COLUMN operator_note TEXT;
-- A user's tasks, newest first (the console's and the admin API's look-up by user id).
CREATE INDEX deliveries_recipient ON deliveries (recipient_digest, claimed_at);
