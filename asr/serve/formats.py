"""The OpenAI audio API's answers: a transcript as json, text, srt, vtt or verbose_json, and the server-sent
events of a streamed transcription (`transcript.text.delta` per decoded segment, `transcript.text.done`)."""

from __future__ import annotations

import io
import json
import math
from typing import Any

from asr.results import Segment, Transcript
from asr.writers import write_srt, write_vtt

RESPONSE_FORMATS = ("json", "text", "srt", "vtt", "verbose_json")
MEDIA_TYPES = {"json": "application/json", "verbose_json": "application/json", "text": "text/plain; charset=utf-8",
               "srt": "application/x-subrip; charset=utf-8", "vtt": "text/vtt; charset=utf-8"}


def language_name(code: str) -> str:
    """OpenAI's verbose_json names the language ("english"), as openai-whisper's LANGUAGES do."""
    from transformers.models.whisper.tokenization_whisper import LANGUAGES

    return LANGUAGES.get(code, code)


def usage(transcript: Transcript) -> dict[str, Any]:
    """OpenAI bills whisper-1 by the second: the audio's length, rounded up."""
    return {"type": "duration", "seconds": math.ceil(transcript.stats.audio_seconds)}


def render(transcript: Transcript, response_format: str, task: str, words: bool, segments: bool = True) -> str:
    """The response body for `response_format` (one of RESPONSE_FORMATS)."""
    if response_format == "text":
        return transcript.text.strip() + "\n"
    if response_format in ("srt", "vtt"):
        out = io.StringIO()
        (write_srt if response_format == "srt" else write_vtt)(transcript, out)
        return out.getvalue()
    body: dict[str, Any] = {"text": transcript.text.strip()}
    if response_format == "verbose_json":
        body = {"task": task, "language": language_name(transcript.language),
                "duration": round(transcript.stats.audio_seconds, 3), **body}
        if segments:
            body["segments"] = [segment_dict(s) for s in transcript.segments]
        if words:
            body["words"] = [{"word": w.word.strip(), "start": round(w.start, 3), "end": round(w.end, 3)}
                             for s in transcript.segments for w in s.words or []]
    body["usage"] = usage(transcript)
    body["stats"] = transcript.stats.to_dict()  # this project's figures: passes, drafts, seconds
    return json.dumps(body, ensure_ascii=False)


def segment_dict(segment: Segment) -> dict[str, Any]:
    """A segment as OpenAI's verbose_json gives it."""
    return {"id": segment.id, "seek": segment.seek, "start": round(segment.start, 3), "end": round(segment.end, 3),
            "text": segment.text, "tokens": segment.tokens, "temperature": segment.temperature,
            "avg_logprob": segment.avg_logprob, "compression_ratio": segment.compression_ratio,
            "no_speech_prob": segment.no_speech_prob}


def sse(data: dict[str, Any]) -> str:
    """One server-sent event."""
    return f"data: {json.dumps(data, ensure_ascii=False)}\n\n"


def delta_event(segment: Segment) -> str:
    """A decoded segment as OpenAI's `transcript.text.delta` (the segment's times ride along for the page)."""
    return sse({"type": "transcript.text.delta", "delta": segment.text, "segment_id": str(segment.id),
                "segment": segment_dict(segment)})


def done_event(transcript: Transcript) -> str:
    return sse({"type": "transcript.text.done", "text": transcript.text.strip(), "language": transcript.language,
                "usage": usage(transcript), "stats": transcript.stats.to_dict()})
