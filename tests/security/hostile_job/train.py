"""The hostile job's site script: every attack (attacks.py), then an ordinary round."""

import attacks

import atoll.client as fl

record = attacks.run("site")
fl.init()
while fl.is_running():
    model = fl.receive()
    if model is None:
        break
    fl.send(fl.Model(params=model.params, num_examples=1))
attacks.raise_with_loot(record)
