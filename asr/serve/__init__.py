"""`asr serve`: an OpenAI-compatible transcription server that decodes concurrent requests together.

`create_app(bundle, assistant, ServerSettings(...))` gives the FastAPI application: `POST /v1/audio/transcriptions`
and `/v1/audio/translations` (OpenAI's fields and response formats, `stream=true` as server-sent events),
`GET /v1/models`, `GET /health`, the live WebSocket `/v1/audio/live`, and a page for people at `/`.
The server needs the `serve` extra (FastAPI, uvicorn, python-multipart).
"""

from asr.serve.app import ServerSettings, create_app

__all__ = ["ServerSettings", "create_app"]
