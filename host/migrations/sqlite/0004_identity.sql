-- The ledger's identity: one random id, made by the first instance that
-- opens the ledger. Every instance records it in the Redis it shares with
-- the others; an instance whose ledger has another id is on a ledger of its
-- own and is refused (docs/ledger.md, "One ledger per Redis").
CREATE TABLE ledger_identity (
    singleton INTEGER NOT NULL PRIMARY KEY CHECK (singleton = 1),
    id        TEXT    NOT NULL
);
