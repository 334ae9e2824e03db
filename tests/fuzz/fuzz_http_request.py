"""Coverage-guided fuzzing (atheris/libFuzzer) of the exporter's HTTP request parser: any bytes
a client sends give requests or a BadRequest, nothing else, each request sound, and h11 reads
the same requests from the same bytes (tests/helpers/http_requests.py). See README.md here."""

from __future__ import annotations

import sys

import _common
import atheris

sys.path.insert(0, str(_common.REPO / "tests"))

with atheris.instrument_imports():
    from helpers.http_requests import check
    from trainguard.exporter.http import request  # noqa: F401 (instrumented before use)


def main() -> None:
    atheris.Setup(sys.argv, check)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
