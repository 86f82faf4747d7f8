"""Forgejo contents API: read a file; create or update one in one commit."""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import quote

import httpx
import msgspec

from sidelinja_worker.queue.config import Secret, ServiceConfig
from sidelinja_worker.queue.errors import PermanentError, RetryJob
from sidelinja_worker.services import bounded
from sidelinja_worker.services.classify import (
    detail,
    is_transient,
    permanent_status,
    transient_status,
    transport_failure,
)

SERVICE = "Forgejo"
TIMEOUT = httpx.Timeout(30.0, connect=10.0)
DEADLINE_S = 120.0  # a whole exchange, however slowly the bytes come
# A file's JSON carries its content in base64 (4/3 of its size): room for a 20 MB SRT.
MAX_ANSWER_BYTES = 32 * 1024 * 1024
# A 409 means the file changed between our read and our write: read again, a few times at most.
MAX_CONFLICT_ROUNDS = 3


@dataclass(frozen=True)
class RepoFile:
    """A file in a repository; `ref` is the branch to write to, or any branch/tag/sha to read."""

    owner: str
    repo: str
    path: str
    ref: str | None = None


@dataclass(frozen=True)
class FileState:
    sha: str  # the blob sha, needed to update the file
    content: bytes
    last_commit_sha: str | None


@dataclass(frozen=True)
class Commit:
    action: str  # "created" | "updated" | "unchanged"
    blob_sha: str
    commit_sha: str | None


class Forgejo:
    @classmethod
    def from_config(cls, http: httpx.AsyncClient, config: ServiceConfig) -> Forgejo:
        """From FORGEJO_URL and FORGEJO_TOKEN; a missing one fails the job naming it."""
        return cls(http, config.require("FORGEJO_URL"), config.secret("FORGEJO_TOKEN"))

    def __init__(self, http: httpx.AsyncClient, base_url: str, token: Secret) -> None:
        base = base_url.rstrip("/")
        self._api = base if base.endswith("/api/v1") else base + "/api/v1"
        self._http = http
        self._token = token

    async def read(self, file: RepoFile) -> FileState | None:
        """The file's content and sha; None when it does not exist (404)."""
        params = {"ref": file.ref} if file.ref else None
        response = await self._call("GET", self._contents_url(file), params=params)
        if response.status_code == 404:
            return None
        self._check(response)
        return await _read_answer(_file_state, response, file.path)

    async def write(self, file: RepoFile, content: bytes, message: str) -> Commit:
        """Creates the file (POST) or updates it with the current sha (PUT). Writing what is
        already there makes no commit, so a re-run job does not pile up empty commits."""
        for _ in range(MAX_CONFLICT_ROUNDS):
            current = await self.read(file)
            if current is not None and current.content == content:
                return Commit("unchanged", current.sha, current.last_commit_sha)
            body = self._body(file, content, message, current)
            response = await self._call(
                "POST" if current is None else "PUT", self._contents_url(file), json=body
            )
            if response.status_code in (200, 201):
                action = "created" if current is None else "updated"
                return await _read_answer(_commit, response, action)
            if not self._lost_race(response, created=current is None):
                self._check(response)
        raise RetryJob(
            f"{SERVICE}: {file.path} kept changing while we wrote it "
            f"({MAX_CONFLICT_ROUNDS} conflicts in a row)"
        )

    def _body(
        self, file: RepoFile, content: bytes, message: str, current: FileState | None
    ) -> dict[str, Any]:
        body: dict[str, Any] = {"content": base64.b64encode(content).decode(), "message": message}
        if file.ref:
            body["branch"] = file.ref
        if current is not None:
            body["sha"] = current.sha
        return body

    def _lost_race(self, response: httpx.Response, *, created: bool) -> bool:
        """409: stale sha. 422 on a create: someone created the file since our read."""
        if response.status_code == 409:
            return True
        return (
            created
            and response.status_code == 422
            and "exist" in detail(response, ("message",)).lower()
        )

    def _contents_url(self, file: RepoFile) -> str:
        """The file's URL in the contents API; a name or path that could leave the repository
        is refused for good (the payload models refuse it first, before anything is paid)."""
        try:
            owner, repo = check_repo_name(file.owner), check_repo_name(file.repo)
            path = check_repo_path(file.path)
        except ValueError as exc:
            raise PermanentError(
                f"Forgejo file {file.owner}/{file.repo}:{file.path}: {exc}"
            ) from None
        return f"{self._api}/repos/{owner}/{repo}/contents/{quote(path)}"

    async def _call(self, method: str, url: str, **kwargs: Any) -> httpx.Response:
        headers = {"Authorization": f"token {self._token.reveal()}", "Accept": "application/json"}
        try:
            return await bounded.send(
                self._http,
                method,
                url,
                service=SERVICE,
                max_bytes=MAX_ANSWER_BYTES,
                deadline_s=DEADLINE_S,
                headers=headers,
                timeout=TIMEOUT,
                **kwargs,
            )
        except httpx.TransportError as exc:
            raise transport_failure(SERVICE, exc) from None

    def _check(self, response: httpx.Response) -> None:
        """Nothing for a success; else the outcome the status means."""
        status = response.status_code
        if status < 300:
            return
        message = detail(response, ("message",), [self._token.reveal()])
        if is_transient(status):
            raise transient_status(SERVICE, response, message)
        if status == 401:
            raise PermanentError(
                f"{SERVICE} refused the token (401: {message}): check FORGEJO_TOKEN"
            )
        raise permanent_status(SERVICE, response, message)  # 403 404 409 413 422 423 ...


T = TypeVar("T")


async def _read_answer(read: Callable[[bytes, str], T], response: httpx.Response, arg: str) -> T:
    """`read(body, arg)`, in a thread when the body is big (a file's base64, or anything a
    server sends up to MAX_ANSWER_BYTES); a body that is not JSON retries."""
    try:
        return await bounded.off_loop(read, response.content, arg)
    except ValueError:
        raise RetryJob(
            f"{SERVICE} answered {response.status_code} with a body that is not JSON"
        ) from None


def _file_state(body: bytes, path: str) -> FileState:
    """The file in a contents answer; its other fields are skipped unread."""
    found = bounded.fields(body, ("type", "encoding", "content", "sha", "last_commit_sha"))
    if found is None or bounded.field_text(found["type"]) != "file":
        raise PermanentError(f"{SERVICE}: {path} is not a file")
    if bounded.field_text(found["encoding"]) != "base64" or bounded.is_absent(found["content"]):
        raise PermanentError(f"{SERVICE}: {path} came without base64 content (too large?)")
    encoded = bounded.field_text(found["content"])
    try:
        if encoded is None:  # a number, a list: b64decode takes a str or bytes only
            raise ValueError("content is not a string")
        content = base64.b64decode(encoded)
    except (binascii.Error, ValueError):
        raise PermanentError(f"{SERVICE}: {path} has content that is not base64") from None
    sha = bounded.field_text(found["sha"])
    if sha is None:
        raise PermanentError(f"{SERVICE}: {path} came without its sha")
    return FileState(sha, content, bounded.field_text(found["last_commit_sha"]))


def _commit(body: bytes, action: str) -> Commit:
    """The blob and commit sha of a write's answer; an answer without the blob's sha is not
    Forgejo's (the file may or may not be written: the next attempt reads it again)."""
    found = bounded.fields(body, ("content", "commit"))
    sha = _sha_in(found["content"]) if found is not None else None
    if found is None or sha is None:
        raise RetryJob(f"{SERVICE} answered a write without the file's sha")
    return Commit(action, sha, _sha_in(found["commit"]))


def _sha_in(raw: msgspec.Raw) -> str | None:
    """The `sha` of an object given as raw JSON; None when it is no object or has no string."""
    try:
        found = bounded.fields(raw, ("sha",))
    except ValueError:
        return None
    return bounded.field_text(found["sha"]) if found is not None else None


# A Forgejo owner or repository name, as Forgejo itself allows them: ASCII letters, digits,
# '-', '_' and '.', and never '.' or '..'. Any other name was sent: `..` is a path step that
# the URL's normalisation takes, so a repo named `..` under an allowed `owner/*` left the
# owner (`/repos/sidelinja/../contents/a/contents/b` reads repository `contents/a`).
REPO_NAME = re.compile(r"[A-Za-z0-9_.-]{1,100}")


def check_repo_name(name: str) -> str:
    """An owner or repository name (for payload models, and at every request)."""
    if not REPO_NAME.fullmatch(name) or name in (".", ".."):
        raise ValueError("must be a Forgejo name: letters, digits, '-', '_' and '.', not '..'")
    return name


def check_repo_path(path: str) -> str:
    """A path inside a repository: relative, no empty, `.` or `..` segments (for payload models)."""
    parts = path.split("/")
    if path.startswith("/") or any(p in ("", ".", "..") for p in parts):
        raise ValueError("must be a relative path inside the repository, without '..'")
    return path
