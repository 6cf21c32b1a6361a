"""The embedded generator from Python: IDs, batches, UUIDs and decode from the Rust core, bad
input refused with the right exception, refusals raised as ``idgen.RefusedError``, a fork that can
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
        async with await idgen.EmbeddedGenerator.astart(config) as generator:
            taken = [await generator.anext_id(), await generator.anext_ids(3), await generator.anext_uuids(2)]
        with pytest.raises(idgen.IdgenError, match="closed"):
            await generator.anext_id()
        return taken

    one, three, two = asyncio.run(main())
    assert isinstance(one, int) and len(three) == 3 and len(two) == 2 and one < three[0]


def test_an_id_in_memory_is_awaited_without_a_thread(config: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``await anext_id()`` returns an ID the generator has now on the loop's own thread: no
    executor is asked (measured as a user would before: 272× ``next_id()``, all of it the hop)."""
    hops: List[str] = []
    real_wait = idgen._wait

    async def counted(call: Any, *args: Any, **kwargs: Any) -> Any:
        hops.append(getattr(call, "__name__", repr(call)))
        return await real_wait(call, *args, **kwargs)

    monkeypatch.setattr(idgen, "_wait", counted)

    async def main() -> List[int]:
        async with await idgen.EmbeddedGenerator.astart(config) as generator:
            return [await generator.anext_id() for _ in range(2_000)]

    ids = asyncio.run(main())
    assert len(set(ids)) == 2_000 and all(a < b for a, b in zip(ids, ids[1:]))
    # The start and the close wait; of 2,000 IDs at most those that met a full millisecond did.
    assert hops.count("start") == 1 and hops.count("close") == 1
    assert hops.count("next_id") < 20, hops


def test_a_generator_never_closed_releases_its_lease_when_the_interpreter_exits(tmp_path: pathlib.Path) -> None:
    """One machine number for the whole file: a second generator can start only if the first
    released it. The first's process exits without closing it (kept alive in a cycle until the
    end); the package closes it at exit."""
    config = development_config(tmp_path)
    with config.open("a", encoding="utf-8") as file:
        file.write("[lease.machines.v1]\nfirst = 64\nlast = 64\n[lease.machines.v2]\nfirst = 64\nlast = 64\n")
    script = (
        "import idgen, sys\n"
        f"g = idgen.EmbeddedGenerator.start({str(config)!r})\n"
        "cycle = [g]; cycle.append(cycle)\n"
        "print(g.next_id(), flush=True)\n"
    )
    first = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert first.returncode == 0, first.stderr
    with idgen.EmbeddedGenerator.start(config, ready_timeout=5) as second:
        assert second.next_id() > int(first.stdout)


def test_bad_input_is_value_or_type_error_and_changes_nothing(config: pathlib.Path) -> None:
    with idgen.EmbeddedGenerator.start(config) as generator:
        before = generator.next_id()
        for count in (0, -1, idgen.MAX_COUNT + 1, 2**70):
            with pytest.raises(idgen.InvalidInputError) as refused:
                generator.next_ids(count)
            assert refused.value.code == "invalid_count"
        for count in (True, 1.0, "5", None):
            with pytest.raises(TypeError):
                generator.next_ids(count)  # type: ignore[arg-type]
        with pytest.raises(TypeError):
            generator.decode(1.5)  # type: ignore[arg-type]
        with pytest.raises(idgen.InvalidInputError):
            generator.decode(2**63)
        assert generator.next_id() > before


def test_a_configuration_it_cannot_use_is_refused_by_name(tmp_path: pathlib.Path) -> None:
    # A file that starts a generator, and the same file with one key misspelt: only that key can
    # be what is refused.
    good = development_config(tmp_path)
    with idgen.EmbeddedGenerator.start(good) as generator:
        assert generator.next_id() > 0
    bad = tmp_path / "bad.toml"
    bad.write_text(good.read_text(encoding="utf-8").replace("[lease]\n", "[lease]\nstroe = \"sqlite\"\n"), encoding="utf-8")
    with pytest.raises(idgen.InvalidInputError) as refused:
        idgen.EmbeddedGenerator.start(bad)
    assert refused.value.code == "invalid_config" and "stroe" in str(refused.value)
    with pytest.raises(idgen.InvalidInputError):
        idgen.EmbeddedGenerator.start(tmp_path / "missing.toml")


def test_a_clock_it_cannot_trust_is_a_refusal(tmp_path: pathlib.Path) -> None:
    """With the clock check on, the kernel's word decides: this CI machine reports its clock
    unsynchronized, and then the generator never issues (``Refused``, with a retry)."""
    config = development_config(tmp_path, clock_check=True)
    if kernel_clock_synchronized():
        with idgen.EmbeddedGenerator.start(config) as generator:
            assert generator.next_id() > 0
        return
    with pytest.raises(idgen.RefusedError) as refused:
        idgen.EmbeddedGenerator.start(config, ready_timeout=1.0)
    assert refused.value.reason == "clock_unsynchronized"
    assert refused.value.retry_after is not None and refused.value.retry_after > 0
    generator = idgen.EmbeddedGenerator.start(config, ready_timeout=None)
    try:
        with pytest.raises(idgen.RefusedError) as refused:
            generator.next_id()
        assert refused.value.reason in ("clock_unsynchronized", "lease")
        assert isinstance(generator.refusal(), idgen.RefusedError)
    finally:
        generator.close()


def test_threads_sharing_one_generator_each_get_unique_increasing_ids(config: pathlib.Path) -> None:
    per_thread: Dict[int, List[int]] = {}

    def take(number: int) -> None:
        per_thread[number] = [generator.next_id() for _ in range(20_000)]

    with idgen.EmbeddedGenerator.start(config) as generator:
        threads = [threading.Thread(target=take, args=(n,)) for n in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    everything = [id for ids in per_thread.values() for id in ids]
    assert len(everything) == 160_000 and len(set(everything)) == 160_000, "no ID twice"
    for ids in per_thread.values():
        assert all(a < b for a, b in zip(ids, ids[1:])), "each thread's IDs increase"


def test_one_error_family_with_pep8_names_and_the_old_ones_as_aliases(tmp_path: pathlib.Path) -> None:
    for error in (idgen.RefusedError, idgen.RejectedError, idgen.InvalidInputError):
        assert issubclass(error, idgen.IdgenError), error
    assert issubclass(idgen.InvalidInputError, ValueError)
    assert (idgen.Refused, idgen.Rejected, idgen.InvalidInput) == (
        idgen.RefusedError, idgen.RejectedError, idgen.InvalidInputError)
    assert idgen.Mapping is idgen.PublicIdMapping and "Mapping" not in idgen.__all__
    namespace: Dict[str, Any] = {}
    exec("import typing\nfrom idgen import *", namespace)
    assert "Mapping" not in namespace, "a star import shadows typing.Mapping"
    # What raised Python's own errors before.
    with pytest.raises(idgen.InvalidInputError) as bad_timeout:
        idgen.EmbeddedGenerator.start(development_config(tmp_path), ready_timeout=-1)
    assert bad_timeout.value.code == "invalid_config"
    with pytest.raises(idgen.InvalidInputError) as not_a_uuid:
        idgen.typeid_text("order", "0190a9c2-8b4e-7000-8000-000000000000")  # type: ignore[arg-type]
    assert not_a_uuid.value.code == "invalid_typeid"


def test_the_version_is_the_installed_distributions() -> None:
    import importlib.metadata

    assert idgen.__version__ == importlib.metadata.version("idgen-sdk")


def test_a_closed_generator_refuses(config: pathlib.Path) -> None:
    generator = idgen.EmbeddedGenerator.start(config)
    generator.close()
    generator.close()
    with pytest.raises(idgen.IdgenError, match="closed"):
        generator.next_id()


def test_a_forked_child_never_issues_under_its_parents_lease(config: pathlib.Path) -> None:
    """The parent's handle refuses in the child, and so does a generator the child starts on the
    parent's open SQLite lease file (its SQLite would take no real lock there); the child may
    start a client, or a generator on another store, and the parent issues on."""
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
            except idgen.RefusedError as refused:
                report.append(f"refused:{refused.reason}:{refused.retry_after}")
            try:
                generator.next_ids(10)
                report.append("issued")
            except idgen.RefusedError as refused:
                report.append(f"refused:{refused.reason}")
            try:
                with idgen.EmbeddedGenerator.start(config) as own:
                    report.append(f"started:{own.next_id()}")
            except idgen.RefusedError as refused:
                report.append(f"refused:{refused.reason}:{refused.retry_after}")
                report.append(str(refused).replace("\n", " "))
            os.write(write, "\n".join(report).encode())
            os._exit(0)
        os.close(write)
        parent_ids += [generator.next_id() for _ in range(1000)]
        with os.fdopen(read) as pipe:
            report = pipe.read().split("\n")
        _, status = os.waitpid(pid, 0)
        assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, report
        assert report[0] == "refused:forked:None" and report[1] == "refused:forked", report
        assert report[2] == "refused:forked:None", report
        assert "post-fork" in report[3] and "spawn" in report[3] and "client" in report[3], report[3]
        assert all(a < b for a, b in zip(parent_ids, parent_ids[1:]))
        assert generator.next_id() > parent_ids[-1], "the parent issues on after the fork"


SPLIT_CHILD = """
import json, os, sys, time, idgen
config, out = sys.argv[1], sys.argv[2]
parent = idgen.EmbeddedGenerator.start(config, ready_timeout=30)
parent_ids = parent.next_ids(1000)
pid = os.fork()
if pid == 0:
    # The child starts its own generator on the same file, as a forked worker is told to, and
    # takes IDs for 14 s.
    ids, refusal = [], None
    try:
        own = idgen.EmbeddedGenerator.start(config, ready_timeout=30)
        deadline = time.monotonic() + 14
        while time.monotonic() < deadline:
            try:
                ids += own.next_ids(100)
            except idgen.RefusedError:
                pass
            time.sleep(0.002)
    except idgen.RefusedError as refused:
        refusal = f"{refused.reason}: {refused}"
    with open(out + ".child", "w") as f:
        fds = []
        for fd in os.listdir("/proc/self/fd"):
            try:
                fds.append(os.readlink(f"/proc/self/fd/{fd}"))
            except OSError:
                pass
        json.dump({"ids": ids, "refusal": refusal, "fds": sorted(fd for fd in fds if "leases.db" in fd)}, f)
    os._exit(0)
# The parent closes after 1.5 s (its last connection: SQLite checkpoints and may delete the WAL).
time.sleep(1.5)
parent_ids += parent.next_ids(1000)
parent.close()
with open(out + ".parent", "w") as f:
    json.dump({"ids": parent_ids, "child": pid}, f)
os.waitpid(pid, 0)
"""


def test_a_forked_child_cannot_split_the_lease_file_its_parent_had_open(tmp_path: pathlib.Path) -> None:
    """The fork pattern the package documents, as a new user would write it: the parent starts
    a generator (machine numbers 64 and 65, a 3 s lease), forks; the child starts its own on the same file and takes
    IDs for 14 s; the parent closes after 1.5 s; two fresh processes then start on the same file.
    Before the fix the child's connections took no real lock: the parent's close deleted the WAL
    it renewed in, and a fresh process claimed the child's number while the child issued (some
    10^5 IDs twice). Now the child is refused the file, and no ID repeats."""
    config = tmp_path / "generator.toml"
    config.write_text(
        "development = true\n"
        "[lease]\n"
        'store = "sqlite"\n'
        f'sqlite_path = "{tmp_path / "leases.db"}"\n'
        "create_tables = true\n"
        "lease_ms = 3000\nrenew_interval_ms = 1000\nfence_ms = 500\n"
        "first_machine = 64\nlast_machine = 65\n"
        "max_backoff_ms = 200\n"
        "[clock]\nrequire_sync = false\n",
        encoding="utf-8",
    )
    out = tmp_path / "ids"
    forking = subprocess.Popen([sys.executable, "-c", SPLIT_CHILD, str(config), str(out)])
    # The fresh processes start once the parent has closed (2 s in), beside the child's 14 s.
    deadline = time.monotonic() + 30
    while not (tmp_path / "ids.parent").exists():
        assert time.monotonic() < deadline and forking.poll() is None, "the forking process did not get as far"
        time.sleep(0.05)
    writers = [
        subprocess.Popen([sys.executable, "-c", WRITER, str(config), str(tmp_path / f"fresh-{n}"), "12"],
                         stdout=subprocess.PIPE, text=True)
        for n in range(2)
    ]
    for writer in writers:
        assert writer.wait(timeout=60) == 0
    assert forking.wait(timeout=60) == 0
    parent = json.loads((tmp_path / "ids.parent").read_text())
    child = json.loads((tmp_path / "ids.child").read_text())
    everyone: List[int] = list(parent["ids"]) + list(child["ids"])
    for n in range(2):
        fresh = [int(line) for line in (tmp_path / f"fresh-{n}").read_text().split()]
        assert fresh and all(a < b for a, b in zip(fresh, fresh[1:]))
        everyone += fresh
    wal = [name for name in child["fds"] if "(deleted)" in name]
    assert len(everyone) == len(set(everyone)), (
        f"{len(everyone) - len(set(everyone))} of {len(everyone)} IDs issued twice (the child's: {len(child['ids'])})"
    )
    assert child["refusal"] and child["refusal"].startswith("forked:"), child["refusal"]
    assert child["ids"] == [], "the child issued on a file its parent had open"
    assert not wal, wal


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
