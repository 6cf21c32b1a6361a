"""Shared set-up for the Python package's tests: they run against the package as installed (a
wheel in a fresh virtualenv, scripts/test-sdk), never the source tree."""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import os
import pathlib
from typing import Any, Dict, Optional

import pytest

VECTORS = pathlib.Path(__file__).resolve().parents[2] / "vectors"


def vectors(name: str) -> Any:
    return json.loads((VECTORS / name).read_text(encoding="utf-8"))


def development_config(
    directory: pathlib.Path, *, clock_check: bool = False, name: str = "generator.toml", listen: Optional[str] = None
) -> pathlib.Path:
    """A development generator on a SQLite lease file in ``directory`` (shared by every process
    given the same directory); with ``listen``, a worker's (the generator's keys and its
    listener)."""
    path = directory / name
    path.write_text(
        "development = true\n"
        + (f'listen = "{listen}"\n' if listen else "")
        + "[lease]\n"
        'store = "sqlite"\n'
        f'sqlite_path = "{directory / "leases.db"}"\n'
        "create_tables = true\n"
        "[clock]\n"
        f"require_sync = {'true' if clock_check else 'false'}\n",
        encoding="utf-8",
    )
    return path


def kernel_clock_synchronized() -> bool:
    """What the kernel says of its clock (adjtimex: TIME_ERROR, 5, is unsynchronized)."""

    class Timex(ctypes.Structure):
        _fields_ = [("modes", ctypes.c_uint), ("pad", ctypes.c_byte * 204)]

    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    return int(libc.adjtimex(ctypes.byref(Timex()))) != 5


def idgen_bin() -> str:
    """The `idgen` binary (scripts/test-sdk sets IDGEN_BIN): a failure in CI when it is missing."""
    binary = os.environ.get("IDGEN_BIN")
    if not binary:
        if os.environ.get("CI") == "true":
            pytest.fail("IDGEN_BIN (the idgen binary) is not set: scripts/test-sdk sets it")
        pytest.skip("IDGEN_BIN is not set")
    return binary


def node_project() -> pathlib.Path:
    """The fresh npm project scripts/test-sdk installs the Node package into (IDGEN_NODE_PROJECT),
    its tests beside it: a failure in CI when it is missing."""
    project = os.environ.get("IDGEN_NODE_PROJECT")
    if not project:
        if os.environ.get("CI") == "true":
            pytest.fail("IDGEN_NODE_PROJECT (the Node package's test project) is not set: scripts/test-sdk sets it")
        pytest.skip("IDGEN_NODE_PROJECT is not set")
    return pathlib.Path(project)


@pytest.fixture
def config(tmp_path: pathlib.Path) -> pathlib.Path:
    return development_config(tmp_path)


def as_vector(decoded: Any) -> Dict[str, Any]:
    """An ``idgen.Decoded`` as the vector files write a decode answer."""
    at = decoded.created_at
    assert at.tzinfo is not None and at.utcoffset().total_seconds() == 0
    out: Dict[str, Any] = {
        "id": str(decoded.id),
        "layout": decoded.layout,
        "created_at": at.strftime("%Y-%m-%dT%H:%M:%S.") + f"{at.microsecond // 1000:03d}Z",
        "created_at_unix_ms": decoded.created_at_unix_ms,
    }
    for key in ("region_number", "region", "machine", "sequence"):
        value = getattr(decoded, key)
        if value is not None:
            out[key] = value
    return out
