"""The defences' mutation list: each entry removes or weakens one defence, and the tests it names
must then fail (scripts/mutation_suite.py runs them; docs/testing.md, "Mutation suite").

``find`` is an exact snippet that occurs exactly once in ``path``; ``replace`` is the weakened
code. When a refactor moves a defence, the runner says the list is stale: update the snippet to
the code as it is now, never drop the entry. ``tests`` are the fastest tests that catch the
mutation (node ids or files); an integration test only where no unit test can.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Mutation:
    defence: str
    path: str
    find: str
    replace: str
    tests: list[str] = field(default_factory=list)
    timeout: int = 60  # pytest-timeout per test: a defence removed may hang a test, not fail it


SANDBOX = "src/atoll/launchers/process_sandbox.py"
SANDBOX_GOLDEN = ["tests/unit/launchers/test_process_render.py::test_seed_hospital_render_golden"]
JOB_FILES = "src/atoll/launchers/job_files.py"
JOB_FILES_TESTS = ["tests/unit/launchers/test_job_files.py"]
JOB_FILES_RACE = ["tests/unit/launchers/test_job_files_checks.py"]
PKI_FILES = "src/atoll/base/files.py"
PKI_FILES_TESTS = ["tests/unit/base/test_files.py"]
ARCHIVE = "src/atoll/wire/job_archive.py"
ARCHIVE_TESTS = ["tests/unit/wire/test_job_archive.py"]
SIGNATURE = "src/atoll/pki/job_signature.py"
SIGNATURE_TESTS = ["tests/unit/pki/test_job_signature.py"]
SITE_CHECK = "src/atoll/site/job_acceptance.py"
SITE_CHECK_TESTS = ["tests/unit/site/test_job_acceptance.py"]
SESSIONS = "src/atoll/server/sessions.py"
SESSION_TESTS = ["tests/unit/server/test_auth_gate.py::test_session_tokens_are_checked_for_their_user"]
AUTH = "src/atoll/server/auth.py"
AUTH_TESTS = ["tests/unit/server/test_auth_gate.py"]
CRL = "src/atoll/pki/crl.py"
REVOCATION = "src/atoll/pki/revocation.py"
REVOCATION_TESTS = ["tests/unit/pki/test_revocation.py"]
SERVER_REVOCATION = "src/atoll/server/revocation.py"
SERVER_REVOCATION_TESTS = ["tests/unit/server/test_revocation_gate.py"]
SECAGG = "src/atoll/fl/privacy/secagg/server.py"
SECAGG_TESTS = ["tests/unit/fl/privacy/test_secagg_server_refusals.py"]
SECAGG_MASKING = "src/atoll/fl/privacy/secagg/masking.py"
SECAGG_CRYPTO = "src/atoll/fl/privacy/secagg/crypto.py"
SECAGG_PRIMITIVES_TESTS = ["tests/unit/fl/privacy/test_secagg_primitives.py"]
PRIVACY = "src/atoll/spec/privacy.py"
PRIVACY_TESTS = ["tests/unit/fl/privacy/test_site_policy.py"]
FILTERS = "src/atoll/fl/privacy/filters.py"
FILTERS_TESTS = ["tests/unit/fl/privacy/test_filters.py"]
STUDIES = "src/atoll/server/studies.py"
STUDY_OPS = "src/atoll/server/study_ops.py"
SCHEDULER = "src/atoll/server/scheduler.py"
STUDY_TESTS = ["tests/unit/server/test_study_checks.py"]
GUARD = "src/atoll/wire/guard.py"
DASHBOARD = "src/atoll/dashboard/access.py"
DASHBOARD_TESTS = ["tests/unit/dashboard/test_access.py"]
GUARD_TESTS = ["tests/unit/wire/test_guard.py"]
SERVER_INTAKE = "src/atoll/server/intake.py"
SERVER_LIFECYCLE = "src/atoll/server/lifecycle.py"
SERVER_DISPATCH = "src/atoll/server/dispatch.py"
SERVER_WORKER_LAUNCH = "src/atoll/server/server_worker.py"
ADMISSION = "src/atoll/spec/admission.py"  # the study's rules, for the CLI and the server's intake
JOB_SIGNING = "src/atoll/server/job_signing.py"
FL_CHECK_TESTS = ["tests/unit/fl/test_job_folder_check.py::test_min_clients_and_sites_against_the_study"]
# -- issue 32's defences -----------------------------------------------------------------------
PROCESS_NETWORK = "src/atoll/launchers/process_network.py"
NETWORK_TESTS = ["tests/unit/launchers/test_process_network.py"]
SITE_CONFIG = "src/atoll/spec/site_config.py"
SITE_CONFIG_TESTS = ["tests/unit/spec/test_site_config.py"]
DOCKER_RENDER = "src/atoll/launchers/docker_render.py"
DOCKER_TESTS = ["tests/unit/launchers/test_docker_render.py"]
DOCKER_GPU_TESTS = ["tests/unit/launchers/test_docker_gpus.py"]
ALLOCATION = "src/atoll/launchers/process_allocation.py"
QUANTIZATION = "src/atoll/fl/quantization.py"
QUANTIZATION_TESTS = ["tests/unit/fl/test_quantization.py"]
GPU_ALLOCATOR_TESTS = ["tests/unit/launchers/test_gpu_allocator.py"]
KIT_PATHS = "src/atoll/spec/kit_paths.py"
LENT = "src/atoll/launchers/lent_folders.py"
LENT_TESTS = ["tests/unit/launchers/test_lent_folders.py"]
K8S_RENDER = "src/atoll/launchers/kubernetes_render.py"
K8S_POLICY_TESTS = ["tests/unit/launchers/test_k8s_network_policy.py"]
RENDEZVOUS = "src/atoll/fl/rendezvous.py"
RENDEZVOUS_TESTS = ["tests/unit/fl/test_rendezvous.py"]
NAMES = "src/atoll/spec/names.py"
NAMES_TESTS = ["tests/unit/spec/test_identifier_grammars.py"]
SUPERVISOR = "src/atoll/site/supervisor.py"
WORKER_BACKEND = "src/atoll/site/worker_backend.py"
TASK_HEAD_TESTS = ["tests/unit/site/test_task_headers.py"]
WORKER_ENDPOINT = "src/atoll/parent/worker_endpoint.py"
WORKER_ENDPOINT_TESTS = ["tests/unit/parent/test_worker_endpoint.py"]
FEDERATION = "src/atoll/server/federation_service.py"
BODIES = "src/atoll/wire/bodies.py"
FEDERATION_TESTS = ["tests/unit/server/test_site_identifiers.py", "tests/unit/wire/test_bodies.py"]
SIGNED_JOBS = "src/atoll/site/signed_jobs.py"
SIGNED_JOBS_TESTS = ["tests/unit/site/test_signed_jobs.py"]
LAUNCH_BASE = "src/atoll/launchers/base.py"
RENDER_ID_TESTS = ["tests/unit/launchers/test_render_identifiers.py"]
EGRESS = "src/atoll/fl/privacy/egress.py"
SITE_PRIVACY = "src/atoll/fl/privacy/site_privacy.py"
EGRESS_TESTS = ["tests/unit/fl/privacy/test_egress.py"]
CLASSIFY_TESTS = ["tests/unit/fl/privacy/test_egress.py::test_a_reply_is_classified_by_what_it_carries"]
PRIVACY_LEDGER = "src/atoll/site/privacy_ledger.py"
BUDGET_LEDGER = "src/atoll/spec/budget_ledger.py"
LEDGER_TESTS = ["tests/unit/site/test_privacy_ledger.py"]
SECAGG_CLIENT = "src/atoll/fl/privacy/secagg/client.py"
SECAGG_IDENTITY = "src/atoll/fl/privacy/secagg/identity.py"
SECAGG_CLIENT_TESTS = ["tests/unit/fl/privacy/test_secagg_client_checks.py"]
STATS_RELEASE = "src/atoll/fl/statistics_release.py"
STATS_RELEASE_TESTS = ["tests/unit/fl/test_statistics_release.py"]
STATS_GUARD = "src/atoll/fl/statistics_guard.py"
STATS_GUARD_TESTS = ["tests/unit/fl/test_statistics_guard.py"]
STATS_RULES = "src/atoll/spec/statistics_rules.py"
STATS_RULES_TESTS = ["tests/unit/spec/test_statistics_rules.py"]
JOB_SIGNER = "src/atoll/server/job_signer.py"
REVOKED_SIGNERS_TESTS = ["tests/unit/server/test_revoked_signers.py"]
WORKER_SIGNED = "src/atoll/worker/signed_job.py"
WORKER_SIGNED_TESTS = ["tests/unit/worker/test_signed_job.py"]
SITE_REVOCATION = "src/atoll/site/revocation.py"
SITE_REVOKED_TESTS = ["tests/unit/site/test_revoked_before_launch.py"]
STALE_TESTS = ["tests/unit/site/test_stale_revocation_list.py"]


def _sandbox(defence: str, flag: str) -> Mutation:
    return Mutation(f"sandbox: {defence}", SANDBOX, f'"{flag}",', "", SANDBOX_GOLDEN)


MUTATIONS: list[Mutation] = [
    # -- the process launcher's sandbox (launchers/process_sandbox.py) -------------------------
    _sandbox("own user namespace", "--unshare-user"),
    _sandbox("own PID namespace", "--unshare-pid"),
    _sandbox("own IPC namespace", "--unshare-ipc"),
    _sandbox("own UTS namespace", "--unshare-uts"),
    _sandbox("dies with its parent", "--die-with-parent"),
    Mutation("sandbox: every capability dropped", SANDBOX, '"--cap-drop", "ALL"]',
             "]", SANDBOX_GOLDEN),
    Mutation("sandbox: system folders read-only", SANDBOX,
             'argv += ["--symlink", link, path] if link else ["--ro-bind", path, path]',
             'argv += ["--symlink", link, path] if link else ["--bind", path, path]',
             SANDBOX_GOLDEN),
    Mutation("sandbox: the worker's Python read-only", SANDBOX,
             'argv += ["--ro-bind", folder, folder]', 'argv += ["--bind", folder, folder]',
             SANDBOX_GOLDEN),
    Mutation("sandbox: the job's app read-only", SANDBOX,
             'argv += ["--ro-bind-try", app_folder, app_folder]',
             'argv += ["--bind-try", app_folder, app_folder]', SANDBOX_GOLDEN),
    Mutation("sandbox: a dataset's mode kept", SANDBOX,
             '"--bind" if mount.writable else "--ro-bind"', '"--bind"', SANDBOX_GOLDEN),
    Mutation("sandbox: a private /tmp, /proc and /dev", SANDBOX,
             'argv += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", SANDBOX_TMP]',
             'argv += ["--bind", "/proc", "/proc", "--dev-bind", "/dev", "/dev"]',
             SANDBOX_GOLDEN),
    Mutation("sandbox: only the GPUs given", SANDBOX,
             '*(f"/dev/nvidia{g}" for g in gpu_ids if str(g).isdigit())',
             '*(f"/dev/nvidia{g}" for g in range(8))', SANDBOX_GOLDEN),
    # -- a job's files read without following links (launchers/job_files.py) ------------------
    Mutation("job files: folders opened with O_NOFOLLOW", JOB_FILES,
             "_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC",
             "_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC", JOB_FILES_TESTS),
    Mutation("job files: files opened with O_NOFOLLOW", JOB_FILES,
             "_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK",
             "_FILE = os.O_RDONLY | os.O_NONBLOCK", JOB_FILES_TESTS),
    Mutation("job files: a FIFO never blocks the parent (O_NONBLOCK)", JOB_FILES,
             "_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY",
             "_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NOCTTY", JOB_FILES_TESTS, timeout=20),
    Mutation("job files: only regular files", JOB_FILES,
             "        if not stat.S_ISREG(info.st_mode):\n            raise JobFileError(rel, "
             "\"is not a regular file\")\n",
             "", JOB_FILES_TESTS, timeout=20),
    Mutation("job files: no hard links", JOB_FILES, "if info.st_nlink != 1:", "if False:",
             JOB_FILES_TESTS),
    Mutation("job files: the size limit", JOB_FILES,
             "if max_bytes is not None and info.st_size > max_bytes:", "if False:",
             JOB_FILES_RACE),
    Mutation("job files: no .. nor absolute paths", JOB_FILES,
             'if path.is_absolute() or not parts or ".." in parts',
             "if not parts", JOB_FILES_TESTS),
    Mutation("job files: a planted link replaced, not written through", JOB_FILES,
             "os.unlink(parts[-1], dir_fd=dir_fd)  # a link", "pass  # a link", JOB_FILES_TESTS),
    Mutation("job files: files written with O_NOFOLLOW|O_EXCL", JOB_FILES,
             "flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC",
             "flags = os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC", JOB_FILES_RACE),
    Mutation("job files: files written with O_EXCL (a hard link planted in a race)", JOB_FILES,
             "flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC",
             "flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC", JOB_FILES_RACE),
    Mutation("job files: written files are 0600", JOB_FILES,
             "os.fchmod(fd, 0o600)  # O_CREAT", "os.fchmod(fd, 0o644)  # O_CREAT",
             JOB_FILES_TESTS),
    # -- private files (base/files.py) ----------------------------------------------------------
    Mutation("private files: created with their mode (never readable meanwhile)", PKI_FILES,
             "fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)",
             "fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL)", PKI_FILES_TESTS),
    Mutation("private files: a wide leftover removed first", PKI_FILES,
             "tmp.unlink(missing_ok=True)  # a leftover", "pass  # a leftover", PKI_FILES_TESTS),
    Mutation("private files: mode set whatever the umask", PKI_FILES,
             "os.chmod(tmp, mode)  # O_CREAT's", "pass  # O_CREAT's", PKI_FILES_TESTS),
    Mutation("private files: an existing log narrowed to 0600", PKI_FILES,
             "os.fchmod(fd, PRIVATE)", "pass", PKI_FILES_TESTS),
    Mutation("private files: private folders 0700", PKI_FILES, "os.chmod(path, 0o700)", "pass",
             ["tests/security/test_private_files.py::"
              "test_private_dir_and_append_private_narrow_what_exists"]),
    # -- job intake (wire/job_archive.py) ------------------------------------------------------
    Mutation("intake: no .. entries", ARCHIVE, 'or ".." in parts:', ":", ARCHIVE_TESTS),
    Mutation("intake: no absolute entries", ARCHIVE, 'if name.startswith("/") or "\\\\" in name',
             'if "\\\\" in name', ARCHIVE_TESTS),
    Mutation("intake: no backslashed entries", ARCHIVE, 'or "\\\\" in name or', "or",
             ARCHIVE_TESTS),
    Mutation("intake: no entry naming the folder itself", ARCHIVE,
             "    if not parts:\n        raise IntakeError", "    if False:\n        raise "
             "IntakeError", ARCHIVE_TESTS),
    Mutation("intake: no entry given twice", ARCHIVE, "elif key in files:", "elif False:",
             ARCHIVE_TESTS),
    Mutation("intake: no name both a file and a folder", ARCHIVE, "        if key in folders:",
             "        if False:", ARCHIVE_TESTS),
    Mutation("intake: no symbolic links", ARCHIVE, "if kind == stat.S_IFLNK:", "if False:",
             ["tests/unit/wire/test_job_archive.py::test_a_symbolic_link_is_refused"]),
    Mutation("intake: only regular files and folders", ARCHIVE,
             "if kind not in (0, stat.S_IFREG, stat.S_IFDIR):", "if False:", ARCHIVE_TESTS),
    Mutation("intake: no control characters", ARCHIVE, "if _CONTROL.search(name):", "if False:",
             ARCHIVE_TESTS),
    Mutation("intake: folders nested at most MAX_DEPTH", ARCHIVE,
             "if len(parts) > MAX_DEPTH:", "if False:", ARCHIVE_TESTS),
    Mutation("intake: names no longer than the file system takes", ARCHIVE,
             "if len(name.encode()) > MAX_PATH_BYTES or any(",
             "if False and any(", ARCHIVE_TESTS),
    Mutation("intake: no encrypted entries", ARCHIVE, "if info.flag_bits & 0x1:", "if False:",
             ARCHIVE_TESTS),
    Mutation("intake: no patched data", ARCHIVE, "if info.flag_bits & 0x20:", "if False:",
             ARCHIVE_TESTS),
    Mutation("intake: deflate or stored only", ARCHIVE,
             "if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):",
             "if False:", ARCHIVE_TESTS),
    Mutation("intake: at most MAX_ENTRIES entries, counted before zipfile reads them", ARCHIVE,
             "    if count > MAX_ENTRIES:", "    if False:", ARCHIVE_TESTS),
    Mutation("intake: at most MAX_ENTRIES entries (zipfile's list)", ARCHIVE,
             "            if len(infos) > MAX_ENTRIES:", "            if False:",
             ["tests/unit/wire/test_job_archive.py::test_the_entry_list_is_counted_again_as_zipfile_reads_it"]),
    Mutation("intake: the uncompressed size limit (zip bombs)", ARCHIVE,
             "        if total > max_bytes:", "        if False:", ARCHIVE_TESTS),
    Mutation("intake: an entry never yields more than it declares", ARCHIVE,
             "if written != info.file_size:", "if False:", ARCHIVE_TESTS),
    Mutation("intake: nothing left behind on a refusal", ARCHIVE,
             "        if not self.kept:\n            shutil.rmtree",
             "        if False:\n            shutil.rmtree", ARCHIVE_TESTS),
    # -- the server's intake (server/intake.py, spec/admission.py, server/job_signing.py) ---------------------------
    Mutation("server intake: only sites of the study", ADMISSION,
             "if target not in (SERVER, ALL_SITES) and target not in study_sites:", "if False:",
             ["tests/integration/federation/test_studies.py::"
              "test_submit_to_a_site_outside_the_study_is_refused_before_any_site"], timeout=240),
    Mutation("server intake: the signature checked", SERVER_INTAKE,
             "digest = self.check.verify(tree, who, study)", 'digest = "unchecked"',
             ["tests/integration/federation/test_signed_jobs.py::"
              "test_the_server_takes_only_jobs_signed_by_their_submitter_for_their_study"],
             timeout=240),
    Mutation("server intake: signed by the submitter", JOB_SIGNING, "if signer != who:",
             "if False:",
             ["tests/integration/federation/test_signed_jobs.py::"
              "test_the_server_takes_only_jobs_signed_by_their_submitter_for_their_study"],
             timeout=240),
    Mutation("job check: deploy_map names only the study's sites", ADMISSION,
             "if target not in (SERVER, ALL_SITES) and target not in study_sites:", "if False:",
             FL_CHECK_TESTS),
    Mutation("job check: mandatory sites in the study", ADMISSION,
             "    for i, site in enumerate(meta.mandatory_clients):\n        if site not in "
             "study_sites:", "    for i, site in enumerate(meta.mandatory_clients):\n        if "
             "False:", FL_CHECK_TESTS),
    Mutation("job check: min_clients reachable in the study", ADMISSION,
             "if meta.min_clients is not None and meta.min_clients > len(reachable):",
             "if False:", FL_CHECK_TESTS),
    # -- job signatures (pki/job_signature.py) -------------------------------------------------
    Mutation("signature: issued by the project's CA", SIGNATURE,
             "        cert.verify_directly_issued_by(ca)\n", "        pass\n", ["tests/unit/pki/test_job_signature.py::test_a_certificate_of_another_ca_is_refused"]),
    Mutation("signature: the signer's certificate valid now", SIGNATURE,
             "if not cert.not_valid_before_utc <= at <= cert.not_valid_after_utc:", "if False:",
             ["tests/unit/pki/test_job_signature.py::test_an_expired_certificate_is_refused"]),
    Mutation("signature: only user certificates sign", SIGNATURE, "    if not user_cert:",
             "    if False:", ["tests/unit/pki/test_job_signature.py::test_a_site_certificate_cannot_sign_jobs"]),
    Mutation("signature: a revoked signer refused", SIGNATURE,
             "why = revoked(cert) if revoked is not None else None", "why = None",
             ["tests/unit/pki/test_job_signature.py::test_a_revoked_certificate_is_refused_when_revocation_is_known"]),
    Mutation("signature: the statement verified", SIGNATURE,
             "        key.verify(signature, text, ec.ECDSA(hashes.SHA256()))\n",
             "        pass\n", ["tests/unit/pki/test_job_signature.py::test_a_changed_statement_breaks_the_signature"]),
    Mutation("signature: the statement names its signer", SIGNATURE,
             "if statement.submitter != signer.name:", "if False:", ["tests/unit/pki/test_job_signature.py::test_a_statement_naming_someone_else_is_refused"]),
    Mutation("signature: the files are the signed ones", SIGNATURE,
             "    if not (changed or added or missing):\n        return",
             "    if True:\n        return", ["tests/unit/pki/test_job_signature.py::test_any_change_to_the_content_is_refused_by_name"]),
    Mutation("signature: bound to its project", SIGNATURE,
             "if statement.project != project:", "if False:",
             ["tests/unit/pki/test_job_signature_binding.py"]),
    Mutation("signature: bound to its study (no replay)", SIGNATURE,
             "if statement.study != study:", "if False:", ["tests/unit/pki/test_job_signature_binding.py"]),
    Mutation("signature: the signature file is reserved", SIGNATURE,
             "        if name == SIGNATURE_FILE:\n            raise",
             "        if False:\n            raise", ["tests/unit/pki/test_job_signature.py::test_the_signature_file_name_is_reserved"]),
    Mutation("signature: links in a job folder refused", SIGNATURE,
             "            if not stat.S_ISREG(mode):", "            if False:", ["tests/unit/pki/test_job_signature.py::test_a_link_in_a_job_folder_is_refused_when_listing_it"]),
    # -- a site's checks of a fetched job (site/job_acceptance.py) ----------------------------------
    Mutation("site check: bound to the project and the study it came in", SITE_CHECK,
             "        bind(signed, kit.project, study)\n", "", ["tests/unit/site/test_job_acceptance.py::test_the_server_cannot_name_another_submitter_or_study"]),
    Mutation("site check: the app's files as signed", SITE_CHECK,
             'scope=lambda path: path.split("/", 1)[0] in (app, META_FILE))',
             "scope=lambda path: path == META_FILE)", ["tests/unit/site/test_job_acceptance.py::test_a_job_changed_in_the_servers_store_is_refused"]),
    Mutation("site check: the dispatched meta is the signed one", SITE_CHECK,
             "        _check_dispatch(body, meta, signed, dispatched)\n", "", ["tests/unit/site/test_job_acceptance.py::test_a_dispatch_whose_meta_differs_from_the_signed_one_is_refused"]),
    Mutation("site check: the authorization policy", SITE_CHECK,
             "        if not decision.allowed:", "        if False:", ["tests/unit/site/test_job_acceptance.py::test_a_policy_that_denies_the_role_names_its_rule"]),
    Mutation("site check: code approval", SITE_CHECK, "    if not approved:", "    if False:",
             ["tests/unit/site/test_job_acceptance.py::test_code_approval_runs_only_approved_content"]),
    Mutation("site check: the site's privacy policy", SITE_CHECK,
             "    if violations:\n        raise JobRefused",
             "    if False:\n        raise JobRefused",
             ["tests/unit/fl/privacy/test_site_policy.py::"
              "test_the_site_parent_refuses_a_weaker_job_naming_the_rule"]),
    # -- sessions and the auth gate (server/sessions.py, server/auth.py) ------------------------
    Mutation("session: the token's signature checked", SESSIONS,
             'if version != "v1" or not hmac.compare_digest(signature, self._sign(payload)):',
             'if version != "v1":', SESSION_TESTS),
    Mutation("session: the token is the caller's", SESSIONS, 'body.get("u") != user or',
             "", SESSION_TESTS),
    Mutation("session: the token expires", SESSIONS, "expires < time.time()", "expires < 0",
             SESSION_TESTS),
    Mutation("auth: a certificate of the call's kind", AUTH, "        if who.kind != self.kind:",
             "        if False:", AUTH_TESTS),
    Mutation("auth: calls open at once per certificate", AUTH,
             "over_calls = not over_rate and self._open.get(key, 0) >= limit.calls",
             "over_calls = False", AUTH_TESTS),
    Mutation("auth: calls a second per certificate", AUTH, "over_rate = not bucket.take()",
             "over_rate = False", AUTH_TESTS),
    # -- revocation (pki/crl.py, pki/revocation.py, site/revocation.py) -------------------------
    Mutation("CRL: issued by the project's CA", CRL, "if crl.issuer != ca_cert.subject:",
             "if False:", ["tests/unit/pki/test_crl_issuer.py"]),
    Mutation("CRL: its signature verified", CRL, "if not crl.is_signature_valid(public):",
             "if False:", ["tests/unit/pki/test_revocation.py::test_a_list_of_another_ca_or_altered_is_refused"]),
    Mutation("CRL: lists only move forward", REVOCATION, "if new.number < held.number:",
             "if False:", ["tests/unit/pki/test_revocation.py::test_a_parent_keeps_the_newest_verified_list"]),
    Mutation("server revocation: a revoked certificate refused on every call",
             SERVER_REVOCATION, "        if entry is None:\n            return None\n        return (f\"this",
             "        if True:\n            return None\n        return (f\"this",
             SERVER_REVOCATION_TESTS),
    Mutation("server revocation: only project admins push a list", SERVER_REVOCATION,
             '        if who.role != "project_admin":\n            raise Denied("only project',
             '        if False:\n            raise Denied("only project', SERVER_REVOCATION_TESTS),
    Mutation("server revocation: a push closes a revoked site's link", SERVER_REVOCATION,
             "            if serial in held.entries:\n                log.warning",
             "            if False:\n                log.warning", SERVER_REVOCATION_TESTS),
    Mutation("server revocation: a site revoked before it connects is closed", SERVER_REVOCATION,
             "        if serial in held.entries:  # revoked between",
             "        if False:  # revoked between", SERVER_REVOCATION_TESTS),
    Mutation("server revocation: a late, closed link never hides a site's live one",
             SERVER_REVOCATION, "            if not link.closed.is_set():  # an older link",
             "            if True:  # an older link", SERVER_REVOCATION_TESTS),
    Mutation("auth: the caller a gate admitted serves its own call only", AUTH,
             "if admitted is not None and admitted[0] is context and admitted[1].kind == kind:",
             "if admitted is not None and admitted[1].kind == kind:",
             ["tests/unit/server/test_auth_gate.py"]),
    Mutation("auth: a revoked certificate refused on every call", AUTH,
             "if (revoked := revocation.refusal(pems[0])) is not None:", "if False:",
             SERVER_REVOCATION_TESTS),
    Mutation("site check: a revoked signer refused", SITE_CHECK, "    if reason:\n",
             "    if False:\n", ["tests/unit/site/test_job_acceptance.py::test_a_signer_on_the_sites_revocation_list_is_refused"]),
    # -- secure aggregation's server side (fl/privacy/secagg/server.py) ------------------------
    Mutation("secagg: an unmasked result refused", SECAGG,
             "if any(dtype not in _WORDS for dtype, _ in entries.values()) or \\\n"
             "                entries.get(masking.WEIGHT) != (np.dtype(np.uint64), (1,)):",
             "if False:", SECAGG_TESTS),
    Mutation("secagg: a result of other names or shapes refused", SECAGG,
             "elif entries != {n: (a.dtype, a.shape) for n, a in self._sum.items()}:",
             "elif False:", SECAGG_TESTS),
    Mutation("secagg: a reply without the step's keys refused", SECAGG,
             "            if not expected <= set(meta):", "            if False:",
             ["tests/unit/fl/privacy/test_secure_aggregation.py::"
              "test_a_site_without_secure_aggregation_in_its_app_is_rejected_naming_why"]),
    Mutation("secagg: a step with fewer answers than needed refused", SECAGG,
             "        if len(answers) < need:", "        if False:",
             ["tests/unit/fl/privacy/test_secagg_server_refusals.py::"
              "test_a_step_that_gathered_fewer_answers_than_it_needs_goes_no_further"]),
    Mutation("secagg: a threshold above the sites refused", SECAGG,
             "        if self.threshold > len(self.keys):", "        if False:", SECAGG_TESTS),
    Mutation("secagg: too few shares to rebuild a secret refused", SECAGG,
             "            if len(shares) < self.threshold:", "            if False:",
             SECAGG_TESTS),
    Mutation("secagg: a dropped site's mask key must rebuild", SECAGG,
             '            if crypto.public_of(private) != self.keys[gone]["s"]:',
             "            if False:", SECAGG_TESTS),
    Mutation("secagg: an update past its share of max_sum refused (the ring never wraps)",
             SECAGG_MASKING, "            if max(-low, high) > limit:",
             "            if False:", SECAGG_PRIMITIVES_TESTS),
    Mutation("secagg: a non-finite update refused", SECAGG_MASKING,
             "            if not (math.isfinite(low) and math.isfinite(high)):",
             "            if False:",
             SECAGG_PRIMITIVES_TESTS),
    Mutation("secagg: mask streams never share keystream (the stream in the counter's high "
             "half)", SECAGG_CRYPTO, 'return (stream << 64).to_bytes(16, "big")',
             'return stream.to_bytes(16, "big")', SECAGG_PRIMITIVES_TESTS),
    Mutation("secagg: max_sum leaves the fixed point its precision", PRIVACY,
             "        if bits < MIN_FRACTION_BITS:", "        if False:",
             SECAGG_PRIMITIVES_TESTS),
    # -- each privacy rule of a site's policy (spec/privacy.py) --------------------------------
    Mutation("privacy rule: require.exclude", PRIVACY, "    if missing:\n", "    if False:\n",
             PRIVACY_TESTS),
    Mutation("privacy rule: require.max_clip_norm", PRIVACY,
             "(clip is None or clip > need.max_clip_norm)", "False", PRIVACY_TESTS),
    Mutation("privacy rule: require.min_noise_multiplier", PRIVACY,
             "noise is None or noise < need.min_noise_multiplier", "False", PRIVACY_TESTS),
    Mutation("privacy rule: noise before a later clip does not count", PRIVACY,
             "clip, noise = spec.max_norm, None", "clip = spec.max_norm", PRIVACY_TESTS),
    Mutation("privacy rule: require.secure_aggregation", PRIVACY,
             "if need.secure_aggregation and job.secure_aggregation is None:", "if False:",
             PRIVACY_TESTS),
    Mutation("privacy rule: budget.epsilon needs noise", PRIVACY,
             "if policy.budget is not None and noise is None and job.dp_sgd is None:",
             "if False:", PRIVACY_TESTS),
    # -- each privacy filter (fl/privacy/filters.py) -------------------------------------------
    Mutation("privacy filter: exclude zeroes its variables", FILTERS,
             "np.zeros_like(a) if any(fnmatch.fnmatchcase(name, p) for p in patterns) else a",
             "a", FILTERS_TESTS),
    Mutation("privacy filter: exclude drops its variables from a task", FILTERS,
             "if not any(fnmatch.fnmatchcase(name, p) for p in patterns)}", "}", FILTERS_TESTS),
    Mutation("privacy filter: percentile keeps only the largest", FILTERS,
             "out[name] = np.where(mask, update[name], 0)", "out[name] = np.where(True, update[name], 0)",
             FILTERS_TESTS),
    Mutation("privacy filter: clip to the norm", FILTERS, "    if norm <= max_norm:",
             "    if True:", FILTERS_TESTS),
    Mutation("privacy filter: gaussian noise", FILTERS,
             "(a + rng.normal(0.0, std, a.shape)).astype(a.dtype)", "a", FILTERS_TESTS),
    Mutation("privacy filter: no noise without a clip before it", FILTERS,
             "            if clip_norm is None:", "            if False:", ["tests/unit/fl/privacy/test_filter_order.py"]),
    # -- studies (server/studies.py, server/study_ops.py, server/scheduler.py) -----------------
    Mutation("study: members only", STUDIES, "        if not self.can_see(who, study):",
             "        if False:", STUDY_TESTS),
    Mutation("study: an absent study is no one's", STUDIES,
             "        if not self.exists(study):\n            return False",
             "        if False:\n            return False", STUDY_TESTS),
    Mutation("study: an org admin sees only their org's studies", STUDIES,
             "return any(self.org_of(site) == who.org for site in self.sites(study))",
             "return True", STUDY_TESTS),
    Mutation("study: no default study once named ones exist", STUDIES,
             "if study == DEFAULT and not self.exists(DEFAULT):", "if False:", STUDY_TESTS),
    Mutation("study ops: only project admins create studies", STUDY_OPS,
             '            raise Denied(f"{who.name} ({who.role}) may not create studies',
             '            pass  # (f"{who.name} ({who.role}) may not create studies',
             STUDY_TESTS),
    Mutation("study ops: only project admins remove studies", STUDY_OPS,
             'if who.role != "project_admin" or is_open:', "if is_open:", STUDY_TESTS),
    Mutation("study ops: a study with jobs is kept", STUDY_OPS, "        if jobs:\n",
             "        if False:\n", STUDY_TESTS),
    Mutation("study ops: study names checked", STUDY_OPS, "if not STUDY_NAME.match(name):",
             "if not name:", STUDY_TESTS),
    Mutation("study ops: only admins change members", STUDY_OPS,
             'if who.role not in ("project_admin", "org_admin"):', "if False:", STUDY_TESTS),
    Mutation("study ops: an org admin changes only their own org's members", STUDY_OPS,
             'if (participant is None or participant["org"] != who.org',
             "if (participant is None", STUDY_TESTS),
    Mutation("scheduler: never dispatched outside the study", SCHEDULER,
             "sites = reachable_sites(meta, study_sites)", "sites = targets", STUDY_TESTS),
    Mutation("scheduler: a mandatory site outside the study refused at intake", ADMISSION,
             "    for i, site in enumerate(meta.mandatory_clients):\n        if site not in "
             "study_sites:", "    for i, site in enumerate(meta.mandatory_clients):\n        if "
             "False:", STUDY_TESTS),
    # -- hostile peers (wire/guard.py) ---------------------------------------------------------
    Mutation("guard: a deadline on every read", GUARD, "async with asyncio.timeout(timeout):",
             "async with asyncio.timeout(None):", GUARD_TESTS, timeout=10),
    Mutation("guard: the next messages' own deadline", GUARD,
             "timeout = self.deadlines.first_s if first else self.deadlines.next_s",
             "timeout = self.deadlines.first_s", GUARD_TESTS, timeout=10),
    Mutation("guard: a message decoded as its type", GUARD, "return cls.FromString(raw)",
             "return raw", GUARD_TESTS),
    # == issue 32's defences ====================================================================
    # -- the process sandbox's network (process_sandbox.py, spec/site_config.py, process_network)
    Mutation("sandbox network: its own network namespace (--unshare-net)", SANDBOX,
             'argv.append("--unshare-net")', "pass", NETWORK_TESTS),
    Mutation("sandbox network: isolated by default", SITE_CONFIG,
             'mode: Literal["isolated", "host"] = Field(\n        "isolated",',
             'mode: Literal["isolated", "host"] = Field(\n        "host",', SITE_CONFIG_TESTS),
    Mutation("sandbox network: isolation needs the bwrap sandbox", SITE_CONFIG,
             'return self.sandbox == "bwrap" and self.network.mode == "isolated"',
             'return self.network.mode == "isolated"', SITE_CONFIG_TESTS),
    Mutation("sandbox network: sandbox none with network isolated refused", SITE_CONFIG,
             'if self.sandbox == "none" and "network" in self.model_fields_set and (',
             'if False and (', SITE_CONFIG_TESTS),
    Mutation("sandbox network: allowed destinations checked", SITE_CONFIG,
             "if (why := destination_problem(entry))]", "if False]", SITE_CONFIG_TESTS),
    Mutation("sandbox network: no address but IPv4 loopback", SITE_CONFIG,
             "if address.version == 4 and address.is_loopback:", "if True:", SITE_CONFIG_TESTS),
    Mutation("sandbox network: a destination listed once", SITE_CONFIG,
             "if key in seen:  # the worker would dial both", "if False:  # the worker would dial both",
             SITE_CONFIG_TESTS),
    Mutation("sandbox network: at most MAX_ALLOWED_DESTINATIONS", SITE_CONFIG,
             "if len(value) > MAX_ALLOWED_DESTINATIONS:", "if False:", SITE_CONFIG_TESTS),
    Mutation("sandbox network: host mode takes no allow list", SITE_CONFIG,
             'if self.mode == "host" and self.allow:', "if False:", SITE_CONFIG_TESTS),
    # (never a mutant that points the folder at /tmp itself: close() removes the folder)
    Mutation("sandbox network: the relays' folder private (0700)", PROCESS_NETWORK,
             'self.folder = tempfile.mkdtemp(prefix="atoll-net-", dir=base)',
             'self.folder = tempfile.mkdtemp(prefix="atoll-net-", dir=base)\n'
             '        os.chmod(self.folder, 0o755)', NETWORK_TESTS),
    Mutation("sandbox network: destinations' names in the sandbox's /etc/hosts",
             PROCESS_NETWORK, "        if not named:\n            return",
             "        if True:\n            return", NETWORK_TESTS),
    Mutation("sandbox network: a named destination on its own loopback address", SITE_CONFIG,
             'listen = f"{NAMED_DESTINATIONS_NET}{named}"', "listen = host", NETWORK_TESTS),
    # -- Docker's network and GPUs (launchers/docker_render.py, process_allocation.py) ---------
    Mutation("docker network: none by default", DOCKER_RENDER,
             'return NetworkPlan({"network_mode": "none"}, relay=True)',
             'return NetworkPlan({}, relay=True)', DOCKER_TESTS),
    Mutation("docker network: a named network's loopback parent through the relay",
             DOCKER_RENDER,
             'return NetworkPlan({"network": network}, relay=is_loopback(address_host(parent_address)))',
             'return NetworkPlan({"network": network}, relay=False)', DOCKER_TESTS),
    Mutation("docker GPUs: device_ids, never a count", DOCKER_RENDER,
             'return [{"driver": "", "count": 0, "device_ids": ids, "capabilities": [["gpu"]]}]',
             'return [{"driver": "", "count": len(ids), "capabilities": [["gpu"]]}]',
             DOCKER_GPU_TESTS),
    Mutation("docker GPUs: no GPU renders no request", DOCKER_RENDER,
             "        return []  # explicit: no GPU",
             '        return [{"driver": "", "count": -1, "capabilities": [["gpu"]]}]  # explicit',
             ["tests/unit/launchers/test_docker_render.py::"
              "test_a_job_without_gpus_asks_the_engine_for_none"]),
    Mutation("docker GPUs: a container only with the GPUs it asked for", DOCKER_RENDER,
             "    if len(gpu_ids) != resources.num_of_gpus:\n        raise LaunchError(gpu_shortage",
             "    if False:\n        raise LaunchError(gpu_shortage", DOCKER_TESTS),
    Mutation("GPU allocation: a GPU held by one job only", ALLOCATION,
             "free = [i for i in self._ids if i not in self._owner]\n            if len(free) < count:",
             "free = list(self._ids)\n            if len(free) < count:", GPU_ALLOCATOR_TESTS),
    Mutation("GPU allocation: a GPU released only by its own job", ALLOCATION,
             "for gpu in [g for g, j in self._owner.items() if j == job_key]:",
             "for gpu in list(self._owner):", GPU_ALLOCATOR_TESTS),
    # -- the kit never lent to a job (spec/kit_paths.py, launchers/lent_folders.py) ------------
    Mutation("kit: a folder holding the kit not lent", KIT_PATHS,
             "if source == kit or source in kit.parents:", "if False:", LENT_TESTS),
    Mutation("kit: a folder inside the kit not lent", KIT_PATHS, "if kit in source.parents:",
             "if False:", LENT_TESTS),
    Mutation("kit: the launcher asks again at launch", LENT,
             "problem = kit_bind_problem(source, PurePosixPath(kit)) if kit else None",
             "problem = None", LENT_TESTS),
    Mutation("kit: the jobs folder not lent", LENT,
             "if problem is None and (source == jobs or source in jobs.parents):",
             "if False:", LENT_TESTS),
    # -- Kubernetes: the job's NetworkPolicy (launchers/kubernetes_render.py) -------------------
    Mutation("k8s policy: egress only to the job's pods and the parent's port", K8S_RENDER,
             '{"to": [parent], "ports": [{"protocol": "TCP", "port": port}]},',
             '{"to": [parent]},', K8S_POLICY_TESTS),
    Mutation("k8s policy: ingress only from the job's own pods", K8S_RENDER,
             '"ingress": [{"from": [own]}],', '"ingress": [{}],', K8S_POLICY_TESTS),
    Mutation("k8s policy: both directions governed", K8S_RENDER,
             '"policyTypes": ["Ingress", "Egress"],', '"policyTypes": ["Ingress"],',
             K8S_POLICY_TESTS),
    Mutation("k8s policy: the job's pods are the ones it governs", K8S_RENDER,
             '"podSelector": _job_selector(ident),',
             '"podSelector": {"matchLabels": {"atoll.job": "none"}},', K8S_POLICY_TESTS),
    Mutation("k8s policy: the cluster's DNS on port 53 only", K8S_RENDER,
             'egress.append({"to": [dns], "ports": [{"protocol": "UDP", "port": 53},\n'
             '                                              {"protocol": "TCP", "port": 53}]})',
             'egress.append({"to": [dns]})', K8S_POLICY_TESTS),
    Mutation("k8s policy: rendered with every pod", K8S_RENDER,
             'return {"pod": pod, "secret": secret, "network_policy": policy}',
             'return {"pod": pod, "secret": secret}', K8S_POLICY_TESTS),
    # -- the rendezvous store bound to MASTER_ADDR (fl/rendezvous.py) ---------------------------
    Mutation("rendezvous: the store listens on MASTER_ADDR alone", RENDEZVOUS,
             "            sock.bind(address)",
             '            sock.bind(("0.0.0.0", address[1]) if family == socket.AF_INET else address)',
             ["tests/unit/fl/test_rendezvous.py::"
              "test_the_store_of_ranks_on_one_node_listens_on_loopback_only"], timeout=150),
    # -- identifier grammars (spec/names.py) and their uses where an id lands ------------------
    Mutation("grammar: job ids", NAMES, "return _checked(value, _JOB_ID_RE, field,",
             "return value if True else _checked(value, _JOB_ID_RE, field,", NAMES_TESTS),
    Mutation("grammar: task ids", NAMES, "return _checked(value, _TASK_ID_RE, field,",
             "return value if True else _checked(value, _TASK_ID_RE, field,", NAMES_TESTS),
    Mutation("grammar: site names", NAMES, "return _checked(value, _SITE_RE, field,",
             "return value if True else _checked(value, _SITE_RE, field,", NAMES_TESTS),
    Mutation("grammar: study names", NAMES, "return _checked(value, _STUDY_RE, field,",
             "return value if True else _checked(value, _STUDY_RE, field,", NAMES_TESTS),
    Mutation("grammar: user names", NAMES, "return _checked(value, _USER_RE, field,",
             "return value if True else _checked(value, _USER_RE, field,", NAMES_TESTS),
    Mutation("grammar: task names", NAMES, "return _checked(value, _TASK_NAME_RE, field,",
             "return value if True else _checked(value, _TASK_NAME_RE, field,", NAMES_TESTS),
    Mutation("grammar: dataset names", NAMES, "return _checked(value, _LABEL_RE, field,",
             "return value if True else _checked(value, _LABEL_RE, field,", NAMES_TESTS),
    Mutation("grammar: the pattern must match the whole value", NAMES,
             "or pattern.fullmatch(value) is None:", "or pattern.match(value) is None:",
             NAMES_TESTS),
    Mutation("grammar: the length limit", NAMES,
             "if not isinstance(value, str) or len(value) > max_len or pattern",
             "if not isinstance(value, str) or pattern", NAMES_TESTS),
    Mutation("grammar: app names have no '..'", NAMES, 'and ".." not in app\n', "\n",
             NAMES_TESTS),
    Mutation("grammar: round numbers bounded", NAMES,
             "or not 0 <= value <= MAX_ROUND:", ":", NAMES_TESTS),
    Mutation("landing: a dispatch's job id checked by the site", SUPERVISOR,
             '            job_id = check_job_id(body.get("job_id"))\n        except',
             '            job_id = str(body.get("job_id"))\n        except',
             ["tests/unit/site/test_admission.py"]),
    Mutation("landing: a dispatch's study checked by the site", SUPERVISOR,
             'study = check_study_name(body.get("study"))', 'study = body.get("study")',
             ["tests/unit/site/test_admission.py"]),
    Mutation("landing: a task header's task id checked by the site", WORKER_BACKEND,
             'return {"task_id": check_task_id(head["task_id"], "the task\'s task_id"),',
             'return {"task_id": head["task_id"],', TASK_HEAD_TESTS),
    Mutation("landing: a task header's topic checked by the site", WORKER_BACKEND,
             '"topic": check_task_name(head.get("topic"), "the task\'s topic"),',
             '"topic": head.get("topic"),', TASK_HEAD_TESTS),
    Mutation("landing: a task header's round checked by the site", WORKER_BACKEND,
             'check_round(headers.get("round"), "the task\'s round", optional=True)',
             "pass", TASK_HEAD_TESTS),
    Mutation("landing: a task header's headers an object", WORKER_BACKEND,
             "    if not isinstance(headers, dict):\n        raise frames.FrameError",
             "    if False:\n        raise frames.FrameError", TASK_HEAD_TESTS),
    Mutation("task stream: a reply's data ends at {sent: true} only", FEDERATION,
             'if head.get("sent") is not True or not set(head) <= {"sent", "pull"}:',
             "if False:",
             ["tests/unit/server/test_tasks_call.py"]),
    Mutation("task stream: a call that ends inside a reply delivers nothing", FEDERATION,
             'raise frames.FrameError(f"the call ended inside a reply: expected {expected}")'
             " \\\n                from None", "return", ["tests/unit/server/test_tasks_call.py"]),
    Mutation("task stream: a reply's data no longer than the bytes it said", FEDERATION,
             "if size is not None and got > size:", "if False:",
             ["tests/unit/server/test_tasks_call.py"]),
    Mutation("task stream: its job id checked before any lookup", FEDERATION,
             "        await _checked_id(context, job_id)\n        async for raw in stream:",
             "        async for raw in stream:", FEDERATION_TESTS),
    Mutation("task stream: a site takes a task only whole, up to its {done}",
             "src/atoll/site/task_stream.py", 'if frames.read_header(raw) != {"done": True}:',
             "if False:", ["tests/unit/site/test_task_stream.py"]),
    Mutation("replies: a small reply holds no file until whole", "src/atoll/server/relay.py",
             "if self._held_bytes + len(raw) <= small and self.relay.budget.take(len(raw)):",
             "if False:", ["tests/unit/server/test_relay.py"]),
    Mutation("replies: a held reply counts against the payload memory budget",
             "src/atoll/server/relay.py",
             "if self._held_bytes + len(raw) <= small and self.relay.budget.take(len(raw)):",
             "if self._held_bytes + len(raw) <= small:", ["tests/unit/server/test_relay.py"]),
    Mutation("replies: a complete reply waits without an open file", "src/atoll/server/spool.py",
             "                self._own.seal()\n", "                pass\n",
             ["tests/unit/server/test_spool.py"]),
    Mutation("landing: a worker's registration job id checked", WORKER_ENDPOINT,
             '_checked(context, check_job_id, job_id, "the registration\'s job_id")', "pass",
             WORKER_ENDPOINT_TESTS),
    Mutation("landing: a worker's x-atoll-task header checked", WORKER_ENDPOINT,
             '_checked(context, check_task_id, task_id, "the x-atoll-task header")', "pass",
             WORKER_ENDPOINT_TESTS),
    Mutation("landing: a site's running_jobs checked by the server", BODIES,
             'return [check_job_id(j, f"{what}\'s running_jobs entry") for j in value]',
             "return list(value)", FEDERATION_TESTS),
    Mutation("landing: a site's job_state job id checked by the server", BODIES,
             'check_job_id(doc.get("job_id"), "job_state\'s job_id")', 'doc.get("job_id")',
             FEDERATION_TESTS),
    Mutation("landing: a site's reply task id checked by the server", FEDERATION,
             'await _checked_id(context, head.get("task_id"), check_task_id, "task_id")',
             "pass", FEDERATION_TESTS),
    Mutation("landing: a site's reply job id checked by the server", FEDERATION,
             "        await _checked_id(context, job_id)\n        await _checked_id(context, "
             "head.get", "        await _checked_id(context, head.get", FEDERATION_TESTS),
    Mutation("landing: a site's report job id checked by the server", BODIES,
             'return cls(check_job_id(doc.get("job_id"), "job_id"), event)',
             'return cls(doc.get("job_id"), event)', FEDERATION_TESTS),
    Mutation("launchers: the job id and participant checked before a render", LAUNCH_BASE,
             '        check_job_id(job_id, "the job id")\n        check_site_name(site, "the '
             'participant")\n', "        pass\n", RENDER_ID_TESTS),
    Mutation("launchers: the study checked before a render", LAUNCH_BASE,
             'check_study_name(identity.study, "the study")', "pass", RENDER_ID_TESTS),
    # -- the replay record (site/signed_jobs.py) -----------------------------------------------
    Mutation("replay: a statement that ran under another id refused", SIGNED_JOBS,
             'if known is not None and known.get("job_id") != job_id:', "if False:",
             SIGNED_JOBS_TESTS),
    Mutation("replay: a statement recorded once it ran", SIGNED_JOBS,
             "                self._write(jobs)\n", "                pass\n", SIGNED_JOBS_TESTS),
    Mutation("replay: a record not of its format refused", SIGNED_JOBS,
             'if not isinstance(doc, dict) or doc.get("format") != FORMAT or not isinstance(',
             'if not isinstance(doc, dict) or not isinstance(', SIGNED_JOBS_TESTS),
    Mutation("replay: a check without a statement refused", SIGNED_JOBS,
             "        if not statement_digest:\n", "        if False:\n", SIGNED_JOBS_TESTS),
    # -- the egress rule (fl/privacy/egress.py, site_privacy.py) --------------------------------
    Mutation("egress: metrics are named numbers", EGRESS,
             "        return UNKNOWN, f\"metrics {bad[:3]} are not named numbers\"",
             "        pass", CLASSIFY_TESTS),
    Mutation("egress: at most MAX_METRICS metrics", EGRESS,
             "if len(model.metrics) > MAX_METRICS:", "if False:", CLASSIFY_TESTS),
    Mutation("egress: logged metrics are named numbers", EGRESS,
             "        if why:\n            return UNKNOWN, why", "        if False:\n            "
             "return UNKNOWN, why", CLASSIFY_TESTS),
    Mutation("egress: no params beside a statistics answer", EGRESS,
             "        if model.params:\n            return UNKNOWN, \"params beside",
             "        if False:\n            return UNKNOWN, \"params beside", CLASSIFY_TESTS),
    Mutation("egress: statistics rules need a statistics answer", EGRESS,
             'if "statistics" not in meta:', "if False:", CLASSIFY_TESTS),
    Mutation("egress: only scalars beside a statistics answer", EGRESS,
             "if not all(_scalar(v) for v in rest.values()):", "if False:", CLASSIFY_TESTS),
    Mutation("egress: meta holds only scalars", EGRESS,
             "nested = sorted(str(k) for k, v in meta.items() if not _scalar(v))",
             "nested = []", CLASSIFY_TESTS),
    Mutation("egress: meta at most MAX_META_BYTES", EGRESS,
             "if len(json.dumps(meta, default=str)) > MAX_META_BYTES:", "if False:",
             CLASSIFY_TESTS),
    Mutation("egress: a site with a policy sends no reply it cannot classify", SITE_PRIVACY,
             "            if self.required:\n                raise PrivacyRefused(",
             "            if False:\n                raise PrivacyRefused(", EGRESS_TESTS),
    Mutation("egress: a reply's kind decided by its content, not by the task", SITE_PRIVACY,
             "        kind, why = egress.classify(model)\n",
             "        kind, why = (egress.UPDATE if topic == \"train\" else egress.METRICS), \"\"\n",
             EGRESS_TESTS),
    Mutation("egress: no example count under secure aggregation", SITE_PRIVACY,
             "num_examples=0 if self.secagg is not None else model.num_examples)",
             "num_examples=model.num_examples)", EGRESS_TESTS),
    # -- the site's privacy ledger (site/privacy_ledger.py, spec/budget_ledger.py) --------------
    Mutation("ledger: past the budget refused", BUDGET_LEDGER,
             "if budget is not None and total_eps > budget.epsilon:", "if False:", LEDGER_TESTS),
    Mutation("ledger: other jobs' spending counted", BUDGET_LEDGER,
             "total_eps = others_eps + after[0]", "total_eps = after[0]", LEDGER_TESTS),
    Mutation("ledger: a job's epsilon never goes down", BUDGET_LEDGER,
             "after = [max(before[0], float(epsilon)), max(before[1], float(delta))]",
             "after = [float(epsilon), float(delta)]", LEDGER_TESTS),
    Mutation("ledger: epsilon a finite number >= 0", BUDGET_LEDGER,
             "and math.isfinite(epsilon) and epsilon >= 0):", "):", LEDGER_TESTS),
    Mutation("ledger: delta at most the site's", BUDGET_LEDGER,
             "if budget is not None and delta > budget.delta:", "if False:", LEDGER_TESTS),
    Mutation("ledger: a malformed ledger refused", BUDGET_LEDGER,
             "if not isinstance(data, dict) or data.get(\"format_version\") != 1",
             "if not isinstance(data, dict)", LEDGER_TESTS),
    Mutation("ledger: an unreadable budget refused, never taken as none", PRIVACY_LEDGER,
             "                budget = budget_of(self.local_dir, study)\n            except SpecError as exc:",
             "                budget = budget_of(self.local_dir, study)\n            except SpecError:\n"
             "                budget = None\n            except ZeroDivisionError as exc:", LEDGER_TESTS),
    Mutation("ledger: the ledger written before the release", PRIVACY_LEDGER,
             "            write_atomic(self.path(study), json.dumps(ledger.to_json(), indent=1), "
             "PRIVATE)\n", "            pass\n", LEDGER_TESTS),
    Mutation("ledger: a study's name checked before it names a file", PRIVACY_LEDGER,
             "if not is_site_name(study):  # the study becomes a file name",
             "if False:  # the study becomes a file name", LEDGER_TESTS),
    # -- secure aggregation's site rules (fl/privacy/secagg/client.py, identity.py) ------------
    Mutation("secagg site: authenticated-peers", SECAGG_CLIENT,
             'self.identity.verify(site, k.get("cred"),', '(site, k.get("cred"),',
             SECAGG_CLIENT_TESTS),
    Mutation("secagg site: safe-threshold", SECAGG_CLIENT,
             "if threshold < least or threshold > len(peers):", "if threshold > len(peers):",
             SECAGG_CLIENT_TESTS),
    Mutation("secagg site: min-participants", SECAGG_CLIENT,
             "if self.min_participants is not None and count < self.min_participants:",
             "if False:", SECAGG_CLIENT_TESTS),
    Mutation("secagg site: participant-sets, at least the threshold", SECAGG_CLIENT,
             "        if count < threshold:\n", "        if False:\n", SECAGG_CLIENT_TESTS),
    Mutation("secagg site: participant-sets, the key list once a round", SECAGG_CLIENT,
             "        if state.peers:\n", "        if False:\n", SECAGG_CLIENT_TESTS),
    Mutation("secagg site: participant-sets, one train task a round", SECAGG_CLIENT,
             "        if state.masked_with is not None:\n", "        if False:\n",
             SECAGG_CLIENT_TESTS),
    Mutation("secagg site: participant-sets, the train task's sites shared keys", SECAGG_CLIENT,
             "if self.site not in sites or any(s not in state.peers for s in sites):",
             "if False:", SECAGG_CLIENT_TESTS),
    Mutation("secagg site: participant-sets, survivors and dropped are the masked sites",
             SECAGG_CLIENT, "if set(survivors) | set(dropped) != set(state.masked_with):",
             "if False:", SECAGG_CLIENT_TESTS),
    Mutation("secagg site: participant-sets, never counted as dropped", SECAGG_CLIENT,
             "        if self.site not in survivors:\n", "        if False:\n",
             SECAGG_CLIENT_TESTS),
    Mutation("secagg site: one-share-per-peer, never survivor and dropped", SECAGG_CLIENT,
             "if set(survivors) & set(dropped):", "if False:", SECAGG_CLIENT_TESTS),
    Mutation("secagg site: one-share-per-peer, a round unmasked once", SECAGG_CLIENT,
             "if round_ in self.unmasked:", "if False:", SECAGG_CLIENT_TESTS),
    Mutation("secagg site: consistent-lists, the unmask request is the checked one",
             SECAGG_CLIENT, "if (survivors, dropped) != state.signed:", "if False:",
             SECAGG_CLIENT_TESTS),
    Mutation("secagg site: consistent-lists, a check before the unmask", SECAGG_CLIENT,
             "        if state.signed is None:\n", "        if False:\n", SECAGG_CLIENT_TESTS),
    Mutation("secagg site: consistent-lists, every survivor's signature verified",
             SECAGG_CLIENT, "self.identity.verify(site, state.credentials[site], text, signature)",
             "pass", SECAGG_CLIENT_TESTS),
    Mutation("secagg site: consistent-lists, signatures of survivors only", SECAGG_CLIENT,
             "            if site not in survivors:\n", "            if False:\n",
             SECAGG_CLIENT_TESTS),
    Mutation("secagg identity: a credential issued by the project's CA", SECAGG_IDENTITY,
             "        cert.verify_directly_issued_by(ca)\n", "        pass\n",
             SECAGG_CLIENT_TESTS),
    Mutation("secagg identity: the credential's certificate is the site's", SECAGG_IDENTITY,
             'if kind != "site" or name != site:', "if False:", SECAGG_CLIENT_TESTS),
    Mutation("secagg identity: the site's certificate valid now", SECAGG_IDENTITY,
             "if not cert.not_valid_before_utc <= at <= cert.not_valid_after_utc:", "if False:",
             SECAGG_CLIENT_TESTS),
    Mutation("secagg identity: the credential signed by the site's key", SECAGG_IDENTITY,
             "        key.verify(signature, text, ec.ECDSA(hashes.SHA256()))\n",
             "        pass\n", SECAGG_CLIENT_TESTS),
    Mutation("secagg identity: the credential certifies this job's key", SECAGG_IDENTITY,
             "if len(public) != 32 or text != statement(job_id, site, public):",
             "if len(public) != 32:", SECAGG_CLIENT_TESTS),
    Mutation("secagg identity: one credential per site and job", SECAGG_IDENTITY,
             "            if known[0] != statement:", "            if False:",
             SECAGG_CLIENT_TESTS),
    # -- statistics (fl/statistics_release.py, statistics_guard.py, spec/statistics_rules.py) -
    Mutation("statistics: min_count suppression of a column", STATS_RELEASE,
             "    if count >= rules.min_count:\n        return None",
             "    if True:\n        return None", STATS_RELEASE_TESTS),
    Mutation("statistics: small cells suppressed", STATS_RELEASE,
             "hidden = [i for i, c in enumerate(counts) if 0 < c < min_count]", "hidden = []",
             STATS_RELEASE_TESTS),
    Mutation("statistics: a complementary cell suppressed", STATS_RELEASE,
             "            hidden.append(min(shown, key=lambda i: (counts[i], i)))",
             "            pass", STATS_RELEASE_TESTS),
    Mutation("statistics: every cell hidden when too few are", STATS_RELEASE,
             "            hidden = list(range(len(counts)))", "            pass",
             STATS_RELEASE_TESTS),
    Mutation("statistics: only the site's own grid", STATS_RELEASE,
             "if edges is not None and not same_edges(edges, grid_edges(first, cells, precision)):",
             "if False:", STATS_RELEASE_TESTS),
    Mutation("statistics: at most MAX_CELLS cells", STATS_RELEASE,
             "    if cells > MAX_CELLS:\n        return", "    if False:\n        return",
             STATS_RELEASE_TESTS),
    Mutation("statistics: values clipped to the bounds", STATS_RELEASE,
             "values = np.clip(values, *bounds)", "values = values", STATS_RELEASE_TESTS),
    Mutation("statistics: cells of the precision's grid", STATS_RELEASE,
             "return np.floor(values / precision + _SNAP).astype(np.int64)",
             "return np.floor(values + _SNAP).astype(np.int64)", STATS_RELEASE_TESTS),
    Mutation("statistics: at most max_queries answers", STATS_GUARD,
             "elif self.asked[task, column] >= rules.max_queries:", "elif False:",
             STATS_GUARD_TESTS),
    Mutation("statistics: a repeated question gets the same answer", STATS_GUARD,
             "            elif key in self.answers:\n                out[column] = self.answers[key]",
             "            elif False:\n                out[column] = self.answers[key]",
             STATS_GUARD_TESTS),
    Mutation("statistics: the rules frozen at the first question", STATS_GUARD,
             "elif rules.min_count != self.rules.min_count:", "elif False:", STATS_GUARD_TESTS),
    Mutation("statistics: a job only makes min_count stricter", STATS_GUARD,
             "and requested_min_count > rules.min_count):", "):", STATS_GUARD_TESTS),
    Mutation("statistics: each dp answer spends from the budget", STATS_GUARD,
             "                self.spend(KIND, self.spent + rules.dp.epsilon, 0.0)\n",
             "                pass\n", STATS_GUARD_TESTS),
    Mutation("statistics: a job's own budget when no ledger is wired", STATS_GUARD,
             "if epsilon > self.budget + 1e-12:", "if False:", STATS_GUARD_TESTS),
    Mutation("statistics rules: noise and dp exclusive", STATS_RULES,
             "if self.dp is not None and self.noise:", "if False:", STATS_RULES_TESTS),
    Mutation("statistics rules: one answer's epsilon within the budget", STATS_RULES,
             "if self.epsilon > self.budget:", "if False:", STATS_RULES_TESTS),
    Mutation("statistics rules: bounds are [low, high]", STATS_RULES,
             "or value[0] >= value[1]:", ":", STATS_RULES_TESTS),
    # -- revocation at every stage --------------------------------------------------------------
    Mutation("revoked signer: server, a revoked signer found", JOB_SIGNER,
             "    if entry is None:\n        return None", "    if True:\n        return None",
             REVOKED_SIGNERS_TESTS),
    Mutation("revoked signer: server, an unreadable signature refused", JOB_SIGNER,
             "        return (f\"the job's signature in the server's store cannot be read",
             "        return None and (f\"the job's signature in the server's store cannot be read",
             REVOKED_SIGNERS_TESTS),
    Mutation("revoked signer: server, a new list cancels waiting jobs of a revoked signer",
             SERVER_LIFECYCLE,
             "                    self._cancel(record.id, f\"cancelled: {why}\")\n"
             "                    ended.append(record.id)",
             "                    pass", REVOKED_SIGNERS_TESTS),
    Mutation("revoked signer: server, a new list aborts running jobs of a revoked signer",
             SERVER_LIFECYCLE,
             "                self.abort(live.id, f\"aborted: {why}\")\n"
             "                ended.append(live.id)",
             "                pass", REVOKED_SIGNERS_TESTS),
    Mutation("lifecycle: the job is RUNNING with its first running part, in one place",
             SERVER_LIFECYCLE, "        if live.record.state == \"DISPATCHED\":\n",
             "        if False:\n", ["tests/unit/server/test_lifecycle.py"]),
    Mutation("revoked signer: server, checked again at dispatch", SERVER_DISPATCH,
             "            why = self._revoked(folder / \"job\")",
             "            why = None", REVOKED_SIGNERS_TESTS),
    Mutation("revoked signer: server, checked again before the server worker starts",
             SERVER_WORKER_LAUNCH, "            why = self._revoked(live.folder / \"job\")",
             "            why = None", REVOKED_SIGNERS_TESTS),
    Mutation("revoked signer: server worker, the server worker checks the list it is given", WORKER_SIGNED,
             "revoked=lambda cert: revoked.get(cert.serial_number))",
             "revoked=lambda cert: None)", WORKER_SIGNED_TESTS),
    Mutation("revoked signer: server worker, a root CA needed", WORKER_SIGNED,
             'if not isinstance(trust, dict) or not isinstance(trust.get("ca"), str):',
             "if trust is None:", WORKER_SIGNED_TESTS),
    Mutation("revoked signer: site, checked again just before launch", SUPERVISOR,
             "            check_revoked(site, accepted.signed)  # with the newest list",
             "            pass  # with the newest list", SITE_REVOKED_TESTS),
    Mutation("revoked signer: site, a new list aborts the site's jobs of a revoked signer",
             SUPERVISOR,
             "                self.abort(job.job_id, f\"aborted by {self.kit.name}: {why}\")",
             "                pass", SITE_REVOKED_TESTS),
    Mutation("revoked signer: site, a list past its nextUpdate stops jobs", SITE_REVOCATION,
             "    if due.timestamp() > (time.time() if now is None else now):\n        return None",
             "    if True:\n        return None", STALE_TESTS),
    Mutation("revoked signer: site, a stale list refuses the site's jobs", SITE_CHECK,
             "    return revocation.stale()", "    return None", STALE_TESTS),
    Mutation("backup: a link or special file in a job folder is skipped, never followed",
             "src/atoll/server/backup.py",
             "            if not stat.S_ISREG(mode):\n                skipped += 1\n                continue\n",
             "", ["tests/unit/server/test_backup.py"]),
    Mutation("restore: a workspace with a job store of its own is not overwritten",
             "src/atoll/server/backup.py", "    if (workspace / DB).exists():",
             "    if False:", ["tests/unit/server/test_backup.py"]),
    Mutation("version policy: the server refuses a site of another version at connect",
             "src/atoll/server/federation_service.py",
             "if why := site_ops.hello_refusal(hello, __version__):",
             "if why := None:", ["tests/integration/federation/test_versions.py"], timeout=180),
    Mutation("forget: a site checks the job id before it names a folder", "src/atoll/site/app.py",
             "            job_id = check_job_id(job_id)\n", "            job_id = str(job_id)\n",
             ["tests/security/test_hostile_server_ids.py::"
              "test_job_ids_that_are_paths_or_commands_touch_nothing"], timeout=300),
    Mutation("retention: a running job's run folder is never removed", "src/atoll/site/retention.py",
             "if entry.name in keep or not entry.is_dir(follow_symlinks=False):",
             "if not entry.is_dir(follow_symlinks=False):", ["tests/unit/site/test_retention.py"]),
    Mutation("results home: a results folder that is a link is not written through",
             "src/atoll/wire/results_archive.py",
             "    if path.is_symlink():\n", "    if False:\n",
             ["tests/unit/wire/test_results_archive.py"]),
    Mutation("results home: the parent's own result files are not replaced",
             "src/atoll/wire/results_archive.py",
             "            if target.exists() or target.is_symlink():\n                continue",
             "            if False:\n                continue",
             ["tests/unit/wire/test_results_archive.py"]),
    Mutation("results home: the worker sends plain files only", "src/atoll/wire/results_archive.py",
             "if stat.S_ISREG(os.lstat(path).st_mode):", "if True:",
             ["tests/unit/wire/test_results_archive.py"]),
    # -- issue 40: a quantized payload from a peer is checked where it lands (fl/serde.py)
    Mutation("quantized exchange: a table's lo and step must be finite", QUANTIZATION,
             "        if not (np.isfinite(lo).all() and np.isfinite(step).all()):",
             "        if False:", QUANTIZATION_TESTS),
    Mutation("quantized exchange: a table's step must not be negative", QUANTIZATION,
             "        if (step < 0).any():", "        if False:", QUANTIZATION_TESTS),
    Mutation("quantized exchange: the tables come before every code", QUANTIZATION,
             "    if sorted(first) != sorted(n + SUFFIX for n in tensors):", "    if False:",
             QUANTIZATION_TESTS),
    Mutation("quantized exchange: each code tensor has a table of its blocks", QUANTIZATION,
             "        if companion is None or companion[0] != np.dtype(np.float32) or "
             "companion[1] != (", "        if companion is None and (", QUANTIZATION_TESTS),
    Mutation("quantized exchange: the tables a receiver reads whole are bounded", QUANTIZATION,
             "    if table_bytes > MAX_TABLE_BYTES:", "    if False:", QUANTIZATION_TESTS),
    Mutation("quantized exchange: the block size is bounded", QUANTIZATION,
             "            MIN_BLOCK <= block <= MAX_BLOCK):", "            block >= 1):",
             QUANTIZATION_TESTS),
    Mutation("provenance: an entry signed by another party than the one it names fails",
             "src/atoll/pki/provenance.py",
             "    if (signer.kind, signer.name) != (by_kind, by_name):\n",
             "    if False:\n",
             ["tests/unit/server/test_provenance_record.py::"
              "test_an_entry_the_server_signed_in_a_sites_name_fails_verification"]),
    Mutation("provenance: the server appends a site's entry only where it would verify",
             "src/atoll/server/provenance.py",
             "                    check_site_item(item, cert.encode(\"ascii\"), ",
             "                    (lambda *a: None)(item, cert.encode(\"ascii\"), ",
             ["tests/unit/server/test_provenance_record.py::"
              "test_a_site_entry_that_would_not_verify_is_left_out"]),
    Mutation("provenance: a round report's model digest is checked before it is stated",
             "src/atoll/server/provenance.py",
             "            and isinstance(digest, str) and ROUND_DIGEST.fullmatch(digest) is not None)",
             ")",
             ["tests/unit/server/test_provenance_record.py::"
              "test_each_round_is_stated_as_its_report_arrives_and_once"]),
    Mutation("provenance: a line a crash tore is cut before the chain goes on",
             "src/atoll/server/provenance.py",
             '        if data and not data.endswith(b"\\n"):\n', "        if False:\n",
             ["tests/unit/server/test_provenance_record.py::"
              "test_a_line_torn_by_a_crash_is_cut_and_the_chain_goes_on_whole"]),
    Mutation("checkpoint home: the state file's SHA-256 and size are checked before the parent "
             "keeps it", "src/atoll/wire/checkpoint_home.py",
             "if size != manifest.bytes or digest.hexdigest() != manifest.sha256:", "if False:",
             ["tests/unit/wire/test_checkpoint_home.py"]),
    Mutation("checkpoint home: nothing outside checkpoint/ and results/ is kept",
             "src/atoll/wire/checkpoint_home.py", "        if outside:\n", "        if False:\n",
             ["tests/unit/wire/test_checkpoint_home.py"]),
    Mutation("checkpoint home: checkpoint/ holds only the manifest and the file it names",
             "src/atoll/wire/checkpoint_home.py",
             'if extra or f"{CHECKPOINT}/{manifest.file}" not in by_name:',
             'if f"{CHECKPOINT}/{manifest.file}" not in by_name:',
             ["tests/unit/wire/test_checkpoint_home.py"]),
    Mutation("dashboard: a request without the cookie is refused", DASHBOARD,
             "        if not cookie:\n", "        if False:\n", DASHBOARD_TESTS),
    Mutation("dashboard: a wrong cookie is refused", DASHBOARD,
             "        if not self.keys.cookie_ok(cookie):", "        if False:", DASHBOARD_TESTS),
    Mutation("dashboard: the link's token works once", DASHBOARD,
             "if self.spent or not hmac.compare_digest", "if not hmac.compare_digest",
             DASHBOARD_TESTS),
    Mutation("dashboard: the cookie is HttpOnly", DASHBOARD, "httponly=True", "httponly=False",
             DASHBOARD_TESTS),
    Mutation("dashboard: a change must come from its own origin", DASHBOARD,
             '            if origin != f"http://{host}":', "            if False:",
             DASHBOARD_TESTS),
    Mutation("dashboard: a change must carry the page's CSRF token", DASHBOARD,
             "            if not self.keys.csrf_ok(", "            if False and not self.keys.csrf_ok(",
             DASHBOARD_TESTS),
    Mutation("dashboard: on the loopback, another Host is refused", DASHBOARD,
             'if not self.public and host.rsplit(":", 1)[0] not in LOOPBACK:',
             "if False:", DASHBOARD_TESTS),
]
