"""The Python package against its floor and its peers, in one run, as ratios (scripts/bench,
stage 8): `python bench.py CONFIG SECONDS ROUNDS [WORKER_URL]`.

Per call, in nanoseconds, each measured ROUNDS times with the order rotated each round:
time.time_ns() (the floor: one call into C), the embedded generator's next_id() (in bursts
below the layout's cap, and flat out, where the cap of 4,096 IDs a millisecond is what is
measured), uuid.uuid4(), uuid_utils.uuid7(), python-ulid's ULID(), snowflake-id's generator,
and next_ids(1000) per ID.
With WORKER_URL (a development `idgen worker`): the client's prefetched next_id() against one
HTTP request per ID from Python (http.client, one keep-alive connection)."""

from __future__ import annotations

import http.client
import json
import statistics
import sys
import time
import urllib.parse
import uuid
from typing import Callable, Dict, List

import snowflake
import ulid
import uuid_utils

import idgen


def per_call_ns(call: Callable[[], object], seconds: float, per: int = 1) -> float:
    # Calls in blocks of 1,000 between clock reads, so the clock's cost is spread thin.
    calls, started = 0, time.perf_counter_ns()
    deadline = started + int(seconds * 1e9)
    while True:
        for _ in range(1000):
            call()
        calls += 1000
        now = time.perf_counter_ns()
        if now >= deadline:
            return (now - started) / (calls * per)


def paced_ns(call: Callable[[], object], seconds: float, per: int = 1, burst: int = 1000) -> float:
    """Per call, in bursts that stay below the layout's cap (v1: 4,096 IDs a millisecond for
    one machine number; flat out, every generator of it waits there), a millisecond's pause
    between bursts, only the bursts timed: what a call itself costs."""
    spent, calls, deadline = 0, 0, time.monotonic() + seconds
    while time.monotonic() < deadline:
        started = time.perf_counter_ns()
        for _ in range(burst):
            call()
        spent += time.perf_counter_ns() - started
        calls += burst
        time.sleep(0.001)
    return spent / (calls * per)


def main() -> None:
    config, seconds, rounds = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
    worker = sys.argv[4] if len(sys.argv) > 4 else None
    generator = idgen.EmbeddedGenerator.start(config)
    flake = snowflake.SnowflakeGenerator(42)
    subjects: Dict[str, Callable[[], float]] = {
        "time.time_ns() (floor)": lambda: per_call_ns(time.time_ns, seconds),
        "idgen next_id()": lambda: paced_ns(generator.next_id, seconds),
        "idgen next_id(), flat out (at the cap)": lambda: per_call_ns(generator.next_id, seconds),
        "uuid.uuid4()": lambda: per_call_ns(uuid.uuid4, seconds),
        "uuid_utils.uuid7()": lambda: per_call_ns(uuid_utils.uuid7, seconds),
        "ulid.ULID()": lambda: per_call_ns(ulid.ULID, seconds),
        "snowflake-id next()": lambda: per_call_ns(lambda: next(flake), seconds),
        "idgen next_ids(1000), per ID": lambda: paced_ns(lambda: generator.next_ids(1000), seconds, 1000, 1),
        "time.time_ns(), paced (floor)": lambda: paced_ns(time.time_ns, seconds),
    }
    if worker:
        client = idgen.Client(worker, prefetch={"batch": 1000, "low_water": 250})
        parts = urllib.parse.urlsplit(worker)
        connection = http.client.HTTPConnection(parts.hostname, parts.port)

        def one_request() -> int:
            connection.request("POST", "/v1/ids", body=b"{}", headers={"content-type": "application/json"})
            return int(json.loads(connection.getresponse().read())["id"])

        subjects["client next_id() (prefetched)"] = lambda: per_call_ns(client.next_id, seconds)
        subjects["HTTP request per ID"] = lambda: per_call_ns(one_request, seconds / 10)
    results: Dict[str, List[float]] = {name: [] for name in subjects}
    names = list(subjects)
    for round in range(rounds):
        for name in names[round % len(names):] + names[: round % len(names)]:
            results[name].append(subjects[name]())
    median = {name: statistics.median(values) for name, values in results.items()}
    floor = median["time.time_ns() (floor)"]
    print(f"{'':40} {'ns/call':>9} {'x floor':>8} {'x idgen':>8}   (median of {rounds} rounds of {seconds:g} s)")
    for name in names:
        print(f"{name:40} {median[name]:9.1f} {median[name] / floor:8.2f} {median[name] / median['idgen next_id()']:8.2f}")
    if worker:
        ratio = median["HTTP request per ID"] / median["client next_id() (prefetched)"]
        print(f"the client's prefetched next_id() is {ratio:.0f}x as fast as one HTTP request per ID")
    generator.close()


if __name__ == "__main__":
    main()
