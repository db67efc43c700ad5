# syntax=docker/dockerfile:1.7
# One image for every rockbot process; the command picks which:
#   rockbot operator | rockbot agent --config /etc/rockbot/agent.json | rockbot scripts-manager
ARG PYTHON_IMAGE=python:3.12.8-slim-bookworm

# Build stage: rockbot and every dependency as wheels.
FROM ${PYTHON_IMAGE} AS build
# PYTHONSAFEPATH: /src/operator/ must not shadow the standard library's `operator` module.
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONSAFEPATH=1
WORKDIR /src
# .dockerignore lets in only pyproject.toml, README.md and the package folders.
COPY . .
RUN python -m pip wheel --wheel-dir /wheels .

# Final stage: a virtualenv installed from those wheels alone, run as a numeric non-root user.
FROM ${PYTHON_IMAGE}
# The root filesystem is read-only in the cluster: HOME points at the /tmp volume every pod mounts.
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp \
    PATH=/opt/rockbot/bin:$PATH
# The wheels are bind-mounted, not copied, so they add nothing to the image; pip is removed after use.
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    python -m venv /opt/rockbot \
    && /opt/rockbot/bin/pip install --no-cache-dir --no-index --find-links=/wheels rockbot \
    && /opt/rockbot/bin/pip uninstall --yes pip
LABEL org.opencontainers.image.title="rockbot" \
      org.opencontainers.image.description="Kubernetes-native AI agents with sandboxed Python" \
      org.opencontainers.image.licenses="Apache-2.0"
# Matches the chart's podSecurityContext (runAsUser/runAsGroup 65532) and the operator's agent pods.
USER 65532:65532
EXPOSE 8080
ENTRYPOINT ["rockbot"]
CMD ["--help"]
