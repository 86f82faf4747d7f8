"""A Forgejo stand-in: the contents API with real sha checks. GET reads a file
(by branch or commit), POST creates (201; 422 if it exists), PUT updates (200; 409 on a stale sha;
422 without one). Errors: 401 bad token, 403 read-only token, 404 repo/branch/file, 413 quota,
423 archived, and any status on demand. Bodies are Forgejo's {"message", "url"}."""

from __future__ import annotations

import base64
import binascii
import hashlib
from dataclasses import dataclass, field
from typing import Any
from uuid import uuid4

from aiohttp import web

API = "/api/v1/repos/{owner}/{repo}/contents/{path:.+}"


def blob_sha(content: bytes) -> str:
    """Git's blob id, as Forgejo returns it in `sha`."""
    return hashlib.sha1(b"blob %d\x00" % len(content) + content).hexdigest()


@dataclass
class Repo:
    branches: dict[str, dict[str, bytes]] = field(default_factory=lambda: {"main": {}})
    commits: dict[str, dict[str, bytes]] = field(default_factory=dict)  # sha -> snapshot
    default_branch: str = "main"
    archived: bool = False


@dataclass
class Call:
    method: str
    path: str
    query: dict[str, str]
    body: dict[str, Any] | None
    status: int


@dataclass
class FakeForgejo:
    tokens: dict[str, str]  # token -> "write" | "read"
    repos: dict[tuple[str, str], Repo] = field(default_factory=dict)
    quota_bytes: int | None = None
    concurrent_edits: int = 0  # the next N updates find the file changed by someone else
    fail_next: list[tuple[int, dict[str, str]]] = field(default_factory=list)
    echo_token: bool = False  # a 403 that repeats the Authorization header (tests scrubbing)
    calls: list[Call] = field(default_factory=list)
    url: str = ""  # set once it is serving

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._record])
        app.router.add_get(API, self.get)
        app.router.add_post(API, self.create)
        app.router.add_put(API, self.update)
        return app

    def commit(self, owner: str, repo: str, branch: str, path: str, content: bytes) -> str:
        """Writes a file as a commit would; returns the commit sha."""
        r = self.repos.setdefault((owner, repo), Repo())
        r.branches.setdefault(branch, {})[path] = content
        sha = hashlib.sha1(uuid4().bytes).hexdigest()
        r.commits[sha] = dict(r.branches[branch])
        return sha

    @web.middleware
    async def _record(self, request: web.Request, handler: Any) -> web.StreamResponse:
        body = await request.json() if request.can_read_body else None
        response = await self._checked(request, handler)
        self.calls.append(
            Call(
                request.method,
                request.match_info.get("path", ""),
                dict(request.query),
                body,
                response.status,
            )
        )
        return response

    async def _checked(self, request: web.Request, handler: Any) -> web.StreamResponse:
        scope = self._scope(request)
        if scope is None:
            return _error(401, "token is required or invalid", request)
        if self.fail_next:
            status, headers = self.fail_next.pop(0)
            return _error(status, "internal server error", request, headers)
        if request.method != "GET" and scope != "write":
            text = "token does not have at least one of required scope(s): [write:repository]" + (
                f" (got {request.headers.get('Authorization')})" if self.echo_token else ""
            )
            return _error(403, text, request)
        response: web.StreamResponse = await handler(request)
        return response

    def _scope(self, request: web.Request) -> str | None:
        header = request.headers.get("Authorization", "")
        prefix, _, token = header.partition(" ")
        if prefix.lower() not in ("token", "bearer"):
            return None
        return self.tokens.get(token)

    def _repo(self, request: web.Request) -> Repo | None:
        return self.repos.get((request.match_info["owner"], request.match_info["repo"]))

    async def get(self, request: web.Request) -> web.Response:
        repo, path = self._repo(request), request.match_info["path"]
        if repo is None:
            return _error(404, "The target couldn't be found.", request)
        ref = request.query.get("ref", repo.default_branch)
        files = repo.branches.get(ref, repo.commits.get(ref))
        if files is None:
            return _error(404, f"no such ref: {ref}", request)
        if path not in files:
            return _error(404, f"object does not exist [id: , rel_path: {path}]", request)
        last = next(
            (sha for sha, snap in reversed(repo.commits.items()) if snap.get(path) == files[path]),
            None,
        )
        return web.json_response(_contents(path, files[path], last))

    async def create(self, request: web.Request) -> web.Response:
        return await self._write(request, creating=True)

    async def update(self, request: web.Request) -> web.Response:
        return await self._write(request, creating=False)

    async def _write(self, request: web.Request, *, creating: bool) -> web.Response:
        repo, path, body = self._repo(request), request.match_info["path"], await request.json()
        if repo is None:
            return _error(404, "The target couldn't be found.", request)
        if repo.archived:
            return _error(423, "repo is archived", request)
        branch = body.get("branch") or repo.default_branch
        if branch not in repo.branches:
            return _error(404, f"branch does not exist [name: {branch}]", request)
        try:
            content = base64.b64decode(body.get("content", ""), validate=True)
        except (binascii.Error, ValueError):
            return _error(422, "invalid base64 content", request)
        files = repo.branches[branch]
        problem = self._conflict(files, path, body, creating, content, request)
        if problem is not None:
            return problem
        owner, name = request.match_info["owner"], request.match_info["repo"]
        sha = self.commit(owner, name, branch, path, content)
        response = {
            "content": _contents(path, content, sha),
            "commit": {"sha": sha, "message": body.get("message")},
        }
        return web.json_response(response, status=201 if creating else 200)

    def _conflict(
        self,
        files: dict[str, bytes],
        path: str,
        body: dict[str, Any],
        creating: bool,
        content: bytes,
        request: web.Request,
    ) -> web.Response | None:
        if creating and path in files:
            return _error(422, f"repository file already exists [path: {path}]", request)
        if not creating:
            if not body.get("sha"):
                return _error(422, "sha is required", request)
            if path not in files:
                return _error(404, f"file does not exist [path: {path}]", request)
            if self.concurrent_edits:
                self.concurrent_edits -= 1
                files[path] = files[path] + b"\n(edited meanwhile)\n"
            if body["sha"] != blob_sha(files[path]):
                return _error(
                    409,
                    f"sha does not match [given: {body['sha']}, expected: {blob_sha(files[path])}]",
                    request,
                )
        if self.quota_bytes is not None and len(content) > self.quota_bytes:
            return _error(413, "quota exceeded", request)
        return None


def _contents(path: str, content: bytes, last_commit_sha: str | None) -> dict[str, Any]:
    return {
        "name": path.rsplit("/", 1)[-1],
        "path": path,
        "sha": blob_sha(content),
        "last_commit_sha": last_commit_sha,
        "type": "file",
        "size": len(content),
        "encoding": "base64",
        "content": base64.b64encode(content).decode(),
    }


def _error(
    status: int, message: str, request: web.Request, headers: dict[str, str] | None = None
) -> web.Response:
    return web.json_response(
        {"message": message, "url": str(request.url)}, status=status, headers=headers
    )
