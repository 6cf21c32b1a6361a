"""The embedded generator from Python: IDs, batches, UUIDs and decode from the Rust core, bad
input refused with the right exception, refusals raised as ``idgen.Refused``, a fork that can
never issue under its parent's lease, and several processes on one lease file."""

from __future__ import annotations

import asyncio
import json
import os
import pathlib
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from typing import Any, Dict, List

import pytest

import idgen
from conftest import development_config, idgen_bin, kernel_clock_synchronized, node_project


def test_ids_batches_uuids_and_decode(config: pathlib.Path) -> None:
    with idgen.EmbeddedGenerator.start(config) as generator:
        ids = [generator.next_id() for _ in range(20_000)]
        assert all(a < b for a, b in zip(ids, ids[1:])), "single IDs increase"
        batch = generator.next_ids(1000)
        assert len(batch) == 1000 and ids[-1] < batch[0]
        assert all(a < b for a, b in zip(batch, batch[1:]))
        uuids = generator.next_uuids(50)
        assert all(isinstance(u, uuid.UUID) and u.version == 7 for u in uuids)
        assert uuids == sorted(uuids) and len(set(uuids)) == 50

        decoded = generator.decode(batch[0])
        assert decoded.id == batch[0] and decoded.layout in ("v1", "v2")
        assert decoded.machine is not None and decoded.machine >= 64, "embedders take machine numbers 64 and up"
        assert abs(decoded.created_at.timestamp() - time.time()) < 60
        assert generator.decode(str(batch[0])) == decoded
        assert generator.decode(str(uuids[0])).layout == "uuidv7"
        assert generator.region and generator.region_number >= 0
        assert generator.refusal() is None
        metrics = generator.metrics_text()
        assert "idgen_build_info" in metrics and 'role="embedded"' in metrics


def test_asyncio_variants(config: pathlib.Path) -> None:
    async def main() -> List[Any]:
        with idgen.EmbeddedGenerator.start(config) as generator:
            return [await generator.anext_id(), await generator.anext_ids(3), await generator.anext_uuids(2)]

    one, three, two = asyncio.run(main())
    assert isinstance(one, int) and len(three) == 3 and len(two) == 2 and one < three[0]


def test_bad_input_is_value_or_type_error_and_changes_nothing(config: pathlib.Path) -> None:
    with idgen.EmbeddedGenerator.start(config) as generator:
        before = generator.next_id()
        for count in (0, -1, idgen.MAX_COUNT + 1, 2**70):
            with pytest.raises(idgen.InvalidInput) as refused:
                generator.next_ids(count)
            assert refused.value.code == "invalid_count"
        for count in (True, 1.0, "5", None):
            with pytest.raises(TypeError):
                generator.next_ids(count)  # type: ignore[arg-type]
        with pytest.raises(TypeError):
            generator.decode(1.5)  # type: ignore[arg-type]
        with pytest.raises(idgen.InvalidInput):
            generator.decode(2**63)
        assert generator.next_id() > before


def test_a_configuration_it_cannot_use_is_refused_by_name(tmp_path: pathlib.Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("development = true\n[lease]\nstroe = \"sqlite\"\n", encoding="utf-8")
    with pytest.raises(idgen.InvalidInput) as refused:
        idgen.EmbeddedGenerator.start(bad)
    assert refused.value.code == "invalid_config" and "stroe" in str(refused.value)
    with pytest.raises(idgen.InvalidInput):
        idgen.EmbeddedGenerator.start(tmp_path / "missing.toml")


def test_a_clock_it_cannot_trust_is_a_refusal(tmp_path: pathlib.Path) -> None:
    """With the clock check on, the kernel's word decides: this CI machine reports its clock
    unsynchronized, and then the generator never issues (``Refused``, with a retry)."""
    config = development_config(tmp_path, clock_check=True)
    if kernel_clock_synchronized():
        with idgen.EmbeddedGenerator.start(config) as generator:
            assert generator.next_id() > 0
        return
    with pytest.raises(idgen.Refused) as refused:
        idgen.EmbeddedGenerator.start(config, ready_timeout=1.0)
    assert refused.value.reason == "clock_unsynchronized"
    assert refused.value.retry_after is not None and refused.value.retry_after > 0
    generator = idgen.EmbeddedGenerator.start(config, ready_timeout=None)
    try:
        with pytest.raises(idgen.Refused) as refused:
            generator.next_id()
        assert refused.value.reason in ("clock_unsynchronized", "lease")
        assert isinstance(generator.refusal(), idgen.Refused)
    finally:
        generator.close()


def test_a_closed_generator_refuses(config: pathlib.Path) -> None:
    generator = idgen.EmbeddedGenerator.start(config)
    generator.close()
    generator.close()
    with pytest.raises(idgen.IdgenError, match="closed"):
        generator.next_id()


def test_a_forked_child_never_issues_under_its_parents_lease(config: pathlib.Path) -> None:
    with idgen.EmbeddedGenerator.start(config) as generator:
        parent_ids = [generator.next_id() for _ in range(1000)]
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child
            os.close(read)
            report = []
            try:
                generator.next_id()
                report.append("issued")
            except idgen.Refused as refused:
                report.append(f"refused:{refused.reason}:{refused.retry_after}")
            try:
                generator.next_ids(10)
                report.append("issued")
            except idgen.Refused as refused:
                report.append(f"refused:{refused.reason}")
            # Its own generator claims its own machine number.
            with idgen.EmbeddedGenerator.start(config) as own:
                ids = own.next_ids(1000)
                report.append(f"holder:{own.holder}")
                report.append(" ".join(map(str, ids)))
            os.write(write, "\n".join(report).encode())
            os._exit(0)
        os.close(write)
        parent_ids += [generator.next_id() for _ in range(1000)]
        with os.fdopen(read) as pipe:
            report = pipe.read().split("\n")
        _, status = os.waitpid(pid, 0)
        assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, report
        assert report[0] == "refused:forked:None" and report[1] == "refused:forked", report
        assert report[2] != f"holder:{generator.holder}"
        child_ids = [int(i) for i in report[3].split()]
        assert len(child_ids) == 1000 and not set(child_ids) & set(parent_ids)
        assert generator.decode(child_ids[0]).machine != generator.decode(parent_ids[0]).machine
        assert generator.next_id() > parent_ids[-1], "the parent issues on after the fork"


WRITER = """
import sys, time, idgen
config, out, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])
with idgen.EmbeddedGenerator.start(config, ready_timeout=30) as generator, open(out, "w") as f:
    print("ready", flush=True)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        f.write("\\n".join(map(str, generator.next_ids(200))) + "\\n")
        f.write(str(generator.next_id()) + "\\n")
        f.flush()
        time.sleep(0.002)
"""


def start_worker(tmp_path: pathlib.Path) -> "tuple[subprocess.Popen[str], str]":
    """`idgen worker` (the Rust fleet worker, development mode) on the same lease file."""
    config = development_config(tmp_path, name="worker.toml", listen="127.0.0.1:0")
    worker = subprocess.Popen(
        [idgen_bin(), "worker", "--config", str(config)], stdout=subprocess.PIPE, text=True, env={**os.environ, "RUST_LOG": "warn"}
    )
    assert worker.stdout is not None
    for line in worker.stdout:
        if "idgen-worker listening on " in line:
            return worker, line.split("idgen-worker listening on ", 1)[1].split()[0]
    raise AssertionError("the worker exited before listening")


def test_four_python_and_two_node_processes_and_a_rust_worker_on_one_lease_file(tmp_path: pathlib.Path) -> None:
    """Four Python processes, two Node processes (the npm package, scripts/test-sdk's project)
    and a Rust worker on one SQLite lease file; one Python and one Node process killed with
    SIGKILL mid-run and started again: every ID unique, each process's IDs increasing."""
    node_writer = node_project() / "test" / "writer.mjs"
    config = development_config(tmp_path)
    worker, url = start_worker(tmp_path)
    from_worker: List[int] = []
    stop = threading.Event()

    def take_from_worker() -> None:
        while not stop.is_set():
            request = urllib.request.Request(
                f"{url}/v1/ids:batch", data=b'{"count": 100}', headers={"content-type": "application/json"}
            )
            try:
                with urllib.request.urlopen(request, timeout=5) as answer:
                    from_worker.extend(int(i) for i in json.load(answer)["ids"])
            except urllib.error.HTTPError as refusal:
                # The worker listens before it holds its lease and refuses (503, reason "lease")
                # until it does; a caller waits as Retry-After says, as the Rust client would.
                assert refusal.code == 503, refusal
                time.sleep(float(refusal.headers.get("retry-after", "1")))
                continue
            time.sleep(0.005)

    def start(name: str, seconds: float) -> "subprocess.Popen[str]":
        command = [sys.executable, "-c", WRITER] if name.startswith("p") else ["node", str(node_writer)]
        process = subprocess.Popen(
            [*command, str(config), str(tmp_path / f"{name}.ids"), str(seconds)],
            stdout=subprocess.PIPE,
            text=True,
        )
        processes[name] = process
        assert process.stdout is not None and process.stdout.readline().strip() == "ready", name
        return process

    processes: Dict[str, "subprocess.Popen[str]"] = {}
    taker = threading.Thread(target=take_from_worker, daemon=True)
    taker.start()
    try:
        for name in ("p0", "p1", "p2", "p3", "n0", "n1"):
            start(name, 4.0)
        time.sleep(1.0)
        for name in ("p0", "n0"):
            processes[name].send_signal(signal.SIGKILL)
            processes[name].wait()
            start(f"{name}-again", 2.0)
        for process in processes.values():
            process.wait(timeout=60)
    finally:
        stop.set()
        taker.join(timeout=10)
        for process in [*processes.values(), worker]:
            if process.poll() is None:
                process.terminate()
                process.wait(timeout=30)
    assert len(from_worker) > 1000 and all(a < b for a, b in zip(from_worker, from_worker[1:]))
    everything: List[int] = list(from_worker)
    for name in processes:
        text = (tmp_path / f"{name}.ids").read_text()
        # A process killed mid-write leaves its last line cut short: only whole lines count.
        ids = [int(line) for line in text[: text.rfind("\n") + 1].split("\n") if line]
        assert len(ids) > 1000, name
        assert all(a < b for a, b in zip(ids, ids[1:])), f"{name}'s IDs increase"
        everything += ids
    assert len(set(everything)) == len(everything), "no ID twice across the processes"
