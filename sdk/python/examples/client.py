"""A service that takes IDs from its region's fleet, with a backup region:
`python client.py https://idgen.eu-west-1.internal https://idgen.us-east-1.internal`."""

from __future__ import annotations

import asyncio
import sys
from typing import List

import idgen


async def handle(client: idgen.Client) -> List[int]:
    return [await client.anext_id() for _ in range(3)]


def main(url: str, backup: str) -> None:
    with idgen.Client(url, backups=[backup], prefetch={"batch": 100, "low_water": 25}) as client:
        print(client.next_id(), client.endpoint)
        print(asyncio.run(handle(client)))
        decoded: idgen.Decoded = client.decode(client.next_id())
        print(decoded.region, decoded.region_number, decoded.created_at)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
