"""The real backends of tests/integration, reused as they are by the launcher contract suite.

``docker_engine`` (scripts/backends/docker.sh), ``cluster`` (scripts/backends/k8s.sh) and
``slurm_cluster`` (scripts/backends/slurm.sh) skip without their backend, and fail instead when
``CI=true``; their session teardown removes every container, pod, Secret and Slurm job a test
made.
"""

from tests.integration.docker.conftest import docker_engine  # noqa: F401
from tests.integration.k8s.conftest import cluster  # noqa: F401
from tests.integration.slurm.conftest import slurm_cluster  # noqa: F401
