"""The live WebSocket: raw PCM in, committed segments out, through the live transcriber (`asr.live`).

`ws://HOST/v1/audio/live?language=en&vad=true` (query: `language`, `task`, `prompt`, `vad`, `step` seconds
between updates, `sample_rate` of the PCM, `api_key` where the server has one: a browser cannot set headers on
a WebSocket). The client sends binary frames of signed 16-bit little-endian mono PCM and, to end, the text frame
`{"type": "stop"}` (or closes). The server sends JSON: `ready` once, a `segment` (start, end, text, emitted_at)
per commit, the uncommitted `hypothesis` after each update, and at the end `done` with the whole text and the
stream's stats; `error` with OpenAI's error object before it closes on a bad request.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any

import numpy as np
from fastapi import FastAPI, WebSocket, WebSocketDisconnect
from starlette.concurrency import run_in_threadpool

from asr.errors import first_line
from asr.live.sources import PcmDecoder
from asr.serve.errors import APIError, bad_request, check_key
from audio.constants import SAMPLE_RATE

logger = logging.getLogger(__name__)


def add_live_route(app: FastAPI, scheduler: Any, settings: Any) -> None:
    @app.websocket("/v1/audio/live")
    async def live(websocket: WebSocket) -> None:
        await websocket.accept()
        try:
            check_key(websocket, settings, websocket.query_params.get("api_key"))  # type: ignore[arg-type]
            session = await run_in_threadpool(_Session, scheduler, dict(websocket.query_params))
        except APIError as error:
            await _send(websocket, {"type": "error", **error.body()})
            await websocket.close(code=1008)
            return
        await _send(websocket, {"type": "ready", "model": settings.model_name, "sample_rate": session.pcm.rate})
        try:
            await _serve(websocket, session, scheduler)
        except WebSocketDisconnect:
            logger.info("live client went away after %.1f s of audio", session.live.stats.audio_seconds)


class _Session:
    """One live stream's transcriber, built from the WebSocket's query."""

    def __init__(self, scheduler: Any, query: dict[str, str]) -> None:
        from asr.live import StreamingTranscriber
        from asr.options import TranscribeOptions

        try:
            self.step = float(query.get("step", 1.0))
            rate = int(query.get("sample_rate", SAMPLE_RATE))
        except ValueError:
            raise bad_request("step and sample_rate must be numbers") from None
        if not 0.1 <= self.step <= 10 or not 1000 <= rate <= 768000:
            raise bad_request(f"step must be from 0.1 to 10 s and sample_rate from 1000 to 768000 Hz, got "
                              f"{self.step:g} and {rate}")
        self.pcm = PcmDecoder(rate)
        voice = None
        if query.get("vad", "false").lower() in ("1", "true"):
            from asr.live.voice import VoiceActivity

            voice = VoiceActivity()
        began = time.monotonic()
        try:
            options = TranscribeOptions(language=query.get("language") or None,
                                        task=query.get("task", "transcribe"), initial_prompt=query.get("prompt"))
            scheduler.check(options)
            self.live = StreamingTranscriber(scheduler.bundle, options, scheduler.assistant,
                                             clock=lambda: time.monotonic() - began, voice=voice)
        except ValueError as error:
            raise bad_request(first_line(str(error))) from None


async def _serve(websocket: WebSocket, session: _Session, scheduler: Any) -> None:
    """Receives audio while updates run; an update starts once `step` seconds of new audio are in."""
    arrived: list[np.ndarray] = []
    ended = asyncio.Event()
    news = asyncio.Event()

    async def receive() -> None:
        try:
            while True:
                message = await websocket.receive()
                if message["type"] == "websocket.disconnect":
                    raise WebSocketDisconnect(message.get("code", 1000))
                if message.get("bytes"):
                    arrived.append(session.pcm.samples(message["bytes"]))
                    news.set()
                elif message.get("text") and _is_stop(message["text"]):
                    arrived.append(session.pcm.samples(b"", last=True))
                    return
        finally:
            ended.set()
            news.set()

    receiving = asyncio.create_task(receive())
    live, step = session.live, int(session.step * SAMPLE_RATE)
    try:
        while True:
            await news.wait()
            news.clear()
            if sum(len(a) for a in arrived) < step and not ended.is_set():
                continue
            chunk = np.concatenate(arrived) if arrived else np.zeros(0, np.float32)
            arrived.clear()
            last = ended.is_set()
            if receiving.done() and receiving.exception() is not None:
                raise receiving.exception()  # the client went away: nothing to send to
            committed, pending = await run_in_threadpool(_update, live, scheduler, chunk, last)
            for segment in committed:
                await _send(websocket, {"type": "segment", **segment.to_dict()})
            if last:
                await _send(websocket, {"type": "done", "text": "".join(c.text for c in live.committed).strip(),
                                        "language": live.language, "stats": live.stats.to_dict()})
                await websocket.close()
                return
            await _send(websocket, {"type": "hypothesis", "text": pending})
    finally:
        receiving.cancel()


def _update(live: Any, scheduler: Any, chunk: np.ndarray, last: bool) -> tuple[list, str]:
    """Adds the new audio and updates (or finishes) the stream, holding the model."""
    with scheduler.compute:
        if len(chunk):
            live.insert_audio(chunk)
        committed = live.finish() if last else live.process()
    return committed, live.pending_text


def _is_stop(text: str) -> bool:
    try:
        return json.loads(text).get("type") == "stop"
    except (ValueError, AttributeError):
        return False


async def _send(websocket: WebSocket, message: dict[str, Any]) -> None:
    await websocket.send_text(json.dumps(message, ensure_ascii=False))
