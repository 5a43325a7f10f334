"""A parent never loads cryptography for a job's provenance record: its signing and the server's
check of a site's entry are answered by its verifier process (pki/verifier.py)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

from atoll.pki.provenance import verify

from .test_provenance_record import JOB, jobs_dir, kits, statement  # noqa: F401


def test_a_parent_signs_and_checks_without_loading_cryptography(kits, jobs_dir):  # noqa: F811
    """The server parent's entries, a site parent's, and the server's check of the site's, each
    in a fresh interpreter that is a parent (a verifier): the record verifies, the forged entry
    is left out, and no parent loaded cryptography."""
    site, server = kits["site-a"], kits["server"]
    code = textwrap.dedent(f"""
        import json, sys
        from pathlib import Path
        from atoll.pki import verifier
        from atoll.pki.kit import load_kit
        from atoll.pki.provenance import site_entry
        from atoll.server.provenance import ServerProvenance
        verifier.prestart()
        site, server = load_kit(Path({str(site.kit_dir)!r})), load_kit(Path({str(server.kit_dir)!r}))
        jobs = Path({str(jobs_dir)!r})
        prov = ServerProvenance(server, jobs, "9.9")
        prov.taken_in({JOB!r}, "alpha", "lead@a.org", "sha256:x")
        statement = {statement(jobs_dir)!r}
        def item(kind, signer):
            return {{"provenance": [site_entry({JOB!r}, statement, kind, "site-a",
                                              {{"decision": "accepted"}}, signer.key.read_bytes(),
                                              signer.cert.read_bytes(), at=1_800_000_000)],
                     "certificate": signer.cert.read_text()}}
        prov.site_items({JOB!r}, "site-a", item("site.decision", site))
        prov.site_items({JOB!r}, "site-a", item("site.launch", server))  # forged: left out
        prov.finished({JOB!r}, "COMPLETED", "")
        sys.stdout.write(json.dumps({{"record": prov.export({JOB!r}).decode(),
                                     "cryptography": "cryptography" in sys.modules}}))
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    verified = verify(out["record"].encode(), server.ca.read_bytes())
    assert [(e.kind, e.by_name) for e in verified.entries] == [
        ("job.signed", "server"), ("server.intake", "server"), ("site.decision", "site-a"),
        ("job.final", "server")]
    assert out["cryptography"] is False
