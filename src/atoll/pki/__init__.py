"""Provisioning: the project's CA, participant certificates and startup kits.

- ``project.py``: ``project.yaml``, validated (every error at once, with its YAML path);
- ``ca.py``, ``certs.py``: the root CA and the certificates it signs;
- ``identity.py``: who a verified peer is, read from its certificate (small and fast);
- ``kit.py``: a startup kit on disk and ``load_kit``;
- ``provision.py``, ``templates.py``: writing a project folder, adding a site or user later;
- ``state.py``: ``ca/state.json``, the register of every certificate issued;
- ``request.py``, ``sign_request.py``, ``bundle.py``: keys that never leave their owner (a
  participant's signing request, the admin's signature, the signed bundle, the kit assembled);
- ``revoke.py``, ``crl.py``: revoking a certificate in the CA-signed revocation list;
- ``revocation.py``: the list as a parent holds and enforces it (no cryptography import);
- ``tls.py``: gRPC credentials from a kit.
"""
