-- Mappings at 16 bytes a public ID: one table per stored format, the public ID as its 16 bytes
-- (`uuid`: opaque IDs are 128 random bits, UUIDv7s are UUIDs), the format implied by the table,
-- and nothing a read does not need (the creation time went: no read ever used it). A row is
-- then 24 bytes of data after the 24-byte tuple header, 48 in all, no padding: internal_id first
-- (8-aligned), public_id after it (uuid has no alignment). The primary key serves lookups
-- (internal → public) and keeps one public ID per internal ID.
--
-- Resolves (public → internal) go through an index of the public ID's last 8 bytes, not of all
-- 16: an entry of 8 bytes is 20 bytes a mapping with its header and line pointer instead of 28,
-- and random keys leave a B-tree's pages about 70 % full, so that is 12 bytes a mapping less.
-- Those 8 bytes are random in both formats (an opaque ID is all random; a UUIDv7's last 8 bytes
-- are its variant and 62 random bits), and a resolve compares all 16. The index is not unique:
-- two public IDs may share their last 8 bytes (about 3 pairs in 10^10 opaque IDs, 13 in as
-- many UUIDv7s), and a mapping made before this version must be copied whatever its bytes. A
-- public ID's own uniqueness is the create's to keep: it inserts a public ID only where no row
-- holds it already (store.rs), and the old table's unique constraint still holds for as long as
-- it is kept.
--
-- Nothing here waits long for a lock: a migration that cannot have one in 5 s fails, to be run
-- again, rather than queue every reader of the old table behind it.
SET LOCAL lock_timeout = '5s';

CREATE FUNCTION public_id_key(id UUID) RETURNS BIGINT
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $$
    SELECT ('x' || right(replace(id::TEXT, '-', ''), 16))::BIT(64)::BIGINT
$$;

CREATE TABLE public_ids_opaque (
    internal_id BIGINT PRIMARY KEY,
    public_id   UUID   NOT NULL
);
CREATE INDEX public_ids_opaque_key ON public_ids_opaque (public_id_key(public_id));

CREATE TABLE public_ids_uuidv7 (
    internal_id BIGINT PRIMARY KEY,
    public_id   UUID   NOT NULL
);
CREATE INDEX public_ids_uuidv7_key ON public_ids_uuidv7 (public_id_key(public_id));

-- The 26 lowercase Crockford base32 characters of an opaque public ID as its 16 bytes, and back
-- (the service's own text: format.rs), for the copy of the mappings made before.
CREATE FUNCTION public_id_opaque_to_uuid(text TEXT) RETURNS UUID
LANGUAGE plpgsql IMMUTABLE STRICT AS $$
DECLARE
    alphabet CONSTANT TEXT := '0123456789abcdefghjkmnpqrstvwxyz';
    value NUMERIC := 0;
    digit INT;
    hex TEXT := '';
BEGIN
    IF length(text) <> 26 THEN
        RAISE EXCEPTION 'not an opaque public ID: %', text;
    END IF;
    FOR i IN 1..26 LOOP
        digit := strpos(alphabet, substr(text, i, 1)) - 1;
        IF digit < 0 THEN
            RAISE EXCEPTION 'not an opaque public ID: %', text;
        END IF;
        value := value * 32 + digit;
    END LOOP;
    -- 26 characters hold 130 bits: the top two must be clear (the first character 0 to 7).
    IF value >= 2::NUMERIC ^ 128 THEN
        RAISE EXCEPTION 'not an opaque public ID: %', text;
    END IF;
    FOR i IN 1..16 LOOP
        hex := lpad(to_hex(mod(value, 256)::INT), 2, '0') || hex;
        value := div(value, 256);
    END LOOP;
    RETURN hex::UUID;
END $$;

CREATE FUNCTION public_id_uuid_to_opaque(id UUID) RETURNS TEXT
LANGUAGE plpgsql IMMUTABLE STRICT AS $$
DECLARE
    alphabet CONSTANT TEXT := '0123456789abcdefghjkmnpqrstvwxyz';
    hex CONSTANT TEXT := replace(id::TEXT, '-', '');
    value NUMERIC := 0;
    text TEXT := '';
BEGIN
    FOR i IN 1..32 LOOP
        value := value * 16 + strpos('0123456789abcdef', substr(hex, i, 1)) - 1;
    END LOOP;
    FOR i IN 1..26 LOOP
        text := substr(alphabet, mod(value, 32)::INT + 1, 1) || text;
        value := div(value, 32);
    END LOOP;
    RETURN text;
END $$;

-- A database with no mappings yet has nothing to copy: its old table goes now (locked first, so
-- no row arrives between the look and the drop).
DO $$
BEGIN
    LOCK TABLE public_ids IN ACCESS EXCLUSIVE MODE;
    IF NOT EXISTS (SELECT 1 FROM public_ids) THEN
        DROP TABLE public_ids;
        DROP FUNCTION public_id_opaque_to_uuid(TEXT);
        DROP FUNCTION public_id_uuid_to_opaque(UUID);
    END IF;
END $$;

-- A database with mappings keeps its old table, public_ids, until every mapping is copied
-- (online: nothing here rewrites or long-locks it). `idgen public init` copies it in batches of
-- their own short transactions, then sets public_ids_legacy_copy.copied (a service refuses to
-- start before); `idgen public drop-legacy-table`, once no instance of the previous version
-- runs, checks that every row was copied and drops it. Until then the two are kept in step both
-- ways, so that instances of both versions, side by side in a rolling upgrade, agree on every
-- mapping:
--   * a mapping the previous version adds to public_ids is copied to the new table at once;
--   * one this version adds to a new table is added to public_ids as well, and where public_ids
--     already has a mapping for that internal ID (not copied yet), that one is kept instead: the
--     insert takes its public ID, as if it had been copied first.
-- pg_trigger_depth() keeps each copy from copying back, and the batched copy (which sets
-- idgen.copying for its transactions) from writing each row back to where it came from.
DO $$
BEGIN
    IF to_regclass('public_ids') IS NULL THEN
        RETURN;
    END IF;

    CREATE TABLE public_ids_legacy_copy (copied BOOLEAN NOT NULL);
    INSERT INTO public_ids_legacy_copy VALUES (FALSE);

    CREATE FUNCTION public_ids_legacy_added() RETURNS TRIGGER
    LANGUAGE plpgsql AS $f$
    BEGIN
        IF pg_trigger_depth() > 1 THEN
            RETURN NULL;
        END IF;
        IF NEW.format = 'opaque' THEN
            INSERT INTO public_ids_opaque (internal_id, public_id)
            VALUES (NEW.internal_id, public_id_opaque_to_uuid(NEW.public_id)) ON CONFLICT DO NOTHING;
        ELSE
            INSERT INTO public_ids_uuidv7 (internal_id, public_id)
            VALUES (NEW.internal_id, NEW.public_id::UUID) ON CONFLICT DO NOTHING;
        END IF;
        RETURN NULL;
    END $f$;
    CREATE TRIGGER public_ids_legacy_added AFTER INSERT ON public_ids
        FOR EACH ROW EXECUTE FUNCTION public_ids_legacy_added();

    -- TG_ARGV[0] is the table's format.
    CREATE FUNCTION public_ids_added() RETURNS TRIGGER
    LANGUAGE plpgsql AS $f$
    DECLARE
        kept TEXT;
        as_text TEXT;
    BEGIN
        IF pg_trigger_depth() > 1 OR current_setting('idgen.copying', TRUE) = 'on' THEN
            RETURN NEW;
        END IF;
        as_text := CASE TG_ARGV[0] WHEN 'opaque' THEN public_id_uuid_to_opaque(NEW.public_id)
                                   ELSE NEW.public_id::TEXT END;
        INSERT INTO public_ids (internal_id, format, public_id, created_at_ms)
        VALUES (NEW.internal_id, TG_ARGV[0], as_text, (extract(epoch FROM clock_timestamp()) * 1000)::BIGINT)
        ON CONFLICT DO NOTHING;
        IF FOUND THEN
            RETURN NEW;
        END IF;
        SELECT public_id INTO kept FROM public_ids WHERE internal_id = NEW.internal_id AND format = TG_ARGV[0];
        IF kept IS NULL THEN
            -- The public ID is another internal ID's (a random collision): not added, so the
            -- create draws a fresh one, as for a collision in the new table.
            RETURN NULL;
        END IF;
        NEW.public_id := CASE TG_ARGV[0] WHEN 'opaque' THEN public_id_opaque_to_uuid(kept) ELSE kept::UUID END;
        RETURN NEW;
    END $f$;
    CREATE TRIGGER public_ids_opaque_added BEFORE INSERT ON public_ids_opaque
        FOR EACH ROW EXECUTE FUNCTION public_ids_added('opaque');
    CREATE TRIGGER public_ids_uuidv7_added BEFORE INSERT ON public_ids_uuidv7
        FOR EACH ROW EXECUTE FUNCTION public_ids_added('uuidv7');
END $$;
