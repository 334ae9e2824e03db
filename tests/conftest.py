"""Suite-wide settings."""

import atexit
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings

from helpers.exporter_proc import child_env
from helpers.slurm import SlurmCluster, SlurmError
from helpers.slurm_job import TrainingNodes
from helpers.tmpfs import many_files_dir
from helpers.zygote import Zygote

# Property tests run the same examples every time (a run in CI is never red by chance) and
# without per-example deadlines (these machines are shared and noisy). Explore new examples
# with `pytest --hypothesis-profile=explore`.
settings.register_profile("default", derandomize=True, deadline=None, database=None)
settings.register_profile("explore", max_examples=5000, deadline=None)
settings.load_profile("default")

# The exporters the tests start keep their hash verdicts (checkpoints.verify_cache) in this
# pytest worker's own cache directory, never in the user's.
os.environ["XDG_CACHE_HOME"] = tempfile.mkdtemp(prefix="trainguard-test-cache-")
atexit.register(shutil.rmtree, os.environ["XDG_CACHE_HOME"], ignore_errors=True)
# Every checkpoint save records its outcome in the per-user state directory
# (trainguard.checkpoint.outcomes): the tests' saves, and their children's, record it in a
# directory of this session's, never in the home directory. A test's exporter that names its
# state directory (flag, config file) is unaffected.
os.environ["XDG_STATE_HOME"] = tempfile.mkdtemp(prefix="trainguard-test-state-")
atexit.register(shutil.rmtree, os.environ["XDG_STATE_HOME"], ignore_errors=True)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The slow end-to-end tests first, the longest of them (``slow(seconds=N)``) before the
    rest, so that no long test starts late and runs alone at the end.

    With ``-n`` this order only helps under work stealing (``pytest_xdist_make_scheduler``
    below)."""

    def order(item: pytest.Item) -> tuple[bool, float]:
        slow = item.get_closest_marker("slow")
        return slow is None, -float(slow.kwargs.get("seconds", 0)) if slow else 0.0

    items.sort(key=order)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """With ``-n``, xdist's work-stealing scheduler in place of its default (``load``), which
    hands each worker a first chunk of a quarter of its share in collection order: that put
    every slow test (first, above) on one worker while the other ran out of work and stood
    idle for the rest of the run. Work stealing splits the list in halves and lets an idle
    worker take the back half of the other's queue, so the short tests fill in behind the long
    ones on both workers.

    Here rather than ``--dist=worksteal`` in pyproject's addopts: pytest without xdist (the GPU
    device run's image) would refuse that option. Another ``--dist`` mode asked for is kept
    (but ``load``: the default's name).
    """
    if config.getoption("dist") != "load":
        return None
    from xdist.scheduler import WorkStealingScheduling

    return WorkStealingScheduling(config, log)


#: what the training children import: loaded once per pytest worker by the fork server
FRAMEWORKS = [
    "torch",
    "torch.distributed.checkpoint",
    "transformers",
    "transformers.trainer",
    "transformers.models.gpt2.modeling_gpt2",
    "lightning",
    "lightning.pytorch",
    "trainguard",
    "trainguard.checkpoint",
    "trainguard.integrations.transformers",
    "trainguard.integrations.lightning",
]
#: the environment the frameworks are imported in (some read it then)
FRAMEWORK_ENV = {"OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


@pytest.fixture(scope="session")
def framework_zygote() -> Iterator[Zygote]:
    """The fork server (helpers/zygote.py) that starts the framework training children: a
    child forked from it skips the 2-5 s of CPU that importing torch, transformers and
    Lightning cost, which on two cores decides the suite's wall time."""
    with Zygote(FRAMEWORKS, child_env(FRAMEWORK_ENV)) as zygote:
        yield zygote


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--update-golden",
        action="store_true",
        help="rewrite tests/data/golden/metrics.txt from this checkout's exporter, to review",
    )


@pytest.fixture
def many_files_path(tmp_path: Path) -> Iterator[Path]:
    """An empty directory for a test that creates a hundred thousand files
    (helpers/tmpfs.py's ``many_files_dir``: a tmpfs where mounting is permitted)."""
    with many_files_dir(tmp_path / "many") as path:
        yield path


@pytest.fixture
def slurm_nodes(tmp_path: Path) -> Iterator[TrainingNodes]:
    """A real Slurm cluster of three nodes (helpers/slurm.py), each node with its own state
    directory and exporter; torn down after the test (jobs cancelled, processes waited for).
    A cluster that cannot start fails the test with the reason, never skips it."""
    try:
        cluster = SlurmCluster(tmp_path, nodes=3, cpus=4)
    except SlurmError as exc:
        pytest.fail(str(exc), pytrace=False)
    try:
        nodes = TrainingNodes(cluster, tmp_path)
        try:
            yield nodes
        finally:
            nodes.close()
    finally:
        cluster.close()
