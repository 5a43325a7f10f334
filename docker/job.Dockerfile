# atoll's base job image: the job worker (`python -m atoll.worker`) and PyTorch (CPU build).
# A site's launcher starts one container of it (or of an image built FROM it) per job.
#
#   docker build -f docker/job.Dockerfile -t atoll-job:0.1 .          # from the repository root
#
# Researchers add their own libraries on top:   FROM atoll-job:0.1 / RUN pip install ...
# Offline build: put wheels for every dependency into docker/wheels/ and add
#   --build-arg PIP_NO_INDEX=1 --build-arg PIP_FIND_LINKS=/tmp/atoll-src/docker/wheels
# (scripts/backends/docker.sh builds the test job image that way, with TORCH_REQUIREMENT=).
ARG BASE_IMAGE=python:3.11-slim-bookworm
FROM ${BASE_IMAGE}

ARG TORCH_REQUIREMENT="torch==2.13.0"
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
ARG PIP_NO_INDEX
ARG PIP_FIND_LINKS

ENV VIRTUAL_ENV=/opt/atoll \
    PATH=/opt/atoll/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1

# uid/gid 1000: the launcher's default job user, so bind-mounted run folders line up.
RUN groupadd --gid 1000 atoll \
 && useradd --uid 1000 --gid 1000 --create-home --shell /usr/sbin/nologin atoll \
 && python3 -m venv /opt/atoll

# Heavy, rarely changing layers first: PyTorch, then atoll's dependencies, then atoll itself.
RUN if [ -n "$TORCH_REQUIREMENT" ]; then \
      pip install --extra-index-url "$TORCH_INDEX_URL" "$TORCH_REQUIREMENT"; fi
COPY pyproject.toml /tmp/atoll-src/
COPY docker/wheels/ /tmp/atoll-src/docker/wheels/
RUN python -c "import tomllib; print('\n'.join(tomllib.load(open('/tmp/atoll-src/pyproject.toml', 'rb'))['project']['dependencies']))" >/tmp/requirements.txt \
 && pip install -r /tmp/requirements.txt && rm /tmp/requirements.txt
COPY . /tmp/atoll-src/
RUN pip install --no-deps /tmp/atoll-src && rm -rf /tmp/atoll-src

USER 1000:1000
WORKDIR /home/atoll
CMD ["python", "-m", "atoll.worker"]
