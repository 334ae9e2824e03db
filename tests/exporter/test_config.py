import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from helpers import paths
from trainguard.exporter.config.model import ConfigError, load_config, parse_config
from trainguard.exporter.config.yamlfile import MAX_BYTES, parse_yaml

DATA = paths.DATA / "configs"
BAD = sorted((DATA / "bad").glob("*.yml"))


def expected_error(path: Path) -> str:
    """The fixture's first line: ``# expect: LINE:COLUMN: FIELD: MESSAGE`` (or its start)."""
    first = path.read_bytes().split(b"\n", 1)[0].decode()
    assert first.startswith("# expect: "), path
    return first.removeprefix("# expect: ")


@pytest.mark.parametrize("path", BAD, ids=[p.stem for p in BAD])
def test_bad_config_names_file_line_field_and_expectation(path: Path) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(path)
    message = str(err.value)
    assert message.startswith(f"{path}:{expected_error(path)}"), message


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
    big.write_bytes(b"#" * (1024 * 1024 + 1))
    with pytest.raises(ConfigError) as err:
        load_config(big)
    assert str(err.value) == (
        f"{big}: config file is larger than 1 MiB: not a config; check the path"
    )
    # the cap itself is allowed: a comment of 1 MiB is an empty config
    big.write_bytes(b"#" * (1024 * 1024))
    assert load_config(big).runs == ()


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("300", 300.0),
        ("1.5", 1.5),
        ("90s", 90.0),
        ("1h30m", 5400.0),
        ("7d", 604800.0),
        ("1w", 604800.0),
        ("500ms", 0.5),
        ("'2w1d'", 15 * 86400.0),
    ],
)
def test_durations_follow_the_one_grammar(tmp_path: Path, text: str, seconds: float) -> None:
    cfg = tmp_path / "tg.yml"
    cfg.write_text(f"run_retention: {text}\ncheckpoints: {{grace_period: {text}}}\n")
    config = load_config(cfg)
    assert config.run_retention_seconds == seconds
    assert config.checkpoints.grace_period_seconds == seconds


@pytest.mark.parametrize(
    ("text", "size"), [("10", 10), ("200MiB", 200 * 1024**2), ("1GB", 10**9), ("1.5KiB", 1536)]
)
def test_sizes_follow_the_one_grammar(tmp_path: Path, text: str, size: int) -> None:
    cfg = tmp_path / "tg.yml"
    cfg.write_text(f"checkpoints:\n  verify_rate: {text}\n")
    assert load_config(cfg).checkpoints.verify_bytes_per_second == size


def test_a_wrong_field_names_its_line_and_column(tmp_path: Path) -> None:
    """The position of the value at fault, deep in the document too."""
    cfg = tmp_path / "tg.yml"
    cfg.write_text(
        "runs:\n"
        + "  - name: a\n"
        + "  - name: b\n"
        + "    checkpoints:\n"
        + "      primary: /data/b\n"
        + "      mirrors:\n"
        + "        usb: /mnt/usb\n"
        + "        backup: relative/dir\n"
    )
    with pytest.raises(ConfigError) as err:
        load_config(cfg)
    assert str(err.value) == (
        f"{cfg}:8:17: runs[1].checkpoints.mirrors.backup: expected an absolute path, "
        "got 'relative/dir'"
    )


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
    """The loader and the validator together: any text is a config or a ConfigError."""
    try:
        parse_config(parse_yaml(text, "fuzz.yml"), "fuzz.yml")
    except ConfigError as exc:
        assert str(exc).startswith("fuzz.yml:")


def test_home_of_an_unknown_user_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match=r"^tg\.yml: state_dir: expected an absolute path, got"):
        parse_config({"state_dir": "~no-such-user-here/state"}, "tg.yml")


def test_readme_states_the_loader_limits() -> None:
    """The cap and the error form the configuration page promises are the loader's."""
    doc = (paths.REPO / "docs" / "configuration.md").read_text(encoding="utf-8")
    assert f"a file over {MAX_BYTES // 2**20} MiB" in doc
    assert "`tg.yml:8:17: runs[1].checkpoints.mirrors.backup: expected an absolute path" in doc
