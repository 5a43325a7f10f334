"""Provisioning: the project's CA, participant certificates and startup kits.

- ``project.py``: ``project.yaml``, validated (every error at once, with its YAML path);
- ``ca.py``, ``certs.py``: the root CA and the certificates it signs;
- ``identity.py``: who a verified peer is, read from its certificate (small and fast);
- ``kit.py``: a startup kit on disk and ``load_kit``;
- ``provision.py``, ``templates.py``: writing a project folder, adding a site or user later;
- ``tls.py``: gRPC credentials from a kit.
"""
