"""Fixtures for the security tests: the real backends of tests/integration, reused as they are.

``docker_engine`` (scripts/backends/docker.sh) and ``cluster`` (scripts/backends/k8s.sh) skip
without their backend, and fail instead when ``CI=true``; their session teardown removes every
container, pod, Secret and volume a test made.
"""

from tests.integration.docker.conftest import docker_engine  # noqa: F401
from tests.integration.k8s.conftest import cluster  # noqa: F401
