"""A site's part of the statistics job: atoll answers from the table with this site's rules."""

import atoll.client as fl
from atoll.fl.statistics import serve

config = fl.job_args()
serve(fl.dataset_path(config["dataset"]) / config["file"])
