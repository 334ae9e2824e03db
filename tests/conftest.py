"""Suite-wide settings."""

from hypothesis import settings

# Property tests run the same examples every time (a run in CI is never red by chance) and
# without per-example deadlines (these machines are shared and noisy). Explore new examples
# with `pytest --hypothesis-profile=explore`.
settings.register_profile("default", derandomize=True, deadline=None, database=None)
settings.register_profile("explore", max_examples=5000, deadline=None)
settings.load_profile("default")
