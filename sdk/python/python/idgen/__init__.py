"""idgen from Python: unique 64-bit IDs from the embedded generator or the fleet, and decode.

Every rule (leases, the fence, the clock gate, prefetch, failover, the layouts) is idgen's Rust
core, which this package wraps; nothing of it is written again here.

    import idgen
    with idgen.EmbeddedGenerator.start("generator.toml") as generator:
        print(generator.next_id(), generator.decode(generator.next_id()).created_at)
"""

from __future__ import annotations

import asyncio
import atexit
import functools
import json
import os
import threading
import uuid
import weakref
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Sequence, TypeVar, Union

from . import _native
from ._types import (
    Decoded,
    IdgenError,
    InvalidInput,
    InvalidInputError,
    Mapping,
    PublicIdMapping,
    Refused,
    RefusedError,
    Rejected,
    RejectedError,
)

__all__ = [
    "__version__",
    "Client",
    "Decoded",
    "EmbeddedGenerator",
    "IdgenError",
    "InvalidInputError",
    "DEFAULT_ENV_PREFIX",
    "MAX_COUNT",
    "PublicIdMapping",
    "PublicIds",
    "RefusedError",
    "RejectedError",
    "decode",
    "default_schedule",
    "parse_typeid",
    "typeid_text",
]

__version__: str = _native.__version__
MAX_COUNT: int = _native.MAX_COUNT
DEFAULT_ENV_PREFIX: str = _native.DEFAULT_ENV_PREFIX
decode = _native.decode
default_schedule = _native.default_schedule
parse_typeid = _native.parse_typeid
typeid_text = _native.typeid_text

PathLike = Union[str, "os.PathLike[str]"]
_T = TypeVar("_T")

# The package's own threads for the calls that wait (on the fleet, a lease, the next
# millisecond): never the event loop's default executor, which the host's `asyncio.to_thread`
# and the loop's own DNS lookups share, so a slow fleet stalls nothing of theirs. Made on first
# use, and again in a forked child (the parent's threads are not there).
_WAITS: Optional[ThreadPoolExecutor] = None
_WAITS_PID = 0
_WAITS_LOCK = threading.Lock()
_WAIT_THREADS = 32


def _waits() -> ThreadPoolExecutor:
    global _WAITS, _WAITS_PID
    with _WAITS_LOCK:
        if _WAITS is None or _WAITS_PID != os.getpid():
            _WAITS = ThreadPoolExecutor(max_workers=_WAIT_THREADS, thread_name_prefix="idgen-wait")
            _WAITS_PID = os.getpid()
        return _WAITS


async def _wait(call: Callable[..., _T], *args: Any, **kwargs: Any) -> _T:
    """``call(*args, **kwargs)`` on the package's threads; the loop runs on meanwhile (the
    native call lets go of the GIL while it waits)."""
    return await asyncio.get_running_loop().run_in_executor(_waits(), functools.partial(call, *args, **kwargs))


class _Scoped:
    """``with``: the handle closed at the end of the block (a generator's lease released, a
    client's connections let go), whatever ended it."""

    __slots__ = ()

    if TYPE_CHECKING:  # the native class's, which comes after this one in the MRO

        def close(self) -> None: ...

    def __enter__(self: _T) -> _T:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class _Asyncio(_Scoped):
    """The asyncio variants. An ID already in memory is returned at once, on the loop's thread
    (the in-memory take never waits and never lets go of the GIL); a call that may wait runs on
    the package's own threads, never the loop's default executor. ``async with`` and
    ``aclose()`` close without blocking the loop."""

    __slots__ = ()

    if TYPE_CHECKING:  # the native class's, which comes after this one in the MRO

        def next_id(self) -> int: ...
        def try_next_id(self) -> Optional[int]: ...
        def next_ids(self, count: int) -> List[int]: ...
        def next_uuids(self, count: int) -> List[uuid.UUID]: ...

    async def anext_id(self) -> int:
        taken = self.try_next_id()
        if taken is not None:
            return taken
        return await _wait(self.next_id)

    async def anext_ids(self, count: int) -> List[int]:
        return await _wait(self.next_ids, count)

    async def anext_uuids(self, count: int) -> List[uuid.UUID]:
        return await _wait(self.next_uuids, count)

    async def aclose(self) -> None:
        await _wait(self.close)

    async def __aenter__(self: _T) -> _T:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()


# Generators not closed when the interpreter exits: closed then, so that their leases are
# released at once rather than left to expire. (In a forked child a parent's handle refuses to
# close, and is left as it is.)
_OPEN: "weakref.WeakSet[Any]" = weakref.WeakSet()


@atexit.register
def _close_at_exit() -> None:
    for handle in list(_OPEN):
        try:
            handle.close()
        except Exception:  # noqa: BLE001 - at exit, a handle that cannot close is left to expire
            pass


class EmbeddedGenerator(_Asyncio, _native.EmbeddedGenerator):
    """The embedded generator: the worker's generator in this process, on its own lease (SQLite
    or DynamoDB, as the configuration file says). ``next_id()`` takes no lock and makes no call
    in the common case; calls that wait let go of the GIL. A generator started before
    ``os.fork()`` refuses every call in the child (``RefusedError``, reason ``forked``): start one
    there."""

    @classmethod
    def start(
        cls,
        config_path: Optional[PathLike] = None,
        *,
        env_prefix: Optional[str] = None,
        ready_timeout: Optional[float] = 10.0,
    ) -> EmbeddedGenerator:
        """Starts the generator from ``config_path``, then the environment variables under
        ``env_prefix`` (default ``IDGEN_EMBEDDED``: ``IDGEN_EMBEDDED_LEASE__STORE=dynamodb``), and
        waits up to ``ready_timeout`` seconds for its first lease (``None``: not at all)."""
        path = None if config_path is None else os.fspath(config_path)
        return cls(path, env_prefix=env_prefix, ready_timeout=ready_timeout)

    @classmethod
    async def astart(
        cls,
        config_path: Optional[PathLike] = None,
        *,
        env_prefix: Optional[str] = None,
        ready_timeout: Optional[float] = 10.0,
    ) -> EmbeddedGenerator:
        """``start``, without blocking the event loop while the generator opens its lease store
        and waits for its first lease: ``async with await EmbeddedGenerator.astart(…) as g``."""
        return await _wait(cls.start, config_path, env_prefix=env_prefix, ready_timeout=ready_timeout)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        _OPEN.add(self)



def _settings(url: Optional[str], options: Dict[str, Any]) -> str:
    settings = dict(options)
    if url is not None:
        settings["url"] = url
    try:
        return json.dumps(settings)
    except (TypeError, ValueError) as error:
        raise InvalidInputError(f"settings: {error}", "invalid_config") from None


class Client(_Asyncio, _native.Client):
    """The fleet's client: prefetched IDs, failover to ``backups`` and back, local decode. Its
    settings are the Rust client's keys, as keyword arguments (``prefetch={"batch": 100}``,
    ``tls={"ca": …, "cert": …, "key": …}``, ``registry_url=…``) or a TOML file
    (``config_file=``)."""

    def __new__(
        cls,
        url: Optional[str] = None,
        *,
        backups: Optional[Sequence[str]] = None,
        config_file: Optional[PathLike] = None,
        **options: Any,
    ) -> Client:
        if config_file is not None:
            if url is not None or backups is not None or options:
                raise InvalidInputError("give the client's settings or a configuration file, not both", "invalid_config")
            return super().__new__(cls, None, os.fspath(config_file))
        if backups is not None:
            options["backups"] = list(backups)
        return super().__new__(cls, _settings(url, options), None)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    @classmethod
    async def aconnect(
        cls,
        url: Optional[str] = None,
        *,
        backups: Optional[Sequence[str]] = None,
        config_file: Optional[PathLike] = None,
        **options: Any,
    ) -> Client:
        """``Client(…)``, without blocking the event loop while it reads the registry's schedule
        (with ``registry_url``) and opens its connections."""
        return await _wait(cls, url, backups=backups, config_file=config_file, **options)


class PublicIds(_Scoped, _native.PublicIds):
    """The public-ID service's client: ``create(internal_id, *, format=None, type=None)`` (the
    mapping, made now or found; ``created`` says which), ``resolve(public_id)`` and
    ``lookup(internal_id, *, format=None, type=None)`` (the mapping or ``None``). Settings as the
    fleet client's: ``url``, ``request_timeout_ms``, ``connect_timeout_ms``, ``tls={…}``, or
    ``config_file=``. A refusal of the service's own is ``idgen.RejectedError`` (``status``, ``code``)."""

    def __new__(cls, url: Optional[str] = None, *, config_file: Optional[PathLike] = None, **options: Any) -> PublicIds:
        if config_file is not None:
            if url is not None or options:
                raise InvalidInputError("give the settings or a configuration file, not both", "invalid_config")
            return super().__new__(cls, None, os.fspath(config_file))
        return super().__new__(cls, _settings(url, options), None)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    async def acreate(
        self, internal_id: Union[int, str], *, format: Optional[str] = None, type: Optional[str] = None
    ) -> PublicIdMapping:
        """``create``, on the package's threads: the loop runs on while the service answers."""
        return await _wait(self.create, internal_id, format=format, type=type)

    async def aresolve(self, public_id: str) -> Optional[PublicIdMapping]:
        """``resolve``, on the package's threads."""
        return await _wait(self.resolve, public_id)

    async def alookup(
        self, internal_id: Union[int, str], *, format: Optional[str] = None, type: Optional[str] = None
    ) -> Optional[PublicIdMapping]:
        """``lookup``, on the package's threads."""
        return await _wait(self.lookup, internal_id, format=format, type=type)

    async def aclose(self) -> None:
        self.close()

    async def __aenter__(self) -> PublicIds:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        self.close()
