-- The region registry: never-reused region numbers and the layout schedule.

-- One row per region number ever handed out. Rows are never deleted, so a retired number stays
-- taken forever: the primary key is what makes "never reused" hold, also under concurrent adds.
CREATE TABLE regions (
    number        BIGINT PRIMARY KEY,
    name          TEXT   NOT NULL,
    status        TEXT   NOT NULL CHECK (status IN ('active', 'retired')),
    created_at_ms BIGINT NOT NULL,
    retired_at_ms BIGINT
);
-- A name belongs to at most one active region; a retired name may come back with a new number.
CREATE UNIQUE INDEX regions_active_name ON regions (name) WHERE status = 'active';

-- The layout schedule: an ID belongs to the last layout whose from_ms <= its timestamp
-- (from_ms is milliseconds since the idgen epoch 2026-01-01T00:00:00Z, the ID's own field).
CREATE TABLE layouts (
    name          TEXT   PRIMARY KEY,
    region_bits   BIGINT NOT NULL,
    machine_bits  BIGINT NOT NULL,
    sequence_bits BIGINT NOT NULL,
    from_ms       BIGINT NOT NULL UNIQUE,
    created_at_ms BIGINT NOT NULL
);

-- One row: the horizon (no cutover before it; only ever moves forward) and the home region.
CREATE TABLE schedule_state (
    id          BIGINT PRIMARY KEY CHECK (id = 1),
    horizon_ms  BIGINT NOT NULL,
    home_region TEXT   NOT NULL
);

-- Every write: who, when, what.
CREATE TABLE registry_audit (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    at_ms  BIGINT NOT NULL,
    actor  TEXT   NOT NULL,
    action TEXT   NOT NULL,
    detail TEXT   NOT NULL
);
