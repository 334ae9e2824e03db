"""helpers/wait.py, the one way the tests wait: it returns what the condition returned once
truthy, and when the deadline passes it fails saying what was awaited and what was last seen
(the only clue a failure on a busy machine leaves)."""

from __future__ import annotations

import pytest

from helpers.wait import WaitTimeout, wait_for


def test_returns_the_first_truthy_value_after_retrying() -> None:
    answers = iter([None, 0, "", [], {"step": 3}])
    assert wait_for(lambda: next(answers), 60, 0) == {"step": 3}


def test_a_timeout_names_what_was_awaited_and_the_last_value() -> None:
    calls: list[int] = []

    def never() -> int:
        calls.append(1)
        return 0

    with pytest.raises(WaitTimeout) as info:
        wait_for(never, 0.05, 0.01, "step 5 in the heartbeat")
    assert isinstance(info.value, AssertionError)
    assert "step 5 in the heartbeat" in str(info.value) and "last seen: 0" in str(info.value)
    assert info.value.last == 0
    assert len(calls) >= 2  # tried again after the first answer, once more at the deadline


def test_what_may_be_a_callable_asked_only_on_timeout() -> None:
    seen: list[str] = []
    asked: list[int] = []

    def describe() -> str:
        asked.append(1)
        return f"a reply; saw {seen}"

    def condition() -> bool:
        seen.append("x")
        return len(seen) == 3

    assert wait_for(condition, 60, 0, describe) is True
    assert asked == []
    with pytest.raises(WaitTimeout, match=r"a reply; saw \['x', 'x', 'x'"):
        wait_for(lambda: False, 0, 0, describe)


def test_ignored_exceptions_mean_not_yet_and_the_last_one_is_reported() -> None:
    attempts = iter([OSError("refused"), OSError("refused"), "up"])

    def connect() -> str:
        got = next(attempts)
        if isinstance(got, Exception):
            raise got
        return got

    assert wait_for(connect, 60, 0, ignore=OSError) == "up"
    with pytest.raises(WaitTimeout, match="OSError: still refused") as info:
        wait_for(lambda: (_ for _ in ()).throw(OSError("still refused")), 0, 0, ignore=OSError)
    assert isinstance(info.value.last, OSError)


def test_any_other_exception_ends_the_wait_at_once() -> None:
    calls: list[int] = []

    def child_died() -> bool:
        calls.append(1)
        raise RuntimeError("the child exited 1")

    with pytest.raises(RuntimeError, match="exited 1"):
        wait_for(child_died, 60, 0, ignore=OSError)
    assert calls == [1]
