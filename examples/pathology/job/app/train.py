"""Placeholder training loop: the real study ships its own model code in this folder."""

import atoll.client as fl

fl.init()
slides = fl.dataset_path("slides")  # /data/pathology/slides in the site's container or pod
while fl.is_running():
    model = fl.receive()
    if model is None:
        break
    fl.send(fl.Model(params=model.params, num_examples=1))
