"""What the native module returns and raises: plain Python types, so they pickle, compare and
print as any other."""

from __future__ import annotations

import datetime
import uuid
from dataclasses import dataclass, field
from typing import Any, Optional, Tuple, Union

_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)


class IdgenError(Exception):
    """Every exception the package raises: ``RefusedError``, ``RejectedError``,
    ``InvalidInputError``, and itself for the rest (a configuration that cannot start, a closed
    handle, an unreadable answer from the fleet). A value of the wrong type (a ``float`` or a
    ``bool`` where an ID goes) is Python's ``TypeError``."""


class RefusedError(IdgenError):
    """No ID now. ``reason`` is one word: ``lease``, ``clock_behind``, ``clock_unsynchronized``,
    ``schedule``, ``forked`` (a handle started before this process forked), ``over_quota``,
    ``unavailable`` (no endpoint answered). ``retry_after`` is the wait in seconds where waiting
    helps, else ``None``."""

    def __init__(self, message: str, reason: str, retry_after: Optional[float]) -> None:
        super().__init__(message)
        self.reason = reason
        self.retry_after = retry_after

    def __reduce__(self) -> Tuple[Any, ...]:
        return (type(self), (str(self), self.reason, self.retry_after))


class RejectedError(IdgenError):
    """A service refused the request for a reason of its own: ``status`` (a 4xx) and ``code``
    (e.g. ``unknown_type``, ``format_not_allowed``), as its API documents them."""

    def __init__(self, message: str, status: int, code: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code

    def __reduce__(self) -> Tuple[Any, ...]:
        return (type(self), (str(self), self.status, self.code))


class InvalidInputError(IdgenError, ValueError):
    """Bad input: ``code`` names it as the shared test vectors do (``out_of_range``,
    ``not_an_id``, ``malformed_uuid``, ``not_uuidv7``, ``invalid_count``, ``invalid_config``, …)."""

    def __init__(self, message: str, code: str) -> None:
        super().__init__(message)
        self.code = code

    def __reduce__(self) -> Tuple[Any, ...]:
        return (type(self), (str(self), self.code))


@dataclass(frozen=True)
class Decoded:
    """An ID taken apart. For a UUIDv7 (``layout == "uuidv7"``) only ``id`` and the time are set;
    ``region_number`` only for layouts with a region field, ``region`` where it has a name."""

    id: Union[int, uuid.UUID]
    layout: str
    created_at_unix_ms: int
    region_number: Optional[int] = None
    region: Optional[str] = None
    machine: Optional[int] = None
    sequence: Optional[int] = None
    created_at: datetime.datetime = field(init=False, compare=False)

    def __post_init__(self) -> None:
        at = _EPOCH + datetime.timedelta(milliseconds=self.created_at_unix_ms)
        object.__setattr__(self, "created_at", at)


@dataclass(frozen=True)
class PublicIdMapping:
    """A public ID and the internal ID it stands for. ``format`` is given by ``create`` and
    ``lookup`` (a resolve answers the two IDs and the type); ``created`` by ``create`` only:
    whether the mapping was made by that call (else it existed)."""

    public_id: str
    internal_id: int
    format: Optional[str] = None
    type: Optional[str] = None
    created: Optional[bool] = None


# The names before 0.2 (PEP 8 wants the ...Error suffix; ``Mapping`` shadowed ``typing.Mapping``
# under ``from idgen import *``): kept for one release, then removed.
Refused = RefusedError
Rejected = RejectedError
InvalidInput = InvalidInputError
Mapping = PublicIdMapping
