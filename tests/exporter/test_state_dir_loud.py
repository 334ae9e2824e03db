"""A state directory that cannot fail silently, with a real exporter (issue 43, item 3).

A ``--state.dir`` that does not exist (a typo) is logged at start-up and published as
``trainguard_state_dir_present 0`` (TrainguardStateDirMissing pages on it); one stray
unparsable heartbeat costs that file only (its own series, the runs collector still succeeds);
and the corrupted heartbeat of a run killed with SIGKILL keeps the run published as dead, so its
TrainingProcessDied does not resolve while it is still dead.
"""

from __future__ import annotations

from pathlib import Path

from helpers.exporter_proc import Exporter, poll, select, value
from helpers.run_child import (
    heartbeat_path,
    own_heartbeat,
    put,
    sigkill,
    start_child,
    wait_heartbeat,
)


def test_a_missing_state_dir_is_logged_and_published(tmp_path: Path) -> None:
    typo = tmp_path / "trainguad"
    with Exporter(state_dir=typo, log_path=tmp_path / "exporter.log") as exp:
        s = exp.scrape()
        assert value(s, "trainguard_state_dir_present", path=str(typo)) == 0
        assert value(s, "trainguard_collector_success", collector="runs") == 1
        typo.mkdir()  # created (tmpfiles, a first run): watched from the next scrape
        s = poll(exp, lambda s: value(s, "trainguard_state_dir_present", path=str(typo)) == 1)
        assert value(s, "trainguard_state_dir_present", path=str(typo)) == 1
        log = exp.stop()
    (line,) = [ln for ln in log.splitlines() if "does not exist" in ln]
    assert "level=WARNING" in line and str(typo) in line and "--state.dir" in line, line


def test_a_bad_file_costs_only_itself_and_a_corrupted_dead_run_stays_dead(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    put(state, own_heartbeat("alive"))  # this test process: alive
    child = start_child("victim", state, 20, "hang")
    try:
        path = heartbeat_path(state, "victim")
        wait_heartbeat(path, lambda hb: hb.step == 20)
        victim = {"run": "victim", "rank": "0"}
        with Exporter(state_dir=state, log_path=tmp_path / "exporter.log") as exp:
            s = poll(exp, lambda s: value(s, "trainguard_run_process_up", **victim) == 1)
            assert value(s, "trainguard_run_process_up", **victim) == 1
            sigkill(child.pid)
            s = poll(exp, lambda s: value(s, "trainguard_run_process_up", **victim) == 0)
            assert value(s, "trainguard_run_process_up", **victim) == 0

            # its heartbeat corrupted, and a stray unparsable file beside it
            path.write_bytes(b'{"format": 1, "run": "victim", "pid": ')
            (state / "junk.heartbeat.json").write_text("not json at all")
            s = poll(exp, lambda s: value(s, "trainguard_heartbeat_file_errors") == 2)
            assert value(s, "trainguard_heartbeat_file_errors") == 2
            invalid = {dict(lbl)["file"] for lbl in select(s, "trainguard_heartbeat_file_invalid")}
            assert invalid == {path.name, "junk.heartbeat.json"}
            # one bad file is not a collector that cannot work: every run still published
            assert value(s, "trainguard_collector_success", collector="runs") == 1
            assert value(s, "trainguard_run_process_up", run="alive", rank="0") == 1
            # the dead run is still dead: its death is not turned into silence
            assert value(s, "trainguard_run_process_up", **victim) == 0
            assert value(s, "trainguard_run_step", **victim) == 20
            log = exp.stop()
        named = [ln for ln in log.splitlines() if path.name in ln]
        assert len(named) == 1 and "kept as last read valid" in named[0], log
    finally:
        if child.poll() is None:
            sigkill(child.pid)
        child.wait(60)
