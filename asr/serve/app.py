"""The FastAPI application: OpenAI's audio endpoints, the model list, health, the live WebSocket and the page.

`create_app` takes a loaded model and its assistant; `asr serve` runs the result under uvicorn. Every request's
audio goes through one `Scheduler`, which decodes the windows of concurrent requests together.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from importlib import resources
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
from fastapi.staticfiles import StaticFiles
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import UploadFile
from starlette.exceptions import HTTPException

from asr.errors import first_line
from asr.options import TEMPERATURES, TranscribeOptions
from asr.serve.errors import APIError, BodyGuard, bad_request, check_key
from asr.serve.formats import MEDIA_TYPES, RESPONSE_FORMATS, delta_event, done_event, render, sse
from asr.serve.live import add_live_route
from asr.serve.scheduler import Busy, Job, Scheduler
from asr.whisper import alignment_kernels

logger = logging.getLogger(__name__)

# Model names a request may give: the served model's, and OpenAI's, so that code written for OpenAI runs as is.
OPENAI_ALIASES = ("whisper-1",)


@dataclass(frozen=True)
class ServerSettings:
    """How the server runs; `asr serve`'s options."""

    model_name: str = "base"  # as /v1/models lists it
    api_key: str | None = None  # None: no key asked
    max_upload: int = 25_000_000  # bytes (OpenAI's limit is 25 MB)
    max_batch: int = 8  # windows of concurrent requests decoded together
    max_queue: int = 64  # requests waiting beyond those; one more gets 503
    body_timeout: float = 30.0  # the longest pause allowed while a client sends its upload
    # What a request's fields do not set (they set language, task, prompt, temperature and word times).
    options: TranscribeOptions = TranscribeOptions()


def create_app(bundle: Any, assistant: Any, settings: ServerSettings = ServerSettings()) -> FastAPI:
    """The server's application for a loaded model (`asr.assist.choose.load_pair`)."""
    scheduler = Scheduler(bundle, assistant, settings.max_batch, settings.max_queue)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await run_in_threadpool(alignment_kernels.load)  # word timestamps and live streams: no request pays for it
        yield
        await run_in_threadpool(scheduler.stop)

    app = FastAPI(title="assisted Whisper", lifespan=lifespan, docs_url="/docs", redoc_url=None)
    app.state.scheduler, app.state.settings, app.state.started = scheduler, settings, int(time.time())
    app.add_middleware(BodyGuard, limit=settings.max_upload, timeout=settings.body_timeout)
    _add_error_handlers(app)

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok", "model": settings.model_name, "requests_in_hand": scheduler.in_hand,
                "batches": scheduler.batches, "windows": scheduler.windows}

    @app.get("/v1/models")
    async def models(request: Request) -> dict[str, Any]:
        check_key(request, settings)
        return {"object": "list", "data": [_model_card(name, app) for name in (settings.model_name, *OPENAI_ALIASES)]}

    @app.get("/v1/models/{name:path}")
    async def model(name: str, request: Request) -> dict[str, Any]:
        check_key(request, settings)
        return _model_card(_served_model(name, settings), app)

    @app.post("/v1/audio/transcriptions")
    async def transcriptions(request: Request) -> Response:
        return await _transcribe(request, "transcribe", scheduler, settings)

    @app.post("/v1/audio/translations")
    async def translations(request: Request) -> Response:
        return await _transcribe(request, "translate", scheduler, settings)

    add_live_route(app, scheduler, settings)
    static = resources.files("asr.serve") / "static"

    @app.get("/", response_class=HTMLResponse)
    async def page() -> HTMLResponse:
        return HTMLResponse((static / "index.html").read_text(encoding="utf-8"))

    app.mount("/static", StaticFiles(directory=str(static)), name="static")
    return app


def _model_card(name: str, app: FastAPI) -> dict[str, Any]:
    return {"id": name, "object": "model", "created": app.state.started, "owned_by": "assisted-whisper"}


def _served_model(name: str | None, settings: ServerSettings) -> str:
    if name in (None, "", settings.model_name, *OPENAI_ALIASES):
        return name or settings.model_name
    raise APIError(404, f"The model `{name}` does not exist: this server serves {settings.model_name} "
                        f"(also as {', '.join(OPENAI_ALIASES)}).", code="model_not_found", param="model")


@dataclass
class _Request:
    """What a transcription request asked for."""

    options: TranscribeOptions
    response_format: str
    words: bool
    segments: bool
    stream: bool


async def _transcribe(request: Request, task: str, scheduler: Scheduler, settings: ServerSettings) -> Response:
    check_key(request, settings)
    try:
        form = await request.form(max_files=1, max_fields=64)
    except APIError:
        raise
    except Exception as error:  # a malformed multipart body
        raise bad_request(f"could not read the form: {first_line(str(error)) or type(error).__name__}") from None
    try:
        upload = form.get("file")
        if not isinstance(upload, UploadFile):
            raise bad_request("no `file` field: send the audio as multipart/form-data field `file`", param="file")
        asked = _parse_form(form, task, settings)
        data, name = await upload.read(), upload.filename or "upload"
    finally:
        await form.close()  # the upload's spooled bytes go now; nothing of a request stays on disk
    from audio import load_audio_bytes

    try:
        samples = await run_in_threadpool(load_audio_bytes, data, name=name)
    except ValueError as error:
        raise bad_request(f"Invalid file: {first_line(str(error))}", param="file", code="invalid_file") from None
    del data
    try:
        job = await run_in_threadpool(scheduler.submit, samples, asked.options, asyncio.get_running_loop(), name)
    except Busy as error:
        raise APIError(503, str(error), type="server_error", code="server_busy") from None
    except ValueError as error:
        raise bad_request(first_line(str(error))) from None
    if asked.stream:
        return StreamingResponse(_events(job), media_type="text/event-stream",
                                 headers={"cache-control": "no-cache", "x-accel-buffering": "no"})
    transcript = await _result(job, request)
    body = render(transcript, asked.response_format, task, asked.words, asked.segments)
    return Response(body, media_type=MEDIA_TYPES[asked.response_format])


def _parse_form(form: Any, task: str, settings: ServerSettings) -> _Request:
    """The request's fields as options, checked (each bad one a 400 naming it)."""
    _served_model(form.get("model"), settings)
    response_format = str(form.get("response_format") or "json")
    if response_format not in RESPONSE_FORMATS:
        raise bad_request(f"response_format {response_format!r} is not one of {', '.join(RESPONSE_FORMATS)}",
                          param="response_format")
    try:
        temperature = float(form.get("temperature") or 0.0)
    except ValueError:
        raise bad_request(f"temperature must be a number, got {form.get('temperature')!r}", param="temperature") \
            from None
    if not 0.0 <= temperature <= 1.0:
        raise bad_request(f"temperature must be from 0 to 1, got {temperature:g}", param="temperature")
    granularities = set(form.getlist("timestamp_granularities[]") + form.getlist("timestamp_granularities"))
    if granularities - {"word", "segment"}:
        raise bad_request(f"timestamp_granularities may hold word and segment, got {sorted(granularities)}",
                          param="timestamp_granularities")
    stream = str(form.get("stream") or "false").lower()
    if stream not in ("true", "false", "1", "0"):
        raise bad_request(f"stream must be true or false, got {stream!r}", param="stream")
    language = form.get("language") if task == "transcribe" else None
    # 0: the server's fallback schedule; else openai-whisper's, from the given temperature up in steps of 0.2.
    temperatures = settings.options.temperatures
    if temperature:
        temperatures = (temperature, *(t for t in TEMPERATURES if t > temperature + 1e-6))
    options = replace(settings.options, language=str(language) if language else None, task=task,
                      initial_prompt=str(form.get("prompt") or "") or None, temperatures=temperatures,
                      word_timestamps="word" in granularities)
    return _Request(options, response_format, "word" in granularities,
                    not granularities or "segment" in granularities, stream in ("true", "1"))


async def _result(job: Job, request: Request) -> Any:
    """Waits for the job's transcript; a client that goes away meanwhile cancels it."""
    while True:
        try:
            event = await asyncio.wait_for(job.events.get(), timeout=0.5)
        except asyncio.TimeoutError:
            if await request.is_disconnected():
                job.cancel()
                raise APIError(499, "the client closed the connection", code="client_closed") from None
            continue
        if event.kind == "done":
            return event.value
        if event.kind == "error":
            raise APIError(500, event.value, type="server_error")


async def _events(job: Job) -> AsyncIterator[str]:
    """The segments as they are decoded, then the whole text; a client that goes away cancels the job."""
    try:
        while True:
            event = await job.events.get()
            if event.kind == "segments":
                for segment in event.value:
                    yield delta_event(segment)
            elif event.kind == "done":
                yield done_event(event.value)
                return
            else:
                yield sse({"type": "error", **APIError(500, event.value, type="server_error").body()})
                return
    finally:
        job.cancel()


def _add_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def api_error(request: Request, error: APIError) -> JSONResponse:
        return JSONResponse(error.body(), status_code=error.status)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, error: HTTPException) -> JSONResponse:
        kind = "invalid_request_error" if error.status_code < 500 else "server_error"
        return JSONResponse(APIError(error.status_code, str(error.detail), type=kind).body(),
                            status_code=error.status_code)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, error: RequestValidationError) -> JSONResponse:
        return JSONResponse(bad_request(first_line(str(error.errors()))).body(), status_code=400)

    @app.exception_handler(Exception)
    async def unexpected(request: Request, error: Exception) -> JSONResponse:
        logger.exception("unexpected error on %s", request.url.path)
        return JSONResponse(APIError(500, f"internal error ({type(error).__name__})", type="server_error").body(),
                            status_code=500)
