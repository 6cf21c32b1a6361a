-- Typed public IDs (`[types]`): a mapping's type as its number, NULL for an untyped one. The
-- public ID stays the text handed out without its prefix; the prefix is the type's name.
ALTER TABLE public_ids ADD COLUMN id_type INTEGER CHECK (id_type > 0);
