"""The one grammar for durations and sizes (trainguard.shared.units), and that every place a
person writes one reads it the same: the config file, the exporter's and the terminal
command's flags, and the alert thresholds' --set."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from alerts import build, site
from trainguard.exporter import cli, terminal
from trainguard.exporter.config.model import ConfigError, load_config
from trainguard.shared.units import format_duration, format_size, parse_duration, parse_size

DURATIONS = [
    ("300", 300.0),
    (300, 300.0),
    (1.5, 1.5),
    ("1.5", 1.5),
    ("90s", 90.0),
    ("5m", 300.0),
    ("1h30m", 5400.0),
    ("500ms", 0.5),
    ("1s500ms", 1.5),
    ("7d", 604800.0),
    ("1w", 604800.0),
    ("2w1d", 15 * 86400.0),
    ("1y", 365 * 86400.0),
    (" 10m ", 600.0),
    ("0", 0.0),
    ("0s", 0.0),
]

BAD_DURATIONS = [
    "30m1h",  # units from largest to smallest
    "1h1h",  # each once
    "1h 30m",
    "1.5h",  # PromQL: whole numbers before a unit
    "-5",
    "-5m",
    -5,
    -0.5,
    math.inf,
    math.nan,
    "inf",
    "nan",
    "",
    "m",
    "a week",
    "5 minutes",
    "5M",  # months are not a unit; units are lower case
    True,
    False,
    None,
    [],
    {},
]


@pytest.mark.parametrize(("value", "seconds"), DURATIONS)
def test_durations(value: object, seconds: float) -> None:
    assert parse_duration(value) == seconds


@pytest.mark.parametrize("value", BAD_DURATIONS, ids=repr)
def test_bad_durations_say_what_is_expected(value: object) -> None:
    with pytest.raises(ValueError, match="expected a duration such as") as err:
        parse_duration(value)
    assert repr(value) in str(err.value)


def test_units_out_of_order_say_why() -> None:
    with pytest.raises(ValueError, match="largest to smallest, each once"):
        parse_duration("30m1h")


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (45, "45s"),
        (90, "90s"),
        (300, "5m"),
        (5400, "90m"),
        (86400, "1d"),
        (604800, "7d"),
        (0.5, "500ms"),
        (0, "0s"),
    ],
)
def test_format_duration_reads_back(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text
    assert parse_duration(text) == seconds


SIZES = [
    (4096, 4096),
    ("4096", 4096),
    ("200MiB", 200 * 2**20),
    ("200 MiB", 200 * 2**20),
    ("200mib", 200 * 2**20),
    ("1.5KiB", 1536),
    ("2GB", 2 * 10**9),
    ("1TiB", 2**40),
    ("1kb", 1000),
    ("10B", 10),
    ("123456789012345678901", 123456789012345678901),  # exact, not through a float
    (2.0, 2),
]
BAD_SIZES = ["1.5", "0.1KiB", 1.5, "-1", -1, "2 gigs", "1PiB", "GiB", "", True, None, math.inf]


@pytest.mark.parametrize(("value", "size"), SIZES)
def test_sizes(value: object, size: int) -> None:
    assert parse_size(value) == size


@pytest.mark.parametrize("value", BAD_SIZES, ids=repr)
def test_bad_sizes_are_refused(value: object) -> None:
    with pytest.raises(ValueError, match=r"expected a (size such as|whole number of bytes)"):
        parse_size(value)


@pytest.mark.parametrize(("n", "text"), [(2**31, "2GiB"), (512 * 2**20, "512MiB"), (1000, "1000B")])
def test_format_size_reads_back(n: int, text: str) -> None:
    assert format_size(n) == text
    assert parse_size(text) == n


# --------------------------------------------- the same grammar wherever a duration is written


def _config(tmp_path: Path, text: str) -> float:
    cfg = tmp_path / "tg.yml"
    cfg.write_text(f"run_retention: '{text}'\n")
    return load_config(cfg).run_retention_seconds


def _exporter_flag(text: str) -> float:
    seconds: float = (
        cli.build_parser().parse_args([f"--collector.timeout={text}"]).collector_timeout
    )
    return seconds


def _terminal_flag(text: str) -> float:
    seconds: float = terminal.build_parser().parse_args(["status", f"--stall={text}"]).stall
    return seconds


def _threshold(text: str) -> float:
    return float(site.resolve(site.parse_set([f"stall={text}"]))["stall_s"])


@pytest.mark.parametrize("text", ["1w", "1h30m", "90s", "300", "2d12h", "1y"])
def test_a_duration_means_the_same_everywhere(tmp_path: Path, text: str) -> None:
    seconds = parse_duration(text)
    assert _config(tmp_path, text) == seconds
    assert _exporter_flag(text) == seconds
    assert _terminal_flag(text) == seconds
    assert _threshold(text) == seconds


@pytest.mark.parametrize("text", ["30m1h", "1 week", "-5m", "1.5h", "true"])
def test_a_bad_duration_is_refused_everywhere(
    tmp_path: Path, text: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(ConfigError, match=r"tg\.yml:1:16: run_retention: expected a duration"):
        _config(tmp_path, text)
    for flag in (_exporter_flag, _terminal_flag):
        with pytest.raises(SystemExit) as exit_:
            flag(text)
        assert exit_.value.code == 2
        assert "expected a duration such as" in capsys.readouterr().err
    assert build.main(["--set", f"stall={text}", "-o", "-"]) == 2
    assert "threshold stall (duration): expected a duration such as" in capsys.readouterr().err


def test_where_a_duration_must_be_positive_zero_is_refused(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """0 is a duration (``--sample 0``: no rate), but not a collector timeout nor a threshold."""
    assert _terminal_flag("0") == 0
    with pytest.raises(SystemExit):
        _exporter_flag("0s")
    assert "expected a positive duration, got '0s'" in capsys.readouterr().err
    with pytest.raises(site.ThresholdError, match="duration must be positive"):
        _threshold("0")


def test_thresholds_are_whole_seconds() -> None:
    """A rule compares ages in whole seconds: 1500ms is refused, 2000ms is 2s."""
    with pytest.raises(site.ThresholdError, match="whole seconds"):
        _threshold("1500ms")
    assert _threshold("2000ms") == 2
