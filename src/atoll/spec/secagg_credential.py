"""What a site signs to certify its worker's secure aggregation key (the format only).

The site parent issues the credential (atoll.pki.worker_credential); the other sites' workers
check it (atoll.fl.privacy.secagg.identity). Both build the signed statement here, so they
agree on its bytes:

    canonical JSON {"format": FORMAT, "job_id": J, "site": S, "key": BASE64_RAW_ED25519}

A credential is {"statement", "signature" (base64 DER ECDSA-SHA256 by the site's key),
"certificate" (the site's PEM), "ca" (the project's root CA PEM)}; the worker receives it with
its private key as one secret, CREDENTIAL_VAR = {"private": BASE64, "credential": {...}}.
"""

from __future__ import annotations

import base64
import json
from typing import Any

from atoll.spec import worker_env

FORMAT = "atoll-secagg-worker/1"
CREDENTIAL_VAR = worker_env.SECAGG_CREDENTIAL


def canonical(doc: dict[str, Any]) -> bytes:
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def statement(job_id: str, site: str, public: bytes) -> bytes:
    return canonical({"format": FORMAT, "job_id": job_id, "site": site,
                      "key": base64.b64encode(public).decode()})
