import os
import secrets
import shutil
import subprocess
from pathlib import Path

from helpers.exporter_proc import Exporter, value


def test_counts_processes_by_name_pattern(tmp_path: Path) -> None:
    # a name no other process has, even this test's in a concurrent run: the counts are of
    # the whole machine's processes
    name = f"tgvmmem{secrets.token_hex(3)}"
    fake = tmp_path / name
    os.symlink(shutil.which("sleep") or "/bin/sleep", fake)  # comm = name
    cfg = tmp_path / "tg.yml"
    cfg.write_text(
        "process_counts:\n"
        f"  - {{name: vmmem, match: '^{name}'}}\n"
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
