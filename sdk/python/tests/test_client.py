"""The fleet client from Python against the real platform (`idgen up`, two regions, one worker
each, the v2 cutover a few seconds in so both issue): single, batch and UUID IDs, local decode
that agrees with the worker's decode endpoint for every ID, failover when the local fleet is
frozen (SIGSTOP) with IDs coming from the other region under its region number, and the move
back once it answers again."""

from __future__ import annotations

import asyncio
import json
import os
import pathlib
import signal
import socket
import subprocess
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Dict, Iterator, List, Tuple

import pytest

import idgen
from conftest import idgen_bin


def free_base_port() -> int:
    """A base port whose block of twenty (`up` takes P to P+19) is free now."""
    for base in range(21000, 40000, 20):
        try:
            for port in range(base, base + 20):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
    raise AssertionError("no free block of 20 ports")


def get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as answer:
        return json.load(answer)


def worker_pid(up: int, region: str) -> int:
    """The `idgen worker` process `up` started for `region`."""
    for entry in pathlib.Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            command = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        parent = int(stat.rsplit(")", 1)[1].split()[1])
        if parent == up and b"worker" in command and any(region.encode() in part for part in command):
            return int(entry.name)
    raise AssertionError(f"no worker of {region} under {up}")


@pytest.fixture
def platform(tmp_path: pathlib.Path) -> Iterator[Tuple[Dict[str, Any], int]]:
    yield from run_up(tmp_path, ["--regions", "us-east-1,eu-west-1", "--cutover-in", "3s"])


@pytest.fixture
def tls_platform(tmp_path: pathlib.Path) -> Iterator[Tuple[Dict[str, Any], int]]:
    yield from run_up(tmp_path, ["--tls"])


def run_up(tmp_path: pathlib.Path, extra: List[str]) -> Iterator[Tuple[Dict[str, Any], int]]:
    up = subprocess.Popen(
        [idgen_bin(), "up", "--workers", "1", *extra,
         "--base-port", str(free_base_port()), "--dir", str(tmp_path / ".idgen"), "--json"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env={**os.environ, "RUST_LOG": "warn"},
    )
    try:
        assert up.stdout is not None
        summary = json.loads(up.stdout.readline())
        deadline = time.monotonic() + 30
        for worker in summary["workers"] if summary["tls_dir"] is None else []:
            while True:  # past the cutover, both regions issue (v2 has a region field)
                try:
                    if get(f"{worker['url']}/healthz")["status"] == "ok":
                        break
                except OSError:
                    pass
                assert time.monotonic() < deadline, f"{worker['name']} never issued"
                time.sleep(0.1)
        yield summary, up.pid
    finally:
        for pid in [p for p in [up.pid] if up.poll() is None]:
            for child in pathlib.Path(f"/proc/{pid}/task/{pid}/children").read_text().split():
                os.kill(int(child), signal.SIGCONT)
            os.kill(pid, signal.SIGINT)
        up.wait(timeout=60)


def test_ids_decode_failover_and_failback_through_the_real_platform(platform: Tuple[Dict[str, Any], int]) -> None:
    summary, up = platform
    home, other = summary["workers"]
    client = idgen.Client(
        home["url"],
        backups=[other["url"]],
        registry_url=summary["registry"],
        request_timeout_ms=300,
        probe_interval_ms=200,
        prefetch={"batch": 50, "low_water": 10, "validity_ms": 2000},
    )
    with client:
        ids: List[int] = [client.next_id() for _ in range(120)]
        assert all(a < b for a, b in zip(ids, ids[1:]))
        batch = client.next_ids(1500)
        assert len(batch) == 1500 and all(a < b for a, b in zip(batch, batch[1:]))
        uuids = client.next_uuids(5)
        assert [u.version for u in uuids] == [7] * 5
        home_number = client.decode(ids[0]).region_number
        assert client.decode(ids[0]).region == "us-east-1" and client.endpoint == home["url"]

        # The home region's fleet frozen: IDs keep coming, from eu-west-1's fleet.
        frozen = worker_pid(up, "us-east-1")
        os.kill(frozen, signal.SIGSTOP)
        try:
            during = [client.next_id() for _ in range(150)]
            assert client.endpoint == other["url"]
            moved = client.decode(during[-1])
            assert moved.region == "eu-west-1" and moved.region_number != home_number
        finally:
            os.kill(frozen, signal.SIGCONT)

        # And back, once the home fleet answers its health probe.
        deadline = time.monotonic() + 15
        after: List[int] = []
        while client.endpoint != home["url"]:
            assert time.monotonic() < deadline, "the client never moved back to the home region"
            after.append(client.next_id())
            time.sleep(0.02)
        after += [client.next_id() for _ in range(60)]
        assert client.decode(after[-1]).region == "us-east-1"

        everything = ids + batch + during + after
        assert len(set(everything)) == len(everything), "no ID twice"
        for id in ids + during + after:
            assert client.decode(id) == client.decode(str(id))
            theirs = get(f"{home['url']}/v1/ids/{id}/decode")
            ours = client.decode(id)
            assert (theirs["layout"], theirs["machine"], theirs["sequence"], theirs.get("region_number")) == (
                ours.layout, ours.machine, ours.sequence, ours.region_number
            ), id
            assert theirs.get("region") == ours.region and theirs["created_at"].startswith(
                ours.created_at.strftime("%Y-%m-%dT%H:%M:%S.")
            )
        assert "idgen_client" in client.metrics_text()


def test_settings_it_cannot_use_and_a_fleet_that_never_answers() -> None:
    with pytest.raises(idgen.InvalidInputError) as refused:
        idgen.Client("http://127.0.0.1:9", prefetch={"bacth": 5})
    assert refused.value.code == "invalid_config" and "bacth" in str(refused.value)
    with pytest.raises(idgen.InvalidInputError):
        idgen.Client("not a url")
    with idgen.Client("http://127.0.0.1:9", request_timeout_ms=200, connect_timeout_ms=100) as client:
        with pytest.raises(idgen.RefusedError) as unavailable:
            client.next_id()
        assert unavailable.value.reason == "unavailable" and unavailable.value.retry_after
    client.close()
    with pytest.raises(idgen.IdgenError, match="closed"):
        client.next_id()


def test_public_ids_made_resolved_and_looked_up_through_the_real_service(platform: Tuple[Dict[str, Any], int]) -> None:
    summary, _ = platform
    home = summary["workers"][0]["url"]
    internal = [int(i) for i in get_ids(home, 3)]
    service = idgen.PublicIds(summary["public_ids"], request_timeout_ms=2000)

    opaque = service.create(internal[0])
    assert opaque.created is True and opaque.format == "opaque" and len(opaque.public_id) == 26
    again = service.create(str(internal[0]))
    assert again.created is False and again.public_id == opaque.public_id, "one public ID per internal ID and format"
    found = service.resolve(opaque.public_id)
    assert found is not None and found.internal_id == internal[0] and found.public_id == opaque.public_id
    looked_up = service.lookup(internal[0], format="opaque")
    assert looked_up is not None and looked_up.public_id == opaque.public_id

    typed = service.create(internal[1], type="order")
    assert typed.public_id.startswith("order_") and typed.type == "order"
    prefix, _ = idgen.parse_typeid(typed.public_id)
    assert prefix == "order"
    resolved = service.resolve(typed.public_id)
    assert resolved is not None and resolved.internal_id == internal[1]

    for format in ("uuidv7", "encrypted"):
        made = service.create(internal[2], format=format)
        back = service.resolve(made.public_id)
        assert back is not None and back.internal_id == internal[2], format

    # Forged and unknown look the same: None. Bad input is refused before any call.
    assert service.resolve("0" * 26) is None
    assert service.resolve("order_" + "7" + "z" * 25) is None
    assert service.lookup(internal[2] + 1) is None
    with pytest.raises(idgen.RejectedError) as rejected:
        service.create(internal[0], type="no_such_type")
    assert 400 <= rejected.value.status < 500 and rejected.value.code
    with pytest.raises(idgen.InvalidInputError):
        service.create(2**63)
    with pytest.raises(TypeError):
        service.create(1.5)  # type: ignore[arg-type]

    async def in_asyncio() -> None:
        async with idgen.PublicIds(summary["public_ids"], request_timeout_ms=2000) as service:
            made = await service.acreate(internal[2], type="order")
            back = await service.aresolve(made.public_id)
            assert back is not None and back.internal_id == internal[2]
            looked_up = await service.alookup(internal[2], type="order")
            assert looked_up is not None and looked_up.public_id == made.public_id
        with pytest.raises(idgen.IdgenError, match="closed"):
            await service.aresolve(made.public_id)

    asyncio.run(in_asyncio())
    with service:
        assert service.resolve(opaque.public_id) is not None
    with pytest.raises(idgen.IdgenError, match="closed"):
        service.resolve(opaque.public_id)


class CountingExecutor(ThreadPoolExecutor):
    """The loop's default executor, counting what is given to it."""

    def __init__(self) -> None:
        super().__init__(max_workers=2)
        self.submitted = 0

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        self.submitted += 1
        return super().submit(fn, *args, **kwargs)


def test_the_loop_runs_on_while_a_call_waits_on_a_frozen_fleet() -> None:
    """A fleet that takes the connection and never answers (a listening socket nobody accepts
    from): while ``await anext_id()`` waits out the request timeout, a ticker task on the same
    loop keeps ticking, and the loop's default executor (the host's) is never used."""
    with socket.socket() as frozen:
        frozen.bind(("127.0.0.1", 0))
        frozen.listen(16)
        url = f"http://127.0.0.1:{frozen.getsockname()[1]}"

        async def main() -> Tuple[int, float, int]:
            loop = asyncio.get_running_loop()
            default = CountingExecutor()
            loop.set_default_executor(default)
            ticks = 0

            async def ticker() -> None:
                nonlocal ticks
                while True:
                    await asyncio.sleep(0.01)
                    ticks += 1

            ticking = asyncio.create_task(ticker())
            started = time.monotonic()
            async with await idgen.Client.aconnect(url, request_timeout_ms=1500, connect_timeout_ms=500) as client:
                with pytest.raises(idgen.RefusedError) as refused:
                    await client.anext_id()
                assert refused.value.reason == "unavailable"
                with pytest.raises(idgen.RefusedError):
                    await client.anext_ids(10)
            waited = time.monotonic() - started
            ticking.cancel()
            return ticks, waited, default.submitted

        ticks, waited, submitted = asyncio.run(main())
    assert waited >= 1.4, f"the calls did not wait on the fleet ({waited:.2f} s)"
    # A tick every 10 ms while the calls waited: the loop was never held (at least half of them,
    # for a loaded machine).
    assert ticks >= waited / 0.01 / 2, f"{ticks} ticks in {waited:.2f} s: the loop was blocked"
    assert submitted == 0, "the loop's default executor is the host's: idgen uses its own threads"


def get_ids(url: str, count: int) -> List[str]:
    request = urllib.request.Request(
        f"{url}/v1/ids:batch", data=json.dumps({"count": count}).encode(), headers={"content-type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=5) as answer:
        ids: List[str] = json.load(answer)["ids"]
        return ids


def test_mutual_tls_with_the_client_certificate_up_made(tls_platform: Tuple[Dict[str, Any], int]) -> None:
    """`idgen up --tls`: every listener wants a client certificate. The Rust client's `tls` keys
    (`ca`, `cert`, `key`) from Python: with `orders`' certificate IDs come; without one, the
    handshake is refused and no ID comes."""
    summary, _ = tls_platform
    tls = pathlib.Path(summary["tls_dir"])
    url = summary["workers"][0]["url"]
    assert url.startswith("https://")
    settings = {"ca": str(tls / "ca.pem"), "cert": str(tls / "orders.pem"), "key": str(tls / "orders-key.pem")}
    deadline = time.monotonic() + 30
    with idgen.Client(url, tls=settings, request_timeout_ms=2000) as client:
        while True:
            try:
                ids = client.next_ids(10)
                break
            except idgen.RefusedError:
                assert time.monotonic() < deadline, "the worker never issued over mutual TLS"
                time.sleep(0.2)
        assert len(ids) == 10 and client.next_id() > ids[-1]
        public = idgen.PublicIds(summary["public_ids"], tls=settings, request_timeout_ms=2000).create(ids[0])
        assert len(public.public_id) == 26
    with idgen.Client(url, tls={"ca": str(tls / "ca.pem")}, request_timeout_ms=500) as anonymous:
        with pytest.raises(idgen.RefusedError) as refused:
            anonymous.next_id()
        assert refused.value.reason == "unavailable"
    with pytest.raises(idgen.InvalidInputError):
        idgen.Client(url, tls={"cert": str(tls / "orders.pem")})
