"""Job uploads built in memory, damaged on purpose, and sent through the real Admin API."""

from __future__ import annotations

import io
import json
import zipfile
from typing import Any

import grpc

from atoll.admin.session import Session
from atoll.wire import frames

LOCAL, CENTRAL = b"PK\x03\x04", b"PK\x01\x02"
# Offsets in a local file header and a central directory record (APPNOTE 4.3.7, 4.3.12).
FLAGS = {LOCAL: 6, CENTRAL: 8}
FILE_SIZE = {LOCAL: 22, CENTRAL: 24}
NAME_LEN = {LOCAL: 26, CENTRAL: 28}
NAME_AT = {LOCAL: 30, CENTRAL: 46}

META = {"name": "intake", "deploy_map": {"app": ["server", "site-1"]}}


def zip_bytes(entries: dict[str, bytes | None], deflate: bool = True) -> bytes:
    """A zip of ``entries`` in order; a value of None makes a folder entry."""
    buffer = io.BytesIO()
    method = zipfile.ZIP_DEFLATED if deflate else zipfile.ZIP_STORED
    with zipfile.ZipFile(buffer, "w", compression=method) as zf:
        for name, data in entries.items():
            if data is None:
                info = zipfile.ZipInfo(name if name.endswith("/") else name + "/")
                info.external_attr = 0o40755 << 16
                zf.writestr(info, b"")
            else:
                zf.writestr(zipfile.ZipInfo(name), data, compress_type=method)
    return buffer.getvalue()


def job_zip(meta: Any = None, extra: dict[str, bytes | None] | None = None,
            raw_meta: bytes | None = None) -> bytes:
    """A job: meta.json (``raw_meta`` as is, else ``meta`` as JSON), an app, more entries."""
    data = raw_meta if raw_meta is not None else json.dumps(META if meta is None else meta).encode()
    return zip_bytes({"meta.json": data, "app/app.yaml": b"server: {}\n", **(extra or {})})


def _records(data: bytes | bytearray):
    """(kind, offset) of each local header and central record, walked by their lengths."""
    pos = 0
    while pos + 4 <= len(data):
        sig = bytes(data[pos:pos + 4])
        if sig not in (LOCAL, CENTRAL):
            pos = data.find(CENTRAL, pos + 1)
            if pos < 0:
                return
            continue
        yield sig, pos
        name_len = int.from_bytes(data[pos + NAME_LEN[sig]:pos + NAME_LEN[sig] + 2], "little")
        extra = int.from_bytes(data[pos + NAME_LEN[sig] + 2:pos + NAME_LEN[sig] + 4], "little")
        if sig == LOCAL:
            size = int.from_bytes(data[pos + 18:pos + 22], "little")
            pos += NAME_AT[sig] + name_len + extra + size
        else:
            comment = int.from_bytes(data[pos + 32:pos + 34], "little")
            pos += NAME_AT[sig] + name_len + extra + comment


def patch(data: bytes, name: str, *, file_size: int | None = None, flags: int = 0,
          new_name: bytes | None = None) -> bytes:
    """Change entry ``name`` in both its local header and its central record: declare another
    uncompressed size, set flag bits, or swap its name for bytes of the same length."""
    out = bytearray(data)
    for sig, pos in list(_records(out)):
        at = pos + NAME_AT[sig]
        length = int.from_bytes(out[pos + NAME_LEN[sig]:pos + NAME_LEN[sig] + 2], "little")
        if bytes(out[at:at + length]) != name.encode():
            continue
        if file_size is not None:
            out[pos + FILE_SIZE[sig]:pos + FILE_SIZE[sig] + 4] = file_size.to_bytes(4, "little")
        flag_at = pos + FLAGS[sig]
        value = int.from_bytes(out[flag_at:flag_at + 2], "little") | flags
        out[flag_at:flag_at + 2] = value.to_bytes(2, "little")
        if new_name is not None:
            assert len(new_name) == length
            out[at:at + length] = new_name
    return bytes(out)


def signed(data: bytes, session: Session, study: str = "default") -> bytes:
    """``data`` signed with the session user's key as `atoll job submit` signs a job; as it
    is when it cannot be (not a zip, say): the server's intake then refuses it for that."""
    import tempfile
    from pathlib import Path

    from atoll.pki.job_signature import sign_archive

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "job.zip"
        path.write_bytes(data)
        try:
            sign_archive(path, session.kit, study)
        except Exception:  # noqa: BLE001 - any archive the signer cannot read goes as it is
            return data
        return path.read_bytes()


def submit(session: Session, data: bytes, head: dict[str, Any] | None = None,
           timeout: float = 60) -> tuple[grpc.StatusCode, str]:
    """Send an upload as the session's user; (status code, details), OK with the answer."""
    try:
        answer = session.stub.Submit(frames.payload_frames(head or {}, [data]),
                                     metadata=session._metadata(), timeout=timeout)
    except grpc.RpcError as exc:
        return exc.code(), exc.details() or ""
    return grpc.StatusCode.OK, answer.body
