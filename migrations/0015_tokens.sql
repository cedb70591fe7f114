-- 0015_tokens: bearer tokens for `bus serve --mcp` (issue 34, agents over HTTP).
-- readers: unchanged (a new table no view reads; the status and the charts read as before)
-- Only a token's SHA-256 is stored: the secret is printed once, at `bus token create`,
-- and a copy of the file gives nobody a way in. A token acts as its agent only.
-- last_used_ms is written coarsely (at most once a minute per token, bus/coordination/tokens.py),
-- so checking a token costs no write per request.
CREATE TABLE tokens (
    id TEXT PRIMARY KEY,
    agent TEXT NOT NULL,
    secret_sha256 BLOB NOT NULL UNIQUE,
    read_only INTEGER NOT NULL DEFAULT 0 CHECK (read_only IN (0, 1)),
    created_ms INTEGER NOT NULL,
    expires_ms INTEGER,
    revoked_ms INTEGER,
    last_used_ms INTEGER
) WITHOUT ROWID;
