-- Typed public IDs (`[types]` in the service's configuration): a mapping may carry a type, shown
-- as a prefix of its text (`order_01h455vb4pex5vsknk084sn02q`, the TypeID specification's form).
-- The row keeps the type's number, never its name: a SMALLINT, NULL for an untyped mapping. A
-- NULL costs no byte here (the tuple's null bitmap fits in the padding of its 24-byte header), so
-- the untyped mappings already stored, and those made after, cost what they did; a typed one
-- costs 8 bytes more (24 + 2 data bytes, padded to 32).
--
-- Online: a nullable column without a default is a change of the catalogue only, and the check
-- is added NOT VALID (nothing to check in the rows already there, which are all NULL); neither
-- rewrites nor scans the table. Nothing waits long for a lock (see 0003).
SET LOCAL lock_timeout = '5s';

ALTER TABLE public_ids_opaque ADD COLUMN id_type SMALLINT;
ALTER TABLE public_ids_opaque ADD CONSTRAINT public_ids_opaque_id_type CHECK (id_type > 0) NOT VALID;
ALTER TABLE public_ids_uuidv7 ADD COLUMN id_type SMALLINT;
ALTER TABLE public_ids_uuidv7 ADD CONSTRAINT public_ids_uuidv7_id_type CHECK (id_type > 0) NOT VALID;
