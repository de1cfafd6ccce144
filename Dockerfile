# syntax=docker/dockerfile:1
# Toren built from this repository, plus one agent project (build-arg AGENT_DIR).
# One image, two process types:
#   docker run IMAGE                                          -> toren worker
#   docker run IMAGE serve --host 0.0.0.0 --port 8080         -> toren serve (API + console)
# Agent projects made by `toren init` get their own Dockerfile
# (toren.adapters.docker.render_project_dockerfile).
#
# PYTHON_IMAGE may be any Debian-based image with Python 3.11+ as `python3`: the official
# slim image (the default), or Debian's own python3, whose pip refuses to install into the
# system (PEP 668). Everything is installed into virtual environments, so both work; when
# the base lacks the venv module (Debian without python3-venv) the builder adds it.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS builder
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
RUN python3 -c "import ensurepip, venv" 2>/dev/null \
    || (apt-get update && apt-get install -y --no-install-recommends python3-venv \
        && rm -rf /var/lib/apt/lists/*)
RUN python3 -m venv /opt/build && /opt/build/bin/pip install "build>=1.0"
WORKDIR /src
COPY pyproject.toml README.md ./
# The runtime venv is assembled here so that pip's build dependencies never reach the
# final stage; psycopg[binary] ships wheels, so no compiler is needed either. Dependencies
# first, read from pyproject.toml alone: this layer is reused until they change, so a
# rebuild after a code or prompt change does not download them again.
RUN python3 -m venv /opt/toren \
    && python3 -c "import tomllib; p = tomllib.load(open('pyproject.toml', 'rb'))['project']; print('\n'.join(p['dependencies'] + p['optional-dependencies']['postgres']))" >/tmp/requirements.txt \
    && /opt/toren/bin/pip install -r /tmp/requirements.txt
COPY src ./src
RUN /opt/build/bin/python -m build --wheel --outdir /dist \
    && /opt/toren/bin/pip install "$(ls /dist/toren_run-*.whl)[postgres]"

FROM ${PYTHON_IMAGE} AS runtime
ARG AGENT_DIR=examples
ENV PATH=/opt/toren/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
RUN groupadd --system --gid 10001 toren \
    && useradd --system --uid 10001 --gid toren --home-dir /home/toren --create-home toren
COPY --from=builder /opt/toren /opt/toren
WORKDIR /app
COPY --chown=toren:toren ${AGENT_DIR} /app
USER 10001:10001
EXPOSE 8080
# Probes http://127.0.0.1:8080/v1/health when this container runs `toren serve`;
# a worker container passes while its process lives.
HEALTHCHECK --interval=15s --timeout=5s --start-period=20s --retries=3 \
    CMD ["python", "-m", "toren.adapters.docker", "healthcheck"]
ENTRYPOINT ["toren"]
CMD ["worker"]
