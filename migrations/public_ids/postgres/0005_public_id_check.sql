-- The keyed check of opaque public IDs (`services/idgen-public-ids/src/check.rs`): a forged public
-- ID is turned away in memory, before any read. New tables only; nothing existing is touched.
--
-- Check keys, by version: the newest usable one tags new opaque IDs, every version still checks.
-- Kept as the mappings are (whoever can read a key can read the table it guards); written only by
-- `idgen public init` and `rotate-check-key`, under the role that owns the schema.
CREATE TABLE public_id_check_keys (
    version       BIGINT PRIMARY KEY CHECK (version BETWEEN 1 AND 255),
    check_key     BYTEA  NOT NULL CHECK (length(check_key) = 32),
    created_at_ms BIGINT NOT NULL
);

-- One row: the Bloom filter of the untagged opaque public IDs made before check keys existed,
-- sealed by `idgen public seal-legacy` (or at `init` of a new database). Until it is sealed,
-- every untagged public ID is read.
CREATE TABLE public_id_legacy_filter (
    one         BIGINT  PRIMARY KEY CHECK (one = 1),
    sealed      BOOLEAN NOT NULL,
    filter_key  BYTEA   NOT NULL,
    hashes      BIGINT  NOT NULL CHECK (hashes BETWEEN 1 AND 64),
    bits        BYTEA   NOT NULL,
    entries     BIGINT  NOT NULL,
    built_at_ms BIGINT  NOT NULL
);
