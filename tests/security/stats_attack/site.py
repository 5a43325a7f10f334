import atoll.client as fl
from atoll.fl.statistics import serve

serve(fl.dataset_path("cohort") / "cohort.csv")
