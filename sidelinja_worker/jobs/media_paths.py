"""Payload file paths confined to MEDIA_ROOT: a payload can name a file there and nowhere else."""

from __future__ import annotations

from pathlib import Path

from sidelinja_worker.queue.errors import PermanentError


def resolve_media_path(media_root: str, path: str) -> Path:
    """The existing regular file `path` names, relative to `media_root` (or absolute inside it).
    `..`, an absolute path elsewhere and a symlink leading out are refused: the resolved target
    must lie under the resolved root. Every refusal is permanent: the payload will not change."""
    root = Path(media_root).resolve()
    if not root.is_dir():
        raise PermanentError("MEDIA_ROOT is not an existing folder")
    try:
        target = (root / path).resolve()  # an absolute `path` replaces root here, then is checked
    except (OSError, ValueError) as exc:  # a NUL byte, a symlink loop
        raise PermanentError(f"path {path!r} cannot be resolved: {exc}") from None
    if not target.is_relative_to(root):
        raise PermanentError(f"path {path!r} is outside MEDIA_ROOT")
    if not target.is_file():
        raise PermanentError(f"file {path!r} not found under MEDIA_ROOT")
    return target
