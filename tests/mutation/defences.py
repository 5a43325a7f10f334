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
PKI_FILES = "src/atoll/pki/files.py"
PKI_FILES_TESTS = ["tests/unit/pki/test_files.py"]
ARCHIVE = "src/atoll/wire/job_archive.py"
ARCHIVE_TESTS = ["tests/unit/wire/test_job_archive.py"]
SIGNATURE = "src/atoll/pki/job_signature.py"
SIGNATURE_TESTS = ["tests/unit/pki/test_job_signature.py"]
SITE_CHECK = "src/atoll/site/job_check.py"
SITE_CHECK_TESTS = ["tests/unit/site/test_job_check.py"]
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
PRIVACY = "src/atoll/spec/privacy.py"
PRIVACY_TESTS = ["tests/unit/fl/privacy/test_site_policy.py"]
FILTERS = "src/atoll/fl/privacy/filters.py"
FILTERS_TESTS = ["tests/unit/fl/privacy/test_filters.py"]
STUDIES = "src/atoll/server/studies.py"
STUDY_OPS = "src/atoll/server/study_ops.py"
SCHEDULER = "src/atoll/server/scheduler.py"
STUDY_TESTS = ["tests/unit/server/test_study_checks.py"]
GUARD = "src/atoll/wire/guard.py"
GUARD_TESTS = ["tests/unit/wire/test_guard.py"]
SERVER_INTAKE = "src/atoll/server/jobs.py"
JOB_SIGNING = "src/atoll/server/job_signing.py"
FL_CHECK = "src/atoll/fl/job_check.py"
FL_CHECK_TESTS = ["tests/unit/fl/test_job_check.py::test_min_clients_and_sites_against_the_study"]


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
    # -- private files (pki/files.py) ----------------------------------------------------------
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
    # -- the server's intake (server/jobs.py, server/job_signing.py) ---------------------------
    Mutation("server intake: only sites of the study", SERVER_INTAKE,
             'if target != "server" and target not in study_sites:', "if False:",
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
    Mutation("job check: deploy_map names only the study's sites", FL_CHECK,
             "if target not in (SERVER, ALL_SITES) and target not in study_sites:", "if False:",
             FL_CHECK_TESTS),
    Mutation("job check: mandatory sites in the study", FL_CHECK,
             "    for i, site in enumerate(meta.mandatory_clients):\n        if site not in "
             "study_sites:", "    for i, site in enumerate(meta.mandatory_clients):\n        if "
             "False:", FL_CHECK_TESTS),
    Mutation("job check: min_clients reachable in the study", FL_CHECK,
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
    # -- a site's checks of a fetched job (site/job_check.py) ----------------------------------
    Mutation("site check: bound to the project and the study it came in", SITE_CHECK,
             "        bind(signed, kit.project, study)\n", "", ["tests/unit/site/test_job_check.py::test_the_server_cannot_name_another_submitter_or_study"]),
    Mutation("site check: the app's files as signed", SITE_CHECK,
             'scope=lambda path: path.split("/", 1)[0] in (app, META_FILE))',
             "scope=lambda path: path == META_FILE)", ["tests/unit/site/test_job_check.py::test_a_job_changed_in_the_servers_store_is_refused"]),
    Mutation("site check: the dispatched meta is the signed one", SITE_CHECK,
             "        _check_dispatch(body, meta, signed, dispatched)\n", "", ["tests/unit/site/test_job_check.py::test_a_dispatch_whose_meta_differs_from_the_signed_one_is_refused"]),
    Mutation("site check: the authorization policy", SITE_CHECK,
             "        if not decision.allowed:", "        if False:", ["tests/unit/site/test_job_check.py::test_a_policy_that_denies_the_role_names_its_rule"]),
    Mutation("site check: code approval", SITE_CHECK, "    if not approved:", "    if False:",
             ["tests/unit/site/test_job_check.py::test_code_approval_runs_only_approved_content"]),
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
    Mutation("auth: a revoked certificate refused on every call", AUTH,
             "if (revoked := revocation.refusal(pems[0])) is not None:", "if False:",
             SERVER_REVOCATION_TESTS),
    Mutation("site check: a revoked signer refused", SITE_CHECK, "    if reason:\n",
             "    if False:\n", ["tests/unit/site/test_job_check.py::test_a_signer_on_the_sites_revocation_list_is_refused"]),
    # -- secure aggregation's server side (fl/privacy/secagg/server.py) ------------------------
    Mutation("secagg: an unmasked result refused", SECAGG,
             "if any(dtype != np.uint64 for dtype, _ in entries.values()) or \\\n"
             "                masking.WEIGHT not in entries:", "if False:", SECAGG_TESTS),
    Mutation("secagg: a result of other names or shapes refused", SECAGG,
             "elif {n: s for n, (_, s) in entries.items()} != "
             "{n: a.shape for n, a in self._sum.items()}:", "elif False:", SECAGG_TESTS),
    Mutation("secagg: a reply without the step's keys refused", SECAGG,
             "            if not expected <= set(meta):", "            if False:",
             ["tests/unit/fl/privacy/test_secure_aggregation.py::"
              "test_a_site_without_secure_aggregation_in_its_app_is_rejected_naming_why"]),
    Mutation("secagg: a step with fewer answers than needed refused", SECAGG,
             "        if len(answers) < need:", "        if False:",
             ["tests/unit/fl/privacy/test_secure_aggregation.py::"
              "test_a_site_without_secure_aggregation_in_its_app_is_rejected_naming_why"]),
    Mutation("secagg: a threshold above the sites refused", SECAGG,
             "        if self.threshold > len(self.keys):", "        if False:", SECAGG_TESTS),
    Mutation("secagg: too few shares to rebuild a secret refused", SECAGG,
             "            if len(shares) < self.threshold:", "            if False:",
             SECAGG_TESTS),
    Mutation("secagg: a dropped site's mask key must rebuild", SECAGG,
             '            if crypto.public_of(private) != self.keys[gone]["s"]:',
             "            if False:", SECAGG_TESTS),
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
             "sites = [t for t in targets if t in study_sites]", "sites = targets", STUDY_TESTS),
    Mutation("scheduler: a mandatory site outside the study refused at intake", SCHEDULER,
             "for site in meta.mandatory_clients if site not in study_sites]",
             "for site in meta.mandatory_clients if False]", STUDY_TESTS),
    # -- hostile peers (wire/guard.py) ---------------------------------------------------------
    Mutation("guard: a deadline on every read", GUARD, "async with asyncio.timeout(timeout):",
             "async with asyncio.timeout(None):", GUARD_TESTS, timeout=10),
    Mutation("guard: the next messages' own deadline", GUARD,
             "timeout = self.deadlines.first_s if first else self.deadlines.next_s",
             "timeout = self.deadlines.first_s", GUARD_TESTS, timeout=10),
    Mutation("guard: a message decoded as its type", GUARD, "return cls.FromString(raw)",
             "return raw", GUARD_TESTS),
]
