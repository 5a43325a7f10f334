"""A site asks spec/privacy.py (its models) whether an app wants secure aggregation only when
the app's app.yaml has a privacy section; the answer, and every refusal, stay the models'."""

from __future__ import annotations

import pytest

from atoll.site.app import _asks_secure_aggregation
from atoll.spec.errors import SpecError
from atoll.spec.privacy import read_app_privacy

DOCUMENTS = {
    "no privacy section": "site: {script: train.py}\n",
    "privacy: null": "privacy:\n",
    "privacy: {}": "privacy: {}\n",
    "an empty string": "privacy: ''\n",
    "zero": "privacy: 0\n",
    "false": "privacy: false\n",
    "an empty list": "privacy: []\n",
    "an empty file": "",
    "a list document": "- privacy\n",
    "dp only": "privacy: {dp: {mode: client, clip_norm: 1.0, noise_multiplier: 0.5}}\n",
    "secure aggregation": "privacy: {secure_aggregation: {}}\n",
    "secure aggregation, 64-bit words": "privacy: {secure_aggregation: {word_bits: 64}}\n",
    "an unknown key": "privacy: {secure: true}\n",
    "a wrong type": "privacy: 3\n",
    "a list": "privacy: [secure_aggregation]\n",
    "bad YAML": "privacy: {secure_aggregation: [}\n",
    "not UTF-8": b"privacy: \xff\n",
}


def _models_answer(app):
    try:
        return read_app_privacy(app).secure_aggregation is not None
    except SpecError as exc:
        return ("refused", str(exc))


@pytest.mark.parametrize("name", DOCUMENTS)
def test_the_site_asks_as_the_models_answer(tmp_path, name):
    text = DOCUMENTS[name]
    app = tmp_path / "app"
    app.mkdir()
    (app / "app.yaml").write_bytes(text if isinstance(text, bytes) else text.encode())
    try:
        found = _asks_secure_aggregation(app)
    except SpecError as exc:
        found = ("refused", str(exc))
    assert found == _models_answer(app)


def test_an_app_without_app_yaml_is_refused_as_the_models_refuse_it(tmp_path):
    with pytest.raises(SpecError) as plain:
        _asks_secure_aggregation(tmp_path)
    with pytest.raises(SpecError) as models:
        read_app_privacy(tmp_path)
    assert str(plain.value) == str(models.value)


def test_the_site_looks_for_the_policy_file_spec_privacy_reads():
    from atoll.site.job_acceptance import PRIVACY_FILE
    from atoll.spec.privacy import POLICY_FILE

    assert PRIVACY_FILE == POLICY_FILE
