-- The registry's identity: 128 random bits made once, when its database is initialized (here,
-- for a registry made before this migration). Generators keep it in their copy of the registry's
-- answer and every lease table's genesis records it, so a registry started over (a new database,
-- or an old backup: region numbers handed out from 0 again) is refused by every generator.
ALTER TABLE schedule_state ADD COLUMN registry_id TEXT;
UPDATE schedule_state SET registry_id = lower(hex(randomblob(16))) WHERE registry_id IS NULL;

-- The lease table each region's generators claim in, per layout: set when the region is added
-- (or the layout), moved only by an operator (POST /v1/regions/{name}:move-lease-table) along
-- with `idgen leases adopt`, which moved_from then names. A generator claims in no other table.
CREATE TABLE region_lease_tables (
    region_number BIGINT NOT NULL REFERENCES regions (number),
    layout        TEXT   NOT NULL REFERENCES layouts (name),
    table_name    TEXT   NOT NULL,
    moved_from    TEXT,
    set_at_ms     BIGINT NOT NULL,
    PRIMARY KEY (region_number, layout)
);

-- Today's tables: every region and layout so far used the defaults (idgen-leases for v1,
-- idgen-leases-<layout> for the others), as the worker's configuration and the stacks name them.
INSERT INTO region_lease_tables (region_number, layout, table_name, set_at_ms)
SELECT regions.number, layouts.name,
       CASE WHEN layouts.name = 'v1' THEN 'idgen-leases' ELSE 'idgen-leases-' || layouts.name END, 0
  FROM regions CROSS JOIN layouts;
