# trainguard exporter image.
#
#   docker build -t trainguard-exporter .
#   docker run --rm --gpus all --pid=host -p 9636:9636 \
#     -v /var/lib/trainguard:/var/lib/trainguard:ro trainguard-exporter
#
# --gpus all (NVIDIA container toolkit) gives the exporter the driver's NVML library;
# --pid=host lets it see the training processes it watches. See deploy/README.md.

# Base image: tag and the digest it pointed to, so a rebuild gets the same bytes.
# Override with --build-arg PYTHON_IMAGE=python:3.11-slim-bookworm to take security updates.
ARG PYTHON_IMAGE=python:3.11.13-slim-bookworm@sha256:86adf8dbadc3d6e82ee5dd2c74bec2e1c2467cdad47886280501df722372d2e1

FROM ${PYTHON_IMAGE} AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PYTHONDONTWRITEBYTECODE=1
RUN python -m venv /opt/trainguard
WORKDIR /src
COPY pyproject.toml README.md LICENSE ./
COPY exporter ./exporter
# The base install only: torch is the optional [torch] extra, for training scripts, never here.
RUN /opt/trainguard/bin/pip install --no-cache-dir . \
    && /opt/trainguard/bin/trainguard-exporter --version

FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="trainguard-exporter" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.description="Prometheus exporter for GPU training runs: silent deaths, stalls, ghost GPU memory, truncated checkpoints"
COPY --from=build /opt/trainguard /opt/trainguard
ENV PATH=/opt/trainguard/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    TRAINGUARD_STATE_DIR=/var/lib/trainguard \
    NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=utility
# Any unprivileged uid works: the exporter only reads the state dir, /proc and NVML.
USER 65532:65532
EXPOSE 9636
# Assumes the default listen address; disable it (--no-healthcheck, compose healthcheck.disable)
# when you move the port or serve TLS with --web.config.file.
HEALTHCHECK --interval=30s --timeout=5s --start-period=10s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:9636/-/healthy', timeout=4)"]
ENTRYPOINT ["trainguard-exporter"]
