"""`asr serve` with real clients: the official `openai` package (every response format, translation, streaming),
plain HTTP for the errors (OpenAI's JSON shape and status codes), the live WebSocket, and the doors a service
opens (a full queue, a client that goes away, a slow client, a wrong key); the server answers the next request
after each. The windows of concurrent requests are decoded together, with each request's own words."""

from __future__ import annotations

import json
import os
import socket
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("fastapi")
openai = pytest.importorskip("openai")
requests = pytest.importorskip("requests")

from asr.models.registry import load_model  # noqa: E402
from asr.options import TranscribeOptions  # noqa: E402
from asr.serve import ServerSettings, create_app  # noqa: E402
from asr.transcription import transcribe  # noqa: E402
from audio import SAMPLE_RATE, load_audio  # noqa: E402
from tests.conftest import SAMPLES, evaldata, free_port  # noqa: E402
from tests.helpers_serve import running_server  # noqa: E402

PARK = SAMPLES / "park.flac"
KEY = "sk-test-key"


@pytest.fixture(scope="module")
def scripted(scripted_folder: Path):
    return load_model(str(scripted_folder))


@pytest.fixture(scope="module")
def server(scripted):
    """The scripted Whisper (" hello world" per window) behind a key, with a 2 MB upload limit."""
    app = create_app(scripted, None, ServerSettings(model_name="scripted", api_key=KEY, max_upload=2_000_000,
                                                    body_timeout=1.0))
    with running_server(app) as url:
        yield url, app


@pytest.fixture(scope="module")
def client(server) -> "openai.OpenAI":
    return openai.OpenAI(base_url=f"{server[0]}/v1", api_key=KEY, max_retries=0)


def _post(url: str, files=None, data=None, key: str | None = KEY, timeout: float = 60, **kwargs) -> requests.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return requests.post(f"{url}/v1/audio/transcriptions", files=files, data=data, headers=headers, timeout=timeout,
                         **kwargs)


def _park() -> dict:
    return {"file": ("park.flac", PARK.read_bytes())}


def test_the_openai_sdk_works_unchanged(client) -> None:
    assert [m.id for m in client.models.list()] == ["scripted", "whisper-1"]
    with PARK.open("rb") as file:
        result = client.audio.transcriptions.create(model="whisper-1", file=file)
    assert result.text == "hello world"
    assert result.stats["model_forward_passes"] > 0  # the project's figures ride along
    with PARK.open("rb") as file:
        assert client.audio.translations.create(model="scripted", file=file).text == "hello world"


@pytest.mark.parametrize("fmt, expected", [
    ("text", "hello world\n"),
    ("srt", "1\n00:00:00,000 --> 00:00:01,000\nhello world\n\n"),
    ("vtt", "WEBVTT\n\n00:00.000 --> 00:01.000\nhello world\n\n"),
])
def test_each_text_format(client, fmt: str, expected: str) -> None:
    with PARK.open("rb") as file:
        assert client.audio.transcriptions.create(model="whisper-1", file=file, response_format=fmt) == expected


def test_verbose_json_with_segments_and_words(client) -> None:
    with PARK.open("rb") as file:
        result = client.audio.transcriptions.create(model="whisper-1", file=file, response_format="verbose_json",
                                                    timestamp_granularities=["word", "segment"], language="en")
    assert result.language == "english" and result.duration == pytest.approx(4.57, abs=0.01)
    assert [s.text for s in result.segments] == [" hello world"]
    assert [w.word for w in result.words] == ["hello", "world"]
    assert 0 <= result.words[0].start < result.words[0].end <= result.words[1].end


def test_streaming_sends_each_segment_then_the_text(client) -> None:
    with PARK.open("rb") as file:
        events = list(client.audio.transcriptions.create(model="whisper-1", file=file, stream=True))
    assert [e.type for e in events] == ["transcript.text.delta", "transcript.text.done"]
    assert events[0].delta == " hello world" and events[0].segment["end"] == 1.0
    assert events[1].text == "hello world"


def test_the_answers_are_transcribes(server, tiny_whisper_folder) -> None:
    """A random tiny Whisper, several requests at once: each answer is what `transcribe` gives for its file.
    Greedy: a sampled fallback window draws from the batch's generator, so its words depend on its batch."""
    bundle = load_model(str(tiny_whisper_folder))
    clips = [SAMPLES / f"{name}.flac" for name in ("park", "numbers", "station")] * 2
    greedy = TranscribeOptions(temperatures=(0.0,))
    expected = [transcribe(bundle, str(clip), greedy).text.strip() for clip in clips]
    app = create_app(bundle, None, ServerSettings(model_name="tiny", max_batch=4, options=greedy))
    with running_server(app) as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)

        def ask(clip: Path) -> str:
            with clip.open("rb") as file:
                return client.audio.transcriptions.create(model="tiny", file=file).text

        with ThreadPoolExecutor(len(clips)) as pool:
            assert list(pool.map(ask, clips)) == expected
        scheduler = app.state.scheduler
        assert scheduler.windows > scheduler.batches  # some windows were decoded together


@pytest.mark.parametrize("case, status, fields", [
    ("no file field", 400, {"data": {"model": "whisper-1"}}),
    ("0 bytes", 400, {"files": {"file": ("a.wav", b"")}}),
    ("not audio", 400, {"files": {"file": ("a.wav", b"hello world" * 100)}}),
    ("unknown model", 404, {"files": "park", "data": {"model": "gpt-9"}}),
    ("unknown format", 400, {"files": "park", "data": {"response_format": "xml"}}),
    ("unknown language", 400, {"files": "park", "data": {"language": "xx"}}),
    ("temperature out of range", 400, {"files": "park", "data": {"temperature": "3"}}),
    ("unknown granularity", 400, {"files": "park", "data": {"timestamp_granularities[]": "syllable"}}),
    ("over --max-upload", 413, {"files": {"file": ("a.wav", b"0" * 2_500_000)}}),
    ("not multipart", 400, {"json": {"file": "park.flac"}}),
])
def test_bad_requests_get_openai_shaped_errors(server, case: str, status: int, fields: dict) -> None:
    url, _ = server
    if fields.get("files") == "park":
        fields = {**fields, "files": _park()}
    answer = _post(url, **fields)
    assert answer.status_code == status, answer.text
    error = answer.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"] and "\n" not in error["message"]
    assert _post(url, files=_park()).json()["text"] == "hello world"  # the next request is served


def test_a_wrong_or_missing_key_is_401(server) -> None:
    url, _ = server
    for key in ("sk-wrong", None):
        answer = _post(url, files=_park(), key=key)
        assert answer.status_code == 401 and answer.json()["error"]["code"] == "invalid_api_key"
    assert requests.get(f"{url}/v1/models", timeout=10).status_code == 401
    assert requests.get(f"{url}/health", timeout=10).json()["status"] == "ok"  # health needs no key
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{url}/v1", api_key="sk-wrong", max_retries=0).models.list()


def test_an_upload_over_the_limit_without_a_length_is_cut_off(server) -> None:
    """A chunked body gives no Content-Length: it is refused once the bytes read pass the limit."""
    url, _ = server
    body = b"--x\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.wav\"\r\n\r\n" + b"0" * 3_000_000

    def chunks():
        for start in range(0, len(body), 65536):
            yield body[start:start + 65536]

    answer = requests.post(f"{url}/v1/audio/transcriptions", data=chunks(), timeout=30,
                           headers={"Authorization": f"Bearer {KEY}",
                                    "Content-Type": "multipart/form-data; boundary=x"})
    assert answer.status_code == 413 and answer.json()["error"]["code"] == "request_too_large"


def test_a_full_queue_is_503_and_a_client_that_leaves_frees_its_place(scripted) -> None:
    app = create_app(scripted, None, ServerSettings(model_name="scripted", max_batch=1, max_queue=0))
    scheduler = app.state.scheduler
    with running_server(app) as url:
        scheduler.compute.acquire()  # the model is busy: the first request waits in hand
        try:
            leaving = threading.Thread(target=lambda: _ignore(lambda: _post(url, files=_park(), timeout=1)))
            leaving.start()
            _wait_for(lambda: scheduler.in_hand == 1)
            answer = _post(url, files=_park())
            assert answer.status_code == 503 and answer.json()["error"]["type"] == "server_error"
            leaving.join()  # its client gave up after 1 s
        finally:
            scheduler.compute.release()
        _wait_for(lambda: scheduler.in_hand == 0)
        assert _post(url, files=_park()).json()["text"] == "hello world"


def test_a_slow_client_gets_408_and_the_server_goes_on(server) -> None:
    url, _ = server
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as connection:
        connection.sendall(b"POST /v1/audio/transcriptions HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n"
                           b"Content-Type: multipart/form-data; boundary=x\r\nAuthorization: Bearer " + KEY.encode()
                           + b"\r\n\r\n--x\r\n")
        answer = b""  # body_timeout is 1 s; the answer closes the connection
        while part := connection.recv(4096):
            answer += part
        answer = answer.decode()
    assert answer.startswith("HTTP/1.1 408") and '"code":"timeout"' in answer.replace(" ", "")
    assert _post(url, files=_park()).json()["text"] == "hello world"


def test_no_request_data_stays_on_disk(server) -> None:
    url, _ = server
    folder = Path(tempfile.gettempdir())
    before = set(os.listdir(folder))
    audio = (np.random.default_rng(0).normal(0, 0.1, 30 * SAMPLE_RATE) * 32767).astype("<i2")
    import io

    import soundfile

    wav = io.BytesIO()
    soundfile.write(wav, audio, SAMPLE_RATE, format="WAV")  # 0.96 MB... over the multipart parser's spool size
    assert _post(url, files={"file": ("big.wav", wav.getvalue() * 2)}).status_code in (200, 400)
    assert set(os.listdir(folder)) - before == set()


def test_the_live_websocket_commits_what_it_hears(server) -> None:
    from websockets.sync.client import connect

    url, _ = server
    pcm = (load_audio(PARK) * 32767).astype("<i2").tobytes()
    with connect(url.replace("http", "ws") + f"/v1/audio/live?api_key={KEY}&language=en") as socket_:
        assert json.loads(socket_.recv(timeout=30))["type"] == "ready"
        for start in range(0, len(pcm), 6401):  # odd sizes: a sample's bytes cut between frames
            socket_.send(pcm[start:start + 6401])
        socket_.send(json.dumps({"type": "stop"}))
        messages = [json.loads(m) for m in socket_]
    assert messages[-1]["type"] == "done" and messages[-1]["text"] == "hello world"
    assert messages[-1]["stats"]["updates"] >= 1
    assert any(m["type"] == "segment" and "hello world" in m["text"] for m in messages)


def test_the_live_websocket_refuses_a_wrong_key_or_bad_query(server) -> None:
    from websockets.sync.client import connect

    url, _ = server
    for query in ("api_key=sk-wrong", f"api_key={KEY}&step=99", f"api_key={KEY}&language=xx"):
        with connect(url.replace("http", "ws") + f"/v1/audio/live?{query}") as socket_:
            message = json.loads(socket_.recv(timeout=30))
            assert message["type"] == "error" and message["error"]["message"], query


def _wait_for(condition, seconds: float = 20) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def _ignore(call) -> None:
    try:
        call()
    except requests.RequestException:
        pass


@pytest.mark.parametrize("clip", ["librispeech/61-70968-0000.flac", "librispeech/2412-153948-0000.flac"])
def test_base_answers_are_the_words_transcribe_gives(base, clip: str) -> None:
    """The real model, four concurrent requests of two files: every answer is `transcribe`'s text."""
    path = evaldata(*clip.split("/"))
    expected = transcribe(base, str(path)).text.strip()
    app = create_app(base, None, ServerSettings(model_name="base"))
    with running_server(app) as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)

        def ask(_: int) -> str:
            with path.open("rb") as file:
                return client.audio.transcriptions.create(model="base", file=file).text

        with ThreadPoolExecutor(4) as pool:
            assert list(pool.map(ask, range(4))) == [expected] * 4


def test_asr_serve_runs_and_stops_on_ctrl_c(scripted_folder: Path) -> None:
    import signal
    import subprocess
    import sys

    port = free_port()
    process = subprocess.Popen([sys.executable, "-m", "asr", "serve", "--model", str(scripted_folder), "--port",
                                str(port), "--assistant", "none", "--threads", "1"], stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_for(lambda: process.poll() is not None or _answers(f"{url}/health"), 120)
        assert process.poll() is None, process.stderr.read()
        assert _post(url, files=_park(), key=None).json()["text"] == "hello world"
    finally:
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=60) == 0


def _answers(url: str) -> bool:
    try:
        return requests.get(url, timeout=2).ok
    except requests.RequestException:
        return False


@pytest.mark.parametrize("arguments, message", [
    (["--max-upload", "lots"], "expected a size such as 300MB or 2GiB, got 'lots'"),
    (["--port", "70000"], "65535"),
    (["--max-batch", "0"], ">= 1"),
    (["--api-key", " "], "empty key"),
    (["--model", "no-such-model", "--assistant", "none"], "no-such-model"),
])
def test_bad_options_are_one_line(arguments: list[str], message: str) -> None:
    from click.testing import CliRunner

    from asr.cli import main

    result = CliRunner().invoke(main, ["serve", *arguments])
    assert result.exit_code in (1, 2) and message in result.output, result.output


def test_a_short_request_is_not_held_up_by_a_long_one(scripted) -> None:
    """One place in the batch: a long recording (10 windows) yields it window by window, so a short request that
    arrives behind it is done after its own single window, long before the recording."""
    import asyncio

    from asr.serve.scheduler import Scheduler

    rng = np.random.default_rng(0)
    long_audio = rng.normal(0, 0.1, 300 * SAMPLE_RATE).astype(np.float32)
    short_audio = rng.normal(0, 0.1, 5 * SAMPLE_RATE).astype(np.float32)
    scheduler = Scheduler(scripted, None, max_batch=1, max_queue=4)

    async def both() -> list[str]:
        loop = asyncio.get_running_loop()
        finished: list[str] = []

        async def wait(job, name: str) -> None:
            while (await job.events.get()).kind != "done":
                pass
            finished.append(f"{name} after {scheduler.batches} batches")

        with scheduler.compute:  # both are in hand before the first batch
            long_job = scheduler.submit(long_audio, TranscribeOptions(language="en"), loop)
            short_job = scheduler.submit(short_audio, TranscribeOptions(language="en"), loop)
        await asyncio.gather(wait(long_job, "long"), wait(short_job, "short"))
        return finished

    try:
        finished = asyncio.run(both())
    finally:
        scheduler.stop()
    assert finished[0].startswith("short") and finished[0].endswith(" 2 batches"), finished
    assert finished[1].startswith("long"), finished
