"""The one field validator (``trainguard.shared.fields``), on its own: the heartbeat reader and
the config schema both check with it, so the two kinds of document accept exactly the same values
and differ only in how a problem is worded; a heartbeat's errors never quote a string."""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trainguard.shared import fields
from trainguard.shared.fields import UNTRUSTED, WRITTEN

SCALARS = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(min_value=-(2**2000), max_value=2**2000)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=40)
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=4)
    ),
    max_leaves=12,
)
CHOICES = ("running", "finished", "failed")


def problems(value: Any, d: fields.Dialect) -> list[str | None]:
    """Every check of the core on one value, worded by d."""
    return [
        fields.integer(value, 0, 100, d),
        fields.integer(value, -(2**63), 2**63 - 1, d),
        fields.number(value, 0, 4102444800, "seconds", d),
        fields.text(value, 8, d),
        fields.boolean(value, d),
        fields.choice(value, CHOICES, d),
        fields.mapping(value, 2, d),
        fields.sequence(value, 2, d),
    ]


@given(VALUES)
def test_both_documents_accept_exactly_the_same_values(value: Any) -> None:
    untrusted, written = problems(value, UNTRUSTED), problems(value, WRITTEN)
    assert [p is None for p in untrusted] == [p is None for p in written]
    assert all(p is None or (isinstance(p, str) and p) for p in untrusted + written)


@given(VALUES)
def test_the_integer_and_number_checks_mean_what_they_say(value: Any) -> None:
    is_int = type(value) is int
    assert (fields.integer(value, 0, 100) is None) == (is_int and 0 <= value <= 100)
    finite = type(value) in (int, float) and abs(value) < 2**1000 and math.isfinite(float(value))
    assert (fields.number(value, 0, 4102444800, "seconds") is None) == (
        finite and 0 <= value <= 4102444800
    )


@pytest.mark.parametrize("d", [UNTRUSTED, WRITTEN], ids=["untrusted", "written"])
def test_a_boolean_is_never_an_integer_nor_a_number(d: fields.Dialect) -> None:
    assert fields.integer(True, 0, 1, d) is not None
    assert fields.integer(False, 0, 1, d) is not None
    assert fields.number(True, 0, 1, "seconds", d) is not None
    assert fields.boolean(1, d) is not None and fields.boolean(True, d) is None


@given(st.text(min_size=1, max_size=30))
def test_a_heartbeats_errors_never_quote_a_string_from_the_file(text: str) -> None:
    secret = f"SECRET{text}"
    for value in (secret, [secret], {secret: secret}, {"k": secret}):
        for problem in problems(value, UNTRUSTED):
            assert problem is None or "SECRET" not in problem, problem


def test_the_wording_of_each_document() -> None:
    assert fields.integer("3", 0, 10) == "expected an integer, got a string"
    assert fields.integer(11, 0, 10) == "expected an integer in 0..10, got 11"
    assert fields.integer(2**200, 0, 10) == "expected an integer in 0..10, got a 201-bit number"
    assert fields.integer("3", 0, 10, WRITTEN) == "expected an integer 0-10, got '3'"
    assert fields.mapping([], None, UNTRUSTED) == "expected an object, got a list"
    assert fields.mapping(None, None, WRITTEN) == "expected a mapping, got nothing"
    assert fields.choice("x", CHOICES) == "expected one of running, finished, failed"
    assert fields.text("a\x00", 8) == "contains control characters"
    assert fields.text("x" * 9, 8) == "expected at most 8 characters, got 9"
