"""The relay that runs a scrape's collectors: in turn on one thread, handed on when one hangs.

The collectors' side of it through a real exporter (a driver call that hangs, a FUSE mount that
never answers) is in test_gpu and test_hung_mounts; here the properties that those can only
see from outside: which thread ran what, how often a hung call was made, how many threads
there are.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from trainguard.exporter.scrape.relay import Relay, Unfinished


def recorder(name: str, seen: list[tuple[str, int]]) -> Callable[[int], str]:
    """A call that records its name and the thread it ran on."""

    def fn(arg: int) -> str:
        assert threading.current_thread().name == "test-relay"
        seen.append((name, threading.get_ident()))
        return f"{name}:{arg}"

    return fn


def relay_threads() -> int:
    return sum(t.name == "test-relay" for t in threading.enumerate())


def test_calls_run_in_order_on_one_pooled_thread() -> None:
    seen: list[tuple[str, int]] = []
    relay = Relay([recorder(n, seen) for n in "abcd"], "test-relay")
    deadline = time.monotonic() + 60
    threads = set()
    for i in range(20):
        seen.clear()
        outcomes = relay.run([i] * 4, deadline)
        assert [o[0] for o in outcomes if isinstance(o, tuple)] == [f"{n}:{i}" for n in "abcd"]
        assert [name for name, _ in seen] == list("abcd")
        threads |= {thread for _, thread in seen}
        assert len({thread for _, thread in seen}) == 1
    assert len(threads) <= 2
    assert relay_threads() <= 2  # the pool's idle threads, not one per scrape


def test_a_hung_call_costs_only_its_own_answer_and_is_not_made_again() -> None:
    release = threading.Event()
    calls = {"hung": 0}
    seen: list[tuple[str, int]] = []

    def hung(arg: int) -> str:
        calls["hung"] += 1
        release.wait(120)
        return "back"

    fns = [recorder("a", seen), hung, recorder("b", seen), recorder("c", seen)]
    relay = Relay(fns, "test-relay")
    began = time.monotonic()
    first = relay.run([0] * 4, began + 5)
    # the calls after the hung one were taken up by another thread, well before the deadline
    assert [type(o) for o in first] == [tuple, Unfinished, tuple, tuple]
    assert [name for name, _ in seen] == ["a", "b", "c"]
    # a on the thread that then hung; b and c handed on to another, together
    assert seen[0][1] != seen[1][1] == seen[2][1]
    threads = relay_threads()
    for i in range(50):
        start = time.monotonic()
        outcomes = relay.run([i] * 4, start + 5)
        assert isinstance(outcomes[1], Unfinished)
        assert [o[0] for o in outcomes if isinstance(o, tuple)] == [f"{n}:{i}" for n in "abc"]
        assert time.monotonic() - start < 5  # told at once: not waited for again
    assert calls["hung"] == 1
    assert relay_threads() <= threads
    release.set()

    def back() -> bool:
        outcome = relay.run([99] * 4, time.monotonic() + 5)[1]
        return isinstance(outcome, tuple) and outcome[0] == "back"

    deadline = time.monotonic() + 60
    while not back():  # the call that hung returns; the one after it is a new call
        assert time.monotonic() < deadline, "the hung call never came back"
    assert calls["hung"] == 2


def test_an_exception_is_that_calls_outcome() -> None:
    def broken(arg: int) -> str:
        raise ValueError("bad")

    outcomes = Relay([broken, str], "test-relay").run([1, 2], time.monotonic() + 60)
    assert isinstance(outcomes[0], ValueError) and str(outcomes[0]) == "bad"
    assert outcomes[1][0] == "2"  # type: ignore[index]


def test_concurrent_scrapes_share_a_call_in_progress() -> None:
    entered, release = threading.Event(), threading.Event()
    calls = [0]

    def slow(arg: int) -> int:
        calls[0] += 1
        entered.set()
        release.wait(60)
        return arg

    relay = Relay([slow], "test-relay")
    results: list[object] = []
    first = threading.Thread(target=lambda: results.append(relay.run([1], time.monotonic() + 60)))
    first.start()
    assert entered.wait(60)
    second = threading.Thread(target=lambda: results.append(relay.run([2], time.monotonic() + 60)))
    second.start()
    release.set()
    first.join(60)
    second.join(60)
    assert calls[0] == 1
    assert [r[0][0] for r in results] == [1, 1]  # type: ignore[index]
