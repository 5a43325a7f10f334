"""The Python admin API: the same verbs as the CLI, over one mutual-TLS channel.

    from atoll import Session
    with Session("kits/admin@org", study="pathology") as s:
        job = s.submit("jobs/fedavg", wait=True)
        s.download(job["job_id"], "results/")
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc

from atoll.admin.errors import AtollError, Refused, from_rpc_error
from atoll.pki.kit import Kit, load_kit
from atoll.pki.tls import channel_credentials
from atoll.wire import frames, rpc
from atoll.wire import messages as msg
from atoll.wire.grpc_setup import secure_channel

TERMINAL = ("FINISHED:COMPLETED", "FINISHED:FAILED", "FINISHED:ABORTED")
# A job folder this large is checked here before it is uploaded; a smaller one goes straight up
# and the server checks it (it always does, and names every problem alike). Checking here costs
# the command about 0.3 s of CPU (pydantic and the spec models).
CHECK_BEFORE_UPLOAD = 4 * 1024 * 1024


class Session:
    def __init__(self, kit: str | Path | Kit, study: str | None = None, token: str | None = None,
                 timeout: float = 30.0):
        self.kit = kit if isinstance(kit, Kit) else load_kit(kit)
        if self.kit.kind != "admin":
            raise Refused(f"{self.kit.kit_dir} is a {self.kit.kind} kit; use an admin's kit")
        self.timeout = timeout
        self.channel = secure_channel(self.kit.server_address, channel_credentials(self.kit), None)
        self.stub = rpc.stub(self.channel, "Admin")
        self.token = token
        self.study = study
        if study is not None and token is None:
            self.login(study)

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self.channel.close()

    def _metadata(self) -> tuple:
        return (("x-atoll-session", self.token),) if self.token else ()

    def call(self, op: str, study: str | None = None, **body: Any) -> dict[str, Any]:
        return self._call(op, study, body, self.timeout)

    def _call(self, op: str, study: str | None, body: dict[str, Any],
              timeout: float) -> dict[str, Any]:
        body = {"op": op, **body}
        if study:
            body["study"] = study
        try:
            answer = self.stub.Call(msg.Json(body=json.dumps(body)), metadata=self._metadata(),
                                    timeout=timeout)
        except grpc.RpcError as exc:
            raise from_rpc_error(exc, self.kit.server_address) from None
        return json.loads(answer.body)

    # -- verbs ------------------------------------------------------------------------------------
    def login(self, study: str) -> dict[str, Any]:
        self.token = None
        answer = self.call("login", study=study)
        self.token, self.study = answer["token"], answer["study"]
        return answer

    def whoami(self) -> dict[str, Any]:
        return self.call("whoami")

    def list_jobs(self, study: str | None = None) -> list[dict[str, Any]]:
        return self.call("list_jobs", study=study)["jobs"]

    def status(self, job_id: str, study: str | None = None, since: int | None = None,
               wait_s: float = 0.0) -> dict[str, Any]:
        """A job's status; with `since` (an earlier answer's version) it waits up to wait_s
        for a change first."""
        if since is None:
            return self.call("job_status", study=study, job_id=job_id)
        # The server may hold the call wait_s: its deadline is that plus the usual timeout.
        return self._call("job_status", study, {"job_id": job_id, "since": since,
                                                "wait_s": wait_s}, self.timeout + wait_s)

    def logs(self, job_id: str, study: str | None = None) -> dict[str, Any]:
        return self.call("job_logs", study=study, job_id=job_id)

    def abort(self, job_id: str, study: str | None = None) -> dict[str, Any]:
        return self.call("abort_job", study=study, job_id=job_id)

    def delete(self, job_id: str, study: str | None = None) -> dict[str, Any]:
        """Delete a finished job with its results (audited)."""
        return self.call("delete_job", study=study, job_id=job_id)

    def sites(self, study: str | None = None) -> dict[str, Any]:
        return self.call("list_sites", study=study)

    def submit(self, job_dir: str | Path, study: str | None = None, wait: bool = False,
               timeout: float | None = None,
               on_update: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
        import tempfile

        from atoll.pki.job_signature import SignatureError, sign_archive
        from atoll.wire.job_archive import IntakeError, zip_folder

        job_dir = Path(job_dir)
        if not job_dir.is_dir():
            raise Refused(f"{job_dir} is not a job folder (a folder with meta.json at its top)")
        if _folder_bytes(job_dir, CHECK_BEFORE_UPLOAD) >= CHECK_BEFORE_UPLOAD:
            from atoll.spec.meta import load_meta  # pydantic: only for a long upload

            load_meta(job_dir)  # fail here, with every issue, before a long upload
        with tempfile.TemporaryDirectory() as tmp:
            try:
                archive = zip_folder(job_dir, Path(tmp) / "job.zip")
                # signed with this user's own key for the study it goes to: the server and
                # every site check that nobody changed it on the way (docs/security.md)
                sign_archive(archive, self.kit, study or self.study or self.whoami()["study"])
            except (IntakeError, SignatureError) as exc:
                raise Refused(str(exc)) from None
            head = {"study": study} if study else {}
            try:
                answer = self.stub.Submit(
                    frames.payload_frames(head, frames.file_chunks(archive)),
                    metadata=self._metadata(), timeout=max(self.timeout, 600))
            except grpc.RpcError as exc:
                raise from_rpc_error(exc, self.kit.server_address) from None
        job = json.loads(answer.body)
        return self.wait(job["job_id"], study, timeout, on_update) if wait else job

    def wait(self, job_id: str, study: str | None = None, timeout: float | None = None,
             on_update: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
        """Follow a job until it ends; the server answers as soon as anything changes."""
        deadline = None if timeout is None else time.monotonic() + timeout
        status = self.status(job_id, study)
        while True:
            if on_update is not None:
                on_update(status)
            if status["state"] in TERMINAL:
                return status
            left = 10.0 if deadline is None else deadline - time.monotonic()
            if left <= 0:
                raise AtollError(f"job {job_id} still {status['state']} after {timeout} s")
            status = self.status(job_id, study, since=status["version"], wait_s=min(left, 10.0))

    def download(self, job_id: str, destination: str | Path, study: str | None = None) -> Path:
        import zipfile  # here, not at the top: every CLI call imports this module

        destination = Path(destination)
        destination.mkdir(parents=True, exist_ok=True)
        archive = self.download_archive(job_id, destination / f"{job_id}.zip", study)
        out = destination / job_id
        with zipfile.ZipFile(archive) as zf:
            for info in zf.infolist():  # our own archive, still checked: no entry leaves `out`
                target = (out / info.filename).resolve()
                if not target.is_relative_to(out.resolve()):
                    raise AtollError(f"download contains an unsafe path {info.filename!r}")
            zf.extractall(out)
        archive.unlink()
        return out

    def download_archive(self, job_id: str, archive: str | Path,
                         study: str | None = None) -> Path:
        """The job's results as the server sends them: one zip, written to ``archive`` and not
        unpacked (the dashboard hands it to the browser as it is)."""
        archive = Path(archive)
        body = {"job_id": job_id, **({"study": study} if study else {})}
        try:
            stream = self.stub.Download(msg.Json(body=json.dumps(body)), metadata=self._metadata(),
                                        timeout=max(self.timeout, 600))
            _, chunks = frames.split(iter(stream))
            frames.write_chunks(chunks, archive)
        except grpc.RpcError as exc:
            raise from_rpc_error(exc, self.kit.server_address) from None
        return archive

    def provenance(self, job_id: str, out: str | Path, study: str | None = None) -> Path:
        """The job's provenance record (docs/provenance.md), written to ``out``: it comes with
        the job's results, fetched into a scratch folder that is gone afterwards."""
        import shutil
        import tempfile

        out = Path(out)
        with tempfile.TemporaryDirectory() as tmp:
            record = self.download(job_id, tmp, study) / "provenance.json"
            if not record.is_file():
                raise AtollError(f"the server sent no provenance record for job {job_id} (a "
                                 "job taken in before the server kept them has none)")
            shutil.copyfile(record, out)
        return out


def _folder_bytes(folder: Path, enough: int) -> int:
    """The size of the files under ``folder``, counted until it reaches ``enough``."""
    import os

    total = 0
    for root, _, files in os.walk(folder):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                continue
            if total >= enough:
                return total
    return total
