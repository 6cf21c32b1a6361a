-- Whether a data key was wrapped under a KMS encryption context ({"service": "idgen-public-ids",
-- "key_version": "<version>"}): 1 for every key made since, 0 for one made before. KMS then
-- unwraps a key only for the service and the version it was made for. `idgen public init`
-- re-wraps the 0s (KMS ReEncrypt, the plaintext never leaves KMS); the service refuses to start
-- while one is left.
ALTER TABLE public_id_keys ADD COLUMN encryption_context BIGINT NOT NULL DEFAULT 0;
