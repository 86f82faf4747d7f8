"""speaches / faster-whisper-server: an audio file streamed in, SRT text out. The file comes
open (the one its job checked) and is read in a thread: a name opened again here could be
another file by then, and an open or read on the event loop could wait for good."""

from __future__ import annotations

import asyncio
import mimetypes
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO
from uuid import uuid4

import httpx

from sidelinja_worker.queue.config import Secret
from sidelinja_worker.queue.errors import PermanentError, RetryJob
from sidelinja_worker.services import bounded
from sidelinja_worker.services.classify import (
    detail,
    is_transient,
    permanent_status,
    transient_status,
    transport_failure,
)

DEFAULT_MODEL = "Systran/faster-whisper-large-v3"
SERVICE = "whisper"
# The server answers only when the whole file is transcribed (minutes to an hour on CPU), so
# the read timeout is the longest transcription we wait for; the job's own timeout is longer.
TIMEOUT = httpx.Timeout(connect=10.0, read=3 * 3600.0, write=600.0, pool=60.0)
CHUNK_BYTES = 1 << 20
# The whole exchange: the upload, the transcription and the answer.
DEADLINE_S = 4 * 3600.0 - 60.0
# Ten hours of speech is about 1.5 MB of SRT; an answer past this is not a transcript.
MAX_ANSWER_BYTES = 20 * 1024 * 1024

UploadProgress = Callable[[int, int], Awaitable[None]]  # (bytes sent, bytes in all)


@dataclass(frozen=True)
class WhisperServer:
    base_url: str
    api_key: Secret | None = None


@dataclass(frozen=True)
class TranscribeRequest:
    audio: BinaryIO  # open, at its start; its caller closes it
    model: str
    language: str


async def transcribe_srt(
    http: httpx.AsyncClient,
    server: WhisperServer,
    req: TranscribeRequest,
    on_upload: UploadProgress | None = None,
) -> str:
    """POST /v1/audio/transcriptions with response_format=srt; the SRT text on success. The open
    file is streamed in chunks read in a thread, never read whole into memory."""
    body = _Multipart(
        {"model": req.model, "language": req.language, "response_format": "srt"}, req.audio
    )
    headers = {
        "Content-Type": f"multipart/form-data; boundary={body.boundary}",
        "Content-Length": str(body.length),
    }
    if server.api_key is not None:
        headers["Authorization"] = f"Bearer {server.api_key.reveal()}"
    url = server.base_url.rstrip("/") + "/v1/audio/transcriptions"
    try:
        response = await bounded.send(
            http,
            "POST",
            url,
            service=SERVICE,
            max_bytes=MAX_ANSWER_BYTES,
            deadline_s=DEADLINE_S,
            content=body.stream(on_upload),
            headers=headers,
            timeout=TIMEOUT,
        )
    except httpx.TransportError as exc:
        raise transport_failure(SERVICE, exc) from None
    return _answer(response, req.model, server.api_key)


def _answer(response: httpx.Response, model: str, api_key: Secret | None) -> str:
    """The SRT, or the outcome its status means."""
    status = response.status_code
    if status == 200:
        try:
            return response.content.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise PermanentError(
                f"whisper answered 200 with bytes that are not UTF-8 (byte {exc.start})"
            ) from None
    message = detail(
        response, ("detail", "message", "error"), [api_key.reveal()] if api_key else []
    )
    if status == 408 or is_transient(status):
        raise transient_status(SERVICE, response, message)
    if status == 404:
        raise PermanentError(
            f"whisper model {model!r} is not installed on the server "
            f"(404: {message}); install it with POST /v1/models/{{model_id}}"
        )
    if status in (401, 403):
        raise PermanentError(f"whisper refused the API key ({status}): check WHISPER_API_KEY")
    raise permanent_status(SERVICE, response, message)  # 400 empty, 415 undecodable, 422 ...


class _Multipart:
    """multipart/form-data with a known length: text fields, then the open file in chunks.
    httpx reads an async iterator without blocking the loop (a file object it would read on the
    loop, or refuse in an async client), so the body is one, each chunk read in a thread."""

    def __init__(self, fields: dict[str, str], audio: BinaryIO) -> None:
        self.boundary = uuid4().hex
        self._audio = audio
        self._name = Path(audio.name).name
        self._size = os.fstat(audio.fileno()).st_size  # the open file's: no name looked up
        parts = [self._part(f'name="{name}"', value.encode()) for name, value in fields.items()]
        content_type = mimetypes.guess_type(self._name)[0] or "application/octet-stream"
        filename = "".join("_" if c in '"\r\n\\' else c for c in self._name)
        head = (
            f'--{self.boundary}\r\nContent-Disposition: form-data; name="file"; '
            f'filename="{filename}"\r\nContent-Type: {content_type}\r\n\r\n'
        )
        self._head = b"".join(parts) + head.encode()
        self._tail = f"\r\n--{self.boundary}--\r\n".encode()
        self.length = len(self._head) + self._size + len(self._tail)

    def _part(self, disposition: str, value: bytes) -> bytes:
        return (
            f"--{self.boundary}\r\nContent-Disposition: form-data; {disposition}\r\n\r\n".encode()
            + value
            + b"\r\n"
        )

    async def stream(self, on_upload: UploadProgress | None) -> AsyncIterator[bytes]:
        yield self._head
        sent = 0
        while chunk := await asyncio.to_thread(self._audio.read, CHUNK_BYTES):
            sent += len(chunk)
            yield chunk
            if on_upload is not None:
                await on_upload(sent, self._size)
        if sent != self._size:  # still being written? the length we announced is wrong
            raise RetryJob(f"{self._name} changed size while it was being uploaded")
        yield self._tail
