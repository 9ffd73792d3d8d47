"""docker-compose.yml: the pgvector service for people with Docker (no engine on our machines)."""

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

COMPOSE = Path(__file__).resolve().parents[1] / "docker-compose.yml"


def test_compose_file_runs_pgvector_on_loopback_5433():
    spec = yaml.safe_load(COMPOSE.read_text())
    service = spec["services"]["postgres"]
    assert service["image"] == "pgvector/pgvector:pg17"
    assert service["ports"] == ["127.0.0.1:5433:5432"]
    assert "POSTGRES_PASSWORD" in service["environment"]
    assert service["healthcheck"]["test"][-1].startswith("pg_isready")


def test_docker_compose_config_accepts_it():
    docker = shutil.which("docker")
    if docker is None or subprocess.run([docker, "compose", "version"], capture_output=True).returncode != 0:
        pytest.skip("the docker compose plugin is not installed here; only the YAML structure was checked")
    result = subprocess.run([docker, "compose", "-f", str(COMPOSE), "config", "--quiet"], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
