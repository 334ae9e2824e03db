import contextlib
import re
from pathlib import Path

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from helpers import paths
from trainguard.exporter.config import (
    ConfigError,
    load_config,
    parse_config,
    parse_duration,
    parse_size,
)

DATA = paths.DATA / "configs"
BAD = sorted((DATA / "bad").glob("*.yml"))


def expected_error(path: Path) -> str:
    first = path.read_bytes().split(b"\n", 1)[0].decode()
    assert first.startswith("# expect: "), path
    return first.removeprefix("# expect: ")


@pytest.mark.parametrize("path", BAD, ids=[p.stem for p in BAD])
def test_bad_config_names_file_field_and_expectation(path: Path) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(path)
    message = str(err.value)
    assert message.startswith(f"{path}: "), message
    assert expected_error(path) in message, message


def test_example_config_is_valid() -> None:
    repo = paths.REPO
    cfg = load_config(repo / "examples" / "trainguard.yml")
    assert [r.name for r in cfg.runs] == ["llama-ft", "sd-finetune", "hf-sft"]
    llama = cfg.runs[0]
    assert llama.pid_file == Path("/run/train.pid")
    assert llama.checkpoints is not None
    assert llama.checkpoints.mirrors == {"backup": Path("/mnt/d/ckpt")}
    assert llama.checkpoints.trust_unrecorded is True
    assert cfg.process_counts[0].match.search("vmmemWSL")
    assert cfg.checkpoints.grace_period_seconds == 300
    assert cfg.checkpoints.verify_bytes_per_second == 200 * 1024**2
    # it identifies each run: no process name that any interpreter has
    assert cfg.warnings == ()
    assert cfg.runs[1].cmdline_match is not None and cfg.runs[1].process_match is None
    hf = cfg.runs[2].checkpoints
    assert hf is not None and (hf.pattern, hf.layout) == ("checkpoint-{step}", "huggingface")


@pytest.mark.parametrize("pattern", ["^python3?$", "python", "^(python|java)$", "sh$"])
def test_process_match_of_an_interpreter_name_is_warned_about(pattern: str) -> None:
    cfg = parse_config({"runs": [{"name": "a", "process_match": pattern}]}, "tg.yml")
    (warning,) = cfg.warnings
    assert warning.startswith("tg.yml: runs[0].process_match: ")
    assert "matches the interpreter name" in warning and "cmdline_match" in warning


@pytest.mark.parametrize(
    "run",
    [
        {"name": "a", "process_match": "^llama-train$"},
        {"name": "a", "cmdline_match": "python3? train[.]py --run a"},
        {"name": "a", "pid_file": "/run/a.pid"},
    ],
)
def test_runs_that_identify_their_process_are_not_warned_about(run: dict[str, str]) -> None:
    assert parse_config({"runs": [run]}, "tg.yml").warnings == ()


def test_empty_and_missing(tmp_path: Path) -> None:
    empty = tmp_path / "empty.yml"
    empty.write_text("# nothing configured\n")
    assert load_config(empty).runs == ()
    assert load_config(None).process_counts == ()
    with pytest.raises(ConfigError, match=re.escape(f"{tmp_path / 'nope.yml'}: cannot read")):
        load_config(tmp_path / "nope.yml")


def test_huge_config_is_refused(tmp_path: Path) -> None:
    big = tmp_path / "big.yml"
    big.write_bytes(b"#" * (2 * 1024 * 1024))
    with pytest.raises(ConfigError, match="larger than 1 MiB"):
        load_config(big)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [(300, 300.0), (1.5, 1.5), ("90s", 90.0), ("5m", 300.0), ("1h30m", 5400.0), ("7d", 604800.0)],
)
def test_durations(text: object, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize(("text", "size"), [(10, 10), ("200MiB", 200 * 1024**2), ("1GB", 10**9)])
def test_sizes(text: object, size: int) -> None:
    assert parse_size(text) == size


yaml_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(
            st.sampled_from(
                [
                    "runs",
                    "name",
                    "pid_file",
                    "match",
                    "process_counts",
                    "checkpoints",
                    "mirrors",
                    "x",
                ]
            )
            | st.text(max_size=8),
            inner,
            max_size=4,
        )
    ),
    max_leaves=20,
)


@given(yaml_values)
def test_any_document_is_accepted_or_a_config_error(doc: object) -> None:
    """No input makes the validator raise anything but ConfigError naming the source."""
    try:
        parse_config(doc, "fuzz.yml")
    except ConfigError as exc:
        assert str(exc).startswith("fuzz.yml: ")


@given(st.text(max_size=200))
def test_any_text_is_accepted_or_a_config_error(text: str) -> None:
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError:
        return
    with contextlib.suppress(ConfigError):
        parse_config(data, "fuzz.yml")
