"""Which image a containerized worker runs, and where that choice was configured.

One precedence for every container launcher (Docker, Kubernetes):

1. the job's ``launcher_spec`` ``image``, only if the site allows it (site.yaml
   ``<launcher>.allow_job_images``: shell patterns such as ``registry.example.org/fl/*``);
   a job naming an image the site does not allow is refused, never silently swapped;
2. the study's ``container.image`` in ``local/study_runtime.yaml``;
3. the site's ``<launcher>.default_image`` in ``local/site.yaml``.

The ``source`` travels with the image so that an engine's "no such image" names the file and
field to fix.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Any

from atoll.launchers.base import LaunchError


@dataclass(frozen=True)
class ImageChoice:
    image: str
    # Where it was configured, e.g. "local/study_runtime.yaml studies.x.container.image".
    source: str


def choose_image(
    *,
    launcher: str,
    study: str,
    job_image: str | None,
    study_runtime: Any,
    default_image: str | None,
    allowed_job_images: Sequence[str],
) -> ImageChoice:
    """Apply the precedence above; LaunchError says what to configure when nothing applies."""
    study_image = (
        study_runtime.container.image if study_runtime and study_runtime.container else None
    )
    if job_image:
        if any(fnmatchcase(job_image, pattern) for pattern in allowed_job_images):
            return ImageChoice(job_image, f"the job's meta.json launcher_spec ({launcher}.image)")
        allowed = ", ".join(allowed_job_images) or "none"
        fallback = study_image or default_image
        instead = f" to use {fallback}" if fallback else ""
        raise LaunchError(
            f"the job asks for image {job_image} (meta.json launcher_spec {launcher}.image), but "
            f"this site does not allow it ({launcher}.allow_job_images in local/site.yaml: "
            f"{allowed}); remove image from the job{instead}, or ask the site operator to allow it"
        )
    if study_image:
        return ImageChoice(study_image, f"local/study_runtime.yaml studies.{study}.container.image")
    if default_image:
        return ImageChoice(default_image, f"local/site.yaml {launcher}.default_image")
    raise LaunchError(
        f"no image for study {study}: set studies.{study}.container.image in "
        f"local/study_runtime.yaml or {launcher}.default_image in local/site.yaml"
    )
