import os
import shutil
import subprocess
from pathlib import Path

from helpers.exporter_proc import Exporter, value


def test_counts_processes_by_name_pattern(tmp_path: Path) -> None:
    fake = tmp_path / "tgvmmem-fake"
    os.symlink(shutil.which("sleep") or "/bin/sleep", fake)  # comm = "tgvmmem-fake"
    cfg = tmp_path / "tg.yml"
    cfg.write_text(
        "process_counts:\n"
        "  - {name: vmmem, match: '^tgvmmem'}\n"
        "  - {name: nothing, match: '^no-such-process-name$'}\n"
    )
    procs = [subprocess.Popen([str(fake), "60"])]
    try:
        with Exporter(args=[f"--config.file={cfg}"], state_dir=tmp_path / "s") as exp:
            s = exp.scrape()
            assert value(s, "trainguard_process_count", name="vmmem") == 1
            assert value(s, "trainguard_process_count", name="nothing") == 0
            # the field-report case: a second VM host process appears
            procs.append(subprocess.Popen([str(fake), "60"]))
            assert value(exp.scrape(), "trainguard_process_count", name="vmmem") == 2
            second = procs.pop()
            second.kill()
            second.wait()
            s = exp.scrape()
            assert value(s, "trainguard_process_count", name="vmmem") == 1
            assert value(s, "trainguard_collector_success", collector="processes") == 1
    finally:
        for p in procs:
            p.kill()
            p.wait()
