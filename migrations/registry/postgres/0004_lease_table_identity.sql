-- Which table each region's lease table is, not only its name: the table_id of its genesis
-- (idgen::lease::genesis, 128 random bits drawn by `idgen leases init`), recorded by the first
-- init of the table the region names (POST /v1/regions/{name}:record-lease-table) and moved with
-- it (move-lease-table). A second table of the same name (another AWS region's, another host's
-- SQLite file) has a genesis of its own, which the registry does not hold: no generator claims in
-- it. NULL until the first init records one.
ALTER TABLE region_lease_tables ADD COLUMN table_id TEXT;
