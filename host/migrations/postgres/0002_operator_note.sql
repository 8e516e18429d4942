-- Who settled a row by hand and why ("delivered by alice: the user confirmed"),
-- when an operator marked the task delivered or gave it up.
ALTER TABLE deliveries ADD COLUMN operator_note TEXT;
