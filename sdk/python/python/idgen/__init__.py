"""idgen from Python: unique 64-bit IDs from the embedded generator or the fleet, and decode.

Every rule (leases, the fence, the clock gate, prefetch, failover, the layouts) is idgen's Rust
core, which this package wraps; nothing of it is written again here.

    import idgen
    with idgen.EmbeddedGenerator.start("generator.toml") as generator:
        print(generator.next_id(), generator.decode(generator.next_id()).created_at)
"""

from __future__ import annotations

import asyncio
import json
import os
import uuid
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence, Union

from . import _native
from ._types import Decoded, IdgenError, InvalidInput, Mapping, Refused, Rejected

__all__ = [
    "Client",
    "Decoded",
    "EmbeddedGenerator",
    "IdgenError",
    "InvalidInput",
    "DEFAULT_ENV_PREFIX",
    "MAX_COUNT",
    "Mapping",
    "PublicIds",
    "Refused",
    "Rejected",
    "decode",
    "default_schedule",
    "parse_typeid",
    "typeid_text",
]

MAX_COUNT: int = _native.MAX_COUNT
DEFAULT_ENV_PREFIX: str = _native.DEFAULT_ENV_PREFIX
decode = _native.decode
default_schedule = _native.default_schedule
parse_typeid = _native.parse_typeid
typeid_text = _native.typeid_text

PathLike = Union[str, "os.PathLike[str]"]


class _Asyncio:
    """The asyncio variants: the call in the loop's default executor, so the loop never waits
    on it (the native call lets go of the GIL while it waits)."""

    __slots__ = ()

    if TYPE_CHECKING:  # the native class's, which comes after this one in the MRO

        def next_id(self) -> int: ...
        def next_ids(self, count: int) -> List[int]: ...
        def next_uuids(self, count: int) -> List[uuid.UUID]: ...

    async def anext_id(self) -> int:
        return await asyncio.get_running_loop().run_in_executor(None, self.next_id)

    async def anext_ids(self, count: int) -> List[int]:
        return await asyncio.get_running_loop().run_in_executor(None, self.next_ids, count)

    async def anext_uuids(self, count: int) -> List[uuid.UUID]:
        return await asyncio.get_running_loop().run_in_executor(None, self.next_uuids, count)


class EmbeddedGenerator(_Asyncio, _native.EmbeddedGenerator):
    """The embedded generator: the worker's generator in this process, on its own lease (SQLite
    or DynamoDB, as the configuration file says). ``next_id()`` takes no lock and makes no call
    in the common case; calls that wait let go of the GIL. A generator started before
    ``os.fork()`` refuses every call in the child (``Refused``, reason ``forked``): start one
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



def _settings(url: Optional[str], options: Dict[str, Any]) -> str:
    settings = dict(options)
    if url is not None:
        settings["url"] = url
    try:
        return json.dumps(settings)
    except (TypeError, ValueError) as error:
        raise InvalidInput(f"settings: {error}", "invalid_config") from None


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
                raise InvalidInput("give the client's settings or a configuration file, not both", "invalid_config")
            return super().__new__(cls, None, os.fspath(config_file))
        if backups is not None:
            options["backups"] = list(backups)
        return super().__new__(cls, _settings(url, options), None)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass



class PublicIds(_native.PublicIds):
    """The public-ID service's client: ``create(internal_id, *, format=None, type=None)`` (the
    mapping, made now or found; ``created`` says which), ``resolve(public_id)`` and
    ``lookup(internal_id, *, format=None, type=None)`` (the mapping or ``None``). Settings as the
    fleet client's: ``url``, ``request_timeout_ms``, ``connect_timeout_ms``, ``tls={…}``, or
    ``config_file=``. A refusal of the service's own is ``idgen.Rejected`` (``status``, ``code``)."""

    def __new__(cls, url: Optional[str] = None, *, config_file: Optional[PathLike] = None, **options: Any) -> PublicIds:
        if config_file is not None:
            if url is not None or options:
                raise InvalidInput("give the settings or a configuration file, not both", "invalid_config")
            return super().__new__(cls, None, os.fspath(config_file))
        return super().__new__(cls, _settings(url, options), None)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass
