-- A registry started over (a database made again, or restored from a backup older than a region
-- or a layout) would hand out again a region number that running generators still issue under:
-- they keep issuing on their copy of the old registry's answer until its horizon. Each of them
-- reports, at every refresh whose answer it refuses, the number it issues under, the registry it
-- follows and until when its copy lets it issue (POST /v1/numbers-in-use); `regions add` hands out
-- no number reported here until that time (capped at now + the horizon lead). One row per number.
CREATE TABLE numbers_in_use (
    number          BIGINT PRIMARY KEY,
    region_name     TEXT   NOT NULL,
    registry_id     TEXT   NOT NULL,
    issues_until_ms BIGINT NOT NULL,
    reporter        TEXT   NOT NULL,
    first_at_ms     BIGINT NOT NULL,
    last_at_ms      BIGINT NOT NULL
);

-- When `idgen registry init` made this database (NULL: before this migration). For a while after
-- it (new_registry_quiet_ms), `regions add` hands out no number, so that every generator still
-- following a registry this one replaced has refreshed and reported first.
ALTER TABLE schedule_state ADD COLUMN initialized_at_ms BIGINT;
