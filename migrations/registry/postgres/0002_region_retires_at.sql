-- A retirement takes effect at a stated time, no earlier than the registry's retire grace: until
-- then the region stays 'active' (it still issues, and it still owns its number) with
-- retires_at_ms set, and the retirement can be cancelled. From that time on readers show it
-- retired (retired_at = retires_at); the next write makes it so in `status` too, so the partial
-- unique index on active names lets the name come back. NULL: no retirement pending (and for rows
-- retired before this column existed).
ALTER TABLE regions ADD COLUMN retires_at_ms BIGINT;
