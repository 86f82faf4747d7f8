"""Payload file paths confined to the job's own workspace's media folder.

Layout: every workspace has its own folder `MEDIA_ROOT/<workspace id>/` (the id as the
`workspaces.id` UUID is written, lower case with hyphens). Audio, SRT, log and programme paths
in a payload are relative to that folder (or absolute inside it); a job never reads a file of
another workspace, nor anything else under MEDIA_ROOT."""

from __future__ import annotations

from pathlib import Path
from uuid import UUID

from sidelinja_worker.queue.errors import PermanentError


def workspace_media_root(media_root: str, workspace_id: UUID) -> Path:
    """The workspace's own folder, resolved. Missing, it is a permanent error: the payload's
    files cannot be there. It must be a folder of its own, not a symlink: one to another
    workspace's folder (or to MEDIA_ROOT itself, or anywhere else) would hand this workspace's
    jobs every file there."""
    root = Path(media_root).resolve()
    if not root.is_dir():
        raise PermanentError("MEDIA_ROOT is not an existing folder")
    own = root / str(workspace_id)
    try:
        folder = own.resolve()
    except (OSError, RuntimeError) as exc:  # a symlink loop (RuntimeError on Python 3.11)
        raise PermanentError(
            f"this workspace's media folder (MEDIA_ROOT/{workspace_id}) cannot be resolved: {exc}"
        ) from None
    if folder != own:
        raise PermanentError(
            f"this workspace's media folder (MEDIA_ROOT/{workspace_id}) is a symlink, refused:"
            " it must be a folder of its own"
        )
    if not folder.is_dir():
        raise PermanentError(f"this workspace has no media folder (MEDIA_ROOT/{workspace_id})")
    return folder


def resolve_media_path(media_root: str, workspace_id: UUID, path: str) -> Path:
    """The existing regular file `path` names, relative to the workspace's media folder (or
    absolute inside it). `..`, an absolute path elsewhere (another workspace's folder included)
    and a symlink leading out are refused: the resolved target must lie under the resolved
    folder. Every refusal is permanent: the payload will not change."""
    root = workspace_media_root(media_root, workspace_id)
    try:
        target = (root / path).resolve()  # an absolute `path` replaces root here, then is checked
    # A NUL byte; a symlink loop (RuntimeError on Python 3.11, OSError later): the same on
    # every attempt.
    except (OSError, ValueError, RuntimeError) as exc:
        raise PermanentError(f"path {path!r} cannot be resolved: {exc}") from None
    if not target.is_relative_to(root):
        raise PermanentError(
            f"path {path!r} is outside this workspace's media folder (MEDIA_ROOT/{workspace_id})"
        )
    if not target.is_file():
        raise PermanentError(
            f"file {path!r} not found in this workspace's media folder (MEDIA_ROOT/{workspace_id})"
        )
    return target
