"""Suite-wide settings."""

import pytest
from hypothesis import settings

# Property tests run the same examples every time (a run in CI is never red by chance) and
# without per-example deadlines (these machines are shared and noisy). Explore new examples
# with `pytest --hypothesis-profile=explore`.
settings.register_profile("default", derandomize=True, deadline=None, database=None)
settings.register_profile("explore", max_examples=5000, deadline=None)
settings.load_profile("default")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The slow end-to-end tests first: with ``-n`` (./run-tests runs one pytest worker per CPU)
    the long ones then overlap each other and the many short ones fill in behind them, instead
    of one long test starting last and running alone."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)
