"""What a site's ranks and the launchers that start them share: a file name, a limit and a
variable name (launchers/ranks.py says how ranks are started).

Kept apart so that a worker (worker/local_ranks.py) reads them without loading the launchers'
request models (pydantic and the spec models: a third of a worker's start-up).
"""

from atoll.spec import worker_env

# Where a rank other than 0 leaves its error, in the run folder, for whoever reports the site's
# failure: rank 0 on one node (worker/local_ranks.py), the Slurm launcher across nodes.
RANK_ERROR_FILE = "logs/rank-{rank}.error"
MAX_RANK_ERROR_BYTES = 2000
# Names (never values) of the variables only rank 0 may keep: in a container or pod the job's
# secrets arrive in the environment, so rank 0 starts the other ranks without these.
WITHHELD_ENV = worker_env.RANK0_ONLY_ENV
