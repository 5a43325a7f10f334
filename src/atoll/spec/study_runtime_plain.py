"""``local/study_runtime.yaml`` as plain values, for a process-launcher site whose file the
models (spec/study_runtime.py) have already accepted, byte for byte.

A site reads the file again at every job's admission. Validating it takes pydantic and the spec
models, most of what a site parent's first job costs it. The check of ``local/``
(parent/local_config.py) validates the file with the models at the parent's start; when every
study entry has the common shape of a process-launcher site (datasets and env, nothing else) it
sends back the validated entries as these plain values, with the SHA-256 of the bytes it
validated, and the record of that check keeps both. At a job, ``admitted`` returns them only for
the very same bytes, after checking once more what depends on the host rather than on the file
(no dataset may be, hold or lie inside the site kit, links followed, as the models check it);
anything else is the models' to read again.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from atoll.spec.kit_paths import kit_bind_problem

RUNTIME_FILE = "study_runtime.yaml"
ABSENT = "absent"  # the digest of a site without the file (no study maps anything)
DATA_ROOT = "/data"


def dataset_mount_path(study: str, dataset: str) -> str:
    """Where a dataset appears inside a worker container: ``/data/<study>/<dataset>``."""
    return f"{DATA_ROOT}/{study}/{dataset}"


def data_root(study: str) -> str:
    return f"{DATA_ROOT}/{study}"


@dataclass(frozen=True)
class PlainDataset:
    source: str
    mode: str  # "ro" or "rw"
    fingerprint: str | None = None


@dataclass(frozen=True)
class PlainStudyEntry:
    """A study entry with only datasets and env (spec/study_runtime.py's StudyEntry reads
    alike: the other fields at their defaults)."""

    datasets: dict[str, PlainDataset] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    container: None = None
    secret_env: dict[str, Any] = field(default_factory=dict)
    secret_mounts: dict[str, Any] = field(default_factory=dict)
    docker_kwargs: dict[str, Any] = field(default_factory=dict)
    pod_template: None = None
    slurm: None = None
    statistics: None = None


@dataclass(frozen=True)
class PlainStudyRuntime:
    studies: dict[str, PlainStudyEntry]
    digest: str  # SHA-256 of the file's bytes the models accepted (ABSENT: no file)

    def entry(self, study: str) -> PlainStudyEntry | None:
        return self.studies.get(study)

    def values(self) -> dict[str, Any]:
        """The JSON document a record keeps."""
        return {"digest": self.digest, "studies": {
            name: {"datasets": {d: [ds.source, ds.mode, ds.fingerprint]
                                for d, ds in entry.datasets.items()},
                   "env": dict(entry.env)}
            for name, entry in self.studies.items()}}

    @classmethod
    def from_values(cls, doc: Any) -> PlainStudyRuntime | None:
        """What a record kept; None when it is not of this shape (the models read the file)."""
        try:
            studies = {}
            for name, entry in doc["studies"].items():
                datasets = {d: PlainDataset(*ds) for d, ds in entry["datasets"].items()
                            if len(ds) == 3}
                ok = (set(entry) == {"datasets", "env"} and isinstance(name, str)
                      and len(datasets) == len(entry["datasets"])
                      and all(isinstance(d, str) and isinstance(ds.source, str)
                              and ds.mode in ("ro", "rw")
                              and (ds.fingerprint is None or isinstance(ds.fingerprint, str))
                              for d, ds in datasets.items())
                      and all(isinstance(k, str) and isinstance(v, str)
                              for k, v in entry["env"].items()))
                if not ok:
                    return None
                studies[name] = PlainStudyEntry(datasets, dict(entry["env"]))
            digest = doc["digest"]
            if set(doc) != {"digest", "studies"} or not isinstance(digest, str):
                return None
        except (KeyError, TypeError, ValueError, AttributeError):
            return None
        return cls(studies, digest)


def file_digest(local_dir: Path, file: str) -> str | None:
    """SHA-256 of ``local_dir/file`` as it is now (ABSENT when there is none); None when it
    cannot be read (the models then say why)."""
    try:
        return hashlib.sha256((Path(local_dir) / file).read_bytes()).hexdigest()
    except FileNotFoundError:
        return ABSENT
    except OSError:
        return None


def plain_runtime(runtime: Any, launcher: str, digest: str | None) -> PlainStudyRuntime | None:
    """A StudyRuntime the models validated for these bytes as plain values; None where the
    site's launcher is not process, or an entry sets anything but datasets and env."""
    if launcher != "process" or digest is None:
        return None
    studies = {}
    for name, entry in runtime.studies.items():
        if entry.model_fields_set - {"datasets", "env"}:
            return None
        studies[name] = PlainStudyEntry(
            {d: PlainDataset(ds.source, ds.mode, ds.fingerprint)
             for d, ds in entry.datasets.items()},
            dict(entry.env))
    return PlainStudyRuntime(studies, digest)


def admitted(plain: PlainStudyRuntime | None, local_dir: Path,
             file: str = RUNTIME_FILE) -> PlainStudyRuntime | None:
    """``plain`` when the file still has the bytes it was made from and no dataset now lends
    the site kit (a link changed since); else None: the models read the file."""
    if plain is None or file_digest(local_dir, file) != plain.digest:
        return None
    kit = Path(local_dir).resolve().parent
    for entry in plain.studies.values():
        for dataset in entry.datasets.values():
            if kit_bind_problem(Path(dataset.source).resolve(), kit) is not None:
                return None
    return plain
