# atoll's parent runtime: the long-lived server or site parent (`atoll server start KIT`,
# `atoll site start KIT`). No PyTorch and no GPU: training happens in job containers.
#
#   docker build -f docker/parent.Dockerfile -t atoll-parent:0.1 .    # from the repository root
#
# Offline build: as in job.Dockerfile (docker/wheels/ + PIP_NO_INDEX / PIP_FIND_LINKS).
ARG BASE_IMAGE=python:3.11-slim-bookworm
FROM ${BASE_IMAGE}

ARG PIP_NO_INDEX
ARG PIP_FIND_LINKS
# The launchers' clients: Docker SDK for a Docker site, kubernetes for a Kubernetes site.
ARG ATOLL_EXTRAS=docker,k8s

ENV VIRTUAL_ENV=/opt/atoll \
    PATH=/opt/atoll/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1

RUN groupadd --gid 1000 atoll \
 && useradd --uid 1000 --gid 1000 --create-home --shell /usr/sbin/nologin atoll \
 && python3 -m venv /opt/atoll

COPY pyproject.toml /tmp/atoll-src/
COPY docker/wheels/ /tmp/atoll-src/docker/wheels/
RUN python -c "import sys, tomllib; p = tomllib.load(open('/tmp/atoll-src/pyproject.toml', 'rb'))['project']; reqs = p['dependencies'] + [r for e in sys.argv[1].split(',') if e for r in p['optional-dependencies'][e]]; print('\n'.join(reqs))" "$ATOLL_EXTRAS" >/tmp/requirements.txt \
 && pip install -r /tmp/requirements.txt && rm /tmp/requirements.txt
COPY . /tmp/atoll-src/
RUN pip install --no-deps /tmp/atoll-src && rm -rf /tmp/atoll-src

# Kits, job stores and workspaces live in /workspace (a volume). The parent runs as uid 1000;
# a site parent that talks to a Docker socket needs that socket's group (compose: group_add).
RUN mkdir -p /workspace && chown 1000:1000 /workspace
USER 1000:1000
WORKDIR /workspace
ENTRYPOINT ["atoll"]
CMD ["--help"]
