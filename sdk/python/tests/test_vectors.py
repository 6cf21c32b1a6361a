"""Every shared test vector (sdk/vectors) through the Python package: the same files the Rust
crates check (sdk/core/tests/vectors.rs). A case added to a file runs here with no code."""

from __future__ import annotations

import uuid
from typing import Any, Dict

import pytest

import idgen
from conftest import as_vector, vectors

DECODE = vectors("decode.json")
REGIONS = {int(number): name for number, name in DECODE["regions"].items()}
INTEGERS = vectors("integers.json")


def expected(case: Dict[str, Any]) -> Dict[str, Any]:
    return {k: v for k, v in case.items() if k not in ("name", "input", "integer")}


def test_the_schedule_is_the_one_the_vectors_are_written_against() -> None:
    ours = idgen.default_schedule()
    theirs = [{k: v for k, v in entry.items() if k != "from"} for entry in DECODE["schedule"]]
    assert ours == theirs


@pytest.mark.parametrize("case", DECODE["cases"], ids=lambda case: case["name"])
def test_ids_as_text(case: Dict[str, Any]) -> None:
    if "error" in case:
        with pytest.raises(idgen.InvalidInputError) as refused:
            idgen.decode(case["input"], regions=REGIONS)
        assert refused.value.code == case["error"], str(refused.value)
        assert isinstance(refused.value, ValueError) and isinstance(refused.value, idgen.IdgenError)
    else:
        decoded = idgen.decode(case["input"], regions=REGIONS)
        assert as_vector(decoded) == expected(case)
        if decoded.layout == "uuidv7":
            assert isinstance(decoded.id, uuid.UUID) and decoded.id.version == 7
        else:
            assert isinstance(decoded.id, int)


@pytest.mark.parametrize("case", INTEGERS["cases"], ids=lambda case: case["name"])
def test_ids_as_integers(case: Dict[str, Any]) -> None:
    value = int(case["integer"])
    if "error" in case:
        with pytest.raises(idgen.InvalidInputError) as refused:
            idgen.decode(value, regions=REGIONS)
        assert refused.value.code == case["error"], str(refused.value)
        assert isinstance(refused.value, ValueError) and isinstance(refused.value, idgen.IdgenError)
    else:
        assert as_vector(idgen.decode(value, regions=REGIONS)) == expected(case)


@pytest.mark.parametrize("value", [1.0, 97301141913751557.0, True, None, b"97301141913751557", [1]])
def test_anything_but_an_int_or_a_str_is_a_type_error(value: Any) -> None:
    with pytest.raises(TypeError, match="an ID is an int or a str"):
        idgen.decode(value)


def test_an_integer_past_128_bits_is_out_of_range_not_a_crash() -> None:
    with pytest.raises(idgen.InvalidInputError) as refused:
        idgen.decode(2**200)
    assert refused.value.code == "out_of_range"


@pytest.mark.parametrize("case", vectors("typeid/valid.json"), ids=lambda case: case["name"])
def test_the_typeid_specifications_valid_vectors(case: Dict[str, Any]) -> None:
    prefix, value = idgen.parse_typeid(case["typeid"])
    assert (prefix, value) == (case["prefix"], uuid.UUID(case["uuid"]))
    assert idgen.typeid_text(prefix, value) == case["typeid"]


@pytest.mark.parametrize("case", vectors("typeid/invalid.json"), ids=lambda case: case["name"])
def test_the_typeid_specifications_invalid_vectors(case: Dict[str, Any]) -> None:
    with pytest.raises(idgen.InvalidInputError) as refused:
        idgen.parse_typeid(case["typeid"])
    assert refused.value.code == "invalid_typeid"
