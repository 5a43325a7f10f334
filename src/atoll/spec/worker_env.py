"""The launcher -> worker environment contract: every ATOLL_* variable a launcher or parent sets
and the worker reads, named once, used on both sides.

Read by the worker before anything heavy is imported: this module imports nothing (no
pydantic, no other atoll module).

Who sets each variable (launchers/request.py builds the common ones; each backend's render
adds or removes its own) and who reads it (worker/__main__.py unless said otherwise):
"""

# -- who the worker is ---------------------------------------------------------------------------
JOB_ID = "ATOLL_JOB_ID"  # the job's id (spec/names.py grammar)
ROLE = "ATOLL_ROLE"  # "server" or "client"
SITE = "ATOLL_SITE"  # the participant's name
STUDY = "ATOLL_STUDY"  # the job's study

# -- how it reaches its parent ---------------------------------------------------------------------
PARENT = "ATOLL_PARENT"  # the parent's worker endpoint: host:port or unix:<socket>
PARENT_CERT = "ATOLL_PARENT_CERT"  # the endpoint's certificate (PEM), for TLS; absent on a socket
PARENT_PID = "ATOLL_PARENT_PID"  # the lifeline: the worker exits when this process is gone
JOB_TOKEN = "ATOLL_JOB_TOKEN"  # one-use token exchanged at registration; a credential, never argv
CREDENTIALS_FD = "ATOLL_CREDENTIALS_FD"  # a pipe the credentials come through (process launcher)

# -- where it works and what it reads ----------------------------------------------------------------
WORKDIR = "ATOLL_WORKDIR"  # the run folder (the container's path inside one)
DATASETS = "ATOLL_DATASETS"  # JSON {name: path} of the study's datasets (fl/client_runtime.py)
DATA_ROOT = "ATOLL_DATA_ROOT"  # where the datasets are mounted in a container
STATISTICS_RULES = "ATOLL_STATISTICS_RULES"  # the site's statistics rules (spec/statistics_rules.py)
HEARTBEAT_S = "ATOLL_HEARTBEAT_S"  # how often a site's worker tells its parent it lives (seconds)
REJOIN_S = "ATOLL_REJOIN_S"  # how long a site's worker waits for a restarted parent (worker/rejoin.py)
PRIVACY_POLICY = "ATOLL_PRIVACY_POLICY"  # the site's privacy policy (spec/privacy.py)
SECAGG_CREDENTIAL = "ATOLL_SECAGG_CREDENTIAL"  # the site's secure-aggregation key (spec/secagg_credential.py)
NETWORK_FORWARD = "ATOLL_NETWORK_FORWARD"  # JSON [[listen, port, socket], ...] (launchers/process_network.py)
RANK0_ONLY_ENV = "ATOLL_RANK0_ONLY_ENV"  # names rank 0 keeps from its local ranks (worker/local_ranks.py)

# "send": the worker's run folder is not the parent's (a Pod's emptyDir), so its results/ go to
# the parent over the worker link before it finishes (wire/results_archive.py).
RESULTS_HOME_VAR = "ATOLL_RESULTS_HOME"
SEND_RESULTS = "send"

# What a study's or pod template's environment may not set: the launcher owns these and ATOLL_*
# (spec/study_runtime.py, spec/pod_template.py).
RESERVED_ENV = frozenset(
    {"PYTHONPATH", "PYTHONHOME", "CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES"}
)
RESERVED_ENV_PREFIX = "ATOLL_"
