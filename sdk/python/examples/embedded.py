"""A batch job that takes IDs in-process: `python embedded.py generator.toml`."""

from __future__ import annotations

import sys

import idgen


def main(config_path: str) -> None:
    with idgen.EmbeddedGenerator.start(config_path) as generator:
        one: int = generator.next_id()
        batch = generator.next_ids(1000)
        decoded = generator.decode(one)
        print(one, len(batch), decoded.layout, decoded.created_at.isoformat(), decoded.machine)
        try:
            generator.next_uuids(3)
        except idgen.RefusedError as refused:
            # Not now: wait and try again, never fall back to a local counter.
            print("refused:", refused.reason, refused.retry_after)


if __name__ == "__main__":
    main(sys.argv[1])
