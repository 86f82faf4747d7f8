"""A speaches (faster-whisper-server) stand-in: POST /v1/audio/transcriptions as the service
documents it, with its errors: 404 model not installed, 415 undecodable audio, 400 empty audio,
422 validation, 403 wrong API key, and 5xx on demand."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

from aiohttp import BodyPartReader, web

FORMATS = ("text", "json", "verbose_json", "srt", "vtt")
# Magic numbers of what PyAV would decode; anything else is "file type not supported".
AUDIO_MAGIC = (b"RIFF", b"ID3", b"\xff\xfb", b"\xff\xf3", b"OggS", b"fLaC", b"\x00\x00\x00\x20ftyp")


@dataclass
class Upload:
    fields: dict[str, str]
    filename: str | None
    content_type: str | None
    size: int
    sha256: str
    head: bytes  # the first bytes, sniffed in place of decoding
    authorization: str | None


@dataclass
class FakeWhisper:
    srt: str
    models: set[str] = field(default_factory=lambda: {"Systran/faster-whisper-large-v3"})
    api_key: str | None = None
    fail_next: list[tuple[int, dict[str, str]]] = field(default_factory=list)  # (status, headers)
    uploads: list[Upload] = field(default_factory=list)
    url: str = ""  # set once it is serving

    def app(self) -> web.Application:
        app = web.Application(client_max_size=1024**3)
        app.router.add_post("/v1/audio/transcriptions", self.transcribe)
        app.router.add_get("/health", self.health)
        return app

    async def health(self, request: web.Request) -> web.Response:
        return web.json_response({"message": "OK"})

    async def transcribe(self, request: web.Request) -> web.StreamResponse:
        if self.api_key and request.headers.get("Authorization") != f"Bearer {self.api_key}":
            return web.json_response({"detail": "Invalid API key"}, status=403)
        upload = await self._read(request)
        self.uploads.append(upload)
        if self.fail_next:
            status, headers = self.fail_next.pop(0)
            return web.json_response(
                {"detail": "Service Unavailable"}, status=status, headers=headers
            )
        problem = self._validate(upload)
        if problem is not None:
            return problem
        return self._answer(upload)

    async def _read(self, request: web.Request) -> Upload:
        fields: dict[str, str] = {}
        digest, size, filename, ctype, head = hashlib.sha256(), 0, None, None, b""
        reader = await request.multipart()
        async for part in reader:
            assert isinstance(part, BodyPartReader)  # no nested multipart in this protocol
            if part.name == "file":
                filename, ctype = part.filename, part.headers.get("Content-Type")
                while chunk := await part.read_chunk(65536):
                    head = head or chunk[:16]
                    digest.update(chunk)
                    size += len(chunk)
            else:
                fields[str(part.name)] = await part.text()
        return Upload(
            fields,
            filename,
            ctype,
            size,
            digest.hexdigest(),
            head,
            request.headers.get("Authorization"),
        )

    def _validate(self, upload: Upload) -> web.Response | None:
        fmt = upload.fields.get("response_format", "json")
        if "model" not in upload.fields or fmt not in FORMATS or upload.filename is None:
            loc = "model" if "model" not in upload.fields else "response_format"
            return web.json_response(
                {
                    "detail": [
                        {
                            "type": "value_error",
                            "loc": ["body", loc],
                            "msg": "Field required or invalid",
                        }
                    ]
                },
                status=422,
            )
        model = upload.fields["model"]
        if model not in self.models:
            text = (
                f"Model '{model}' is not installed locally. You can download the model "
                f"using `POST /v1/models/{model}`"
            )
            return web.json_response({"detail": text}, status=404)
        if upload.size == 0:
            return web.json_response({"detail": "Audio file is probably empty"}, status=400)
        return None

    def _answer(self, upload: Upload) -> web.Response:
        # The magic check stands in for PyAV: a real server decodes, we sniff.
        if not upload.head.startswith(AUDIO_MAGIC):
            return web.json_response({"detail": "Unsupported audio file type"}, status=415)
        fmt = upload.fields.get("response_format", "json")
        text = " ".join(
            ln for ln in self.srt.splitlines() if ln and "-->" not in ln and not ln.isdigit()
        )
        if fmt == "srt":
            return web.Response(text=self.srt, content_type="text/plain")
        if fmt == "text":
            return web.Response(text=text, content_type="text/plain")
        return web.json_response({"text": text})


def fake_audio(seconds: int = 1) -> bytes:
    """A valid 16 kHz mono 16-bit WAV of silence: enough for a server that sniffs."""
    data = b"\x00\x00" * 16000 * seconds
    header = (
        b"RIFF"
        + (36 + len(data)).to_bytes(4, "little")
        + b"WAVEfmt "
        + (16).to_bytes(4, "little")
        + (1).to_bytes(2, "little")
        + (1).to_bytes(2, "little")
        + (16000).to_bytes(4, "little")
        + (32000).to_bytes(4, "little")
        + (2).to_bytes(2, "little")
        + (16).to_bytes(2, "little")
        + b"data"
        + len(data).to_bytes(4, "little")
    )
    return header + data
