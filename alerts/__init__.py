"""trainguard's alert rules as code.

Thresholds, rule groups and the generator of ``alerts/trainguard.rules.yml`` (see
``alerts/README.md``).
"""

import sys
from pathlib import Path

# The thresholds read durations and sizes with the exporter's grammar (trainguard.shared.units),
# so that `--set stall=1w` means what `run_retention: 1w` does. Run from a checkout
# (python alerts/build.py), that is this checkout's exporter/, ahead of any installed copy.
_EXPORTER = Path(__file__).resolve().parents[1] / "exporter"
if (_EXPORTER / "trainguard").is_dir() and str(_EXPORTER) not in sys.path:
    sys.path.insert(0, str(_EXPORTER))
