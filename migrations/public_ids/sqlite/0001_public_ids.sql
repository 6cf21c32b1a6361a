-- Public IDs: what customers see instead of internal IDs.

-- One public ID per (internal ID, format), unique both ways. Only the stored formats (opaque,
-- uuidv7) have rows; encrypted public IDs are computed.
CREATE TABLE public_ids (
    internal_id   BIGINT NOT NULL,
    format        TEXT   NOT NULL CHECK (format IN ('opaque', 'uuidv7')),
    public_id     TEXT   NOT NULL UNIQUE,
    created_at_ms BIGINT NOT NULL,
    PRIMARY KEY (internal_id, format)
);

-- Data keys for the encrypted format, only in their KMS-wrapped form. Version 1, 2, … : the
-- newest encrypts, every version still decrypts.
CREATE TABLE public_id_keys (
    version       BIGINT PRIMARY KEY CHECK (version BETWEEN 1 AND 255),
    kms_key_id    TEXT   NOT NULL,
    wrapped_key   BLOB   NOT NULL,
    created_at_ms BIGINT NOT NULL
);
