"""`asr serve` under load: N concurrent clients on this machine's loopback against the same requests served one at
a time; every answer checked against `transcribe`'s words, and the server's memory over many requests.

    python scripts/bench_serve.py                                    # -> docs/figures/serve.{json,md}
    python scripts/bench_serve.py --model tiny.en --memory 1000 --rounds 0 --out docs/figures/serve-memory
    python scripts/bench_serve.py --dtype int8 --out docs/figures/serve-int8
    python scripts/bench_serve.py --device cuda --dtype float16 --out /tmp/serve-gpu          # on a GPU

A round: the requests one at a time (each waits for the last answer), then all of them at once from
`--clients` threads; rounds interleave the two so that both see the same machine. The requests: English
evaluation recordings of 10-30 s (client i sends recording i modulo their number). The server runs as
`asr serve` in its own process with `--threads` (2), `--max-batch` (16), `--dtype` (float32) and the default
`--assistant auto`; the reference words come from `transcribe` in this process with the same model, precision and
assistant. `--memory N`
then sends N more requests (the shortest recording, `--clients` at a time) and samples the server's resident
memory after each tenth of them.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from benchlib import REPO, command_line, figure_path, free_port, machine, use_threads, wer_items, write_figures

FOLDERS = ("librispeech", "ljspeech", "clips", "spontaneous", "fleurs")


def _recordings() -> list[dict]:
    items = [i for i in wer_items(FOLDERS, skip_missing=True) if 10 <= i["duration_s"] <= 30]
    if not items:
        sys.exit("no English evaluation recordings of 10-30 s found (set ASSISTED_WHISPER_EVALDATA)")
    return items


def _reference_texts(model: str, dtype: str, device: str, paths: list[str], threads: int) -> list[str]:
    from asr.assist.choose import load_pair
    from asr.models.precision import resolve_precision
    from asr.transcription import Transcriber

    use_threads(threads)
    bundle, assistant = load_pair(model, "auto", device=device, dtype=resolve_precision(dtype, device.split(":")[0]))
    transcriber = Transcriber(bundle, assistant=assistant)
    return [transcriber.transcribe_many([path], batch_size=1)[0].text.strip() for path in paths]


def _start_server(model: str, dtype: str, device: str, threads: int, max_batch: int) -> tuple[subprocess.Popen, str]:
    port = free_port()
    process = subprocess.Popen([sys.executable, "-m", "asr", "serve", "--model", model, "--dtype", dtype,
                                "--device", device,
                                "--port", str(port), "--threads", str(threads), "--max-batch", str(max_batch),
                                "--max-queue", "256",
                                "--log-level", "warning"], cwd=REPO)
    url = f"http://127.0.0.1:{port}"
    import requests

    deadline = time.monotonic() + 300
    while True:
        try:
            if requests.get(f"{url}/health", timeout=2).ok:
                return process, url
        except requests.RequestException:
            pass
        if process.poll() is not None or time.monotonic() > deadline:
            sys.exit("the server did not start")
        time.sleep(0.5)


def _ask(client, path: str) -> tuple[str, float]:
    started = time.perf_counter()
    with open(path, "rb") as file:
        text = client.audio.transcriptions.create(model="whisper-1", file=file).text
    return text, time.perf_counter() - started


def _serial(client, paths: list[str]) -> tuple[float, list[str], list[float]]:
    started = time.perf_counter()
    answers = [_ask(client, path) for path in paths]
    return time.perf_counter() - started, [a[0] for a in answers], [a[1] for a in answers]


def _concurrent(client, paths: list[str]) -> tuple[float, list[str], list[float]]:
    started = time.perf_counter()
    with ThreadPoolExecutor(len(paths)) as pool:
        answers = list(pool.map(lambda path: _ask(client, path), paths))
    return time.perf_counter() - started, [a[0] for a in answers], [a[1] for a in answers]


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="base")
    parser.add_argument("--dtype", default="float32", help="the model's precision (`asr serve --dtype`)")
    parser.add_argument("--device", default="cpu", help="`asr serve --device` (cpu, cuda, cuda:N)")
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--max-batch", type=int, default=16)
    parser.add_argument("--memory", type=int, default=0, metavar="N", help="then N more requests, memory sampled")
    parser.add_argument("--out", default=str(figure_path("serve")))
    args = parser.parse_args()
    import openai

    items = _recordings()
    paths = [items[i % len(items)]["audio"] for i in range(args.clients)]
    seconds = sum(items[i % len(items)]["duration_s"] for i in range(args.clients))
    expected = _reference_texts(args.model, args.dtype, args.device, paths, args.threads) if args.rounds else []
    found = machine()
    process, url = _start_server(args.model, args.dtype, args.device, args.threads, args.max_batch)
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=3600)
    data: dict = {"model": args.model, "dtype": args.dtype, "device": args.device, "clients": args.clients,
                  "max_batch": args.max_batch,
                  "audio_seconds": round(seconds, 2), "recordings": sorted({Path(p).name for p in paths}), "rounds": []}
    try:
        _ask(client, paths[0])  # warm up: the first pass of each kernel
        for number in range(args.rounds):
            serial, serial_texts, serial_latency = _serial(client, paths)
            together, texts, latency = _concurrent(client, paths)
            data["rounds"].append({"serial_seconds": round(serial, 3), "concurrent_seconds": round(together, 3),
                                   "serial_latency": [round(x, 3) for x in serial_latency],
                                   "concurrent_latency": [round(x, 3) for x in latency],
                                   "serial_exact": serial_texts == expected, "concurrent_exact": texts == expected,
                                   "wrong": [p for p, t, e in zip(paths, texts, expected) if t != e]})
            print(f"round {number + 1}: one at a time {serial:.1f} s, {args.clients} at once {together:.1f} s "
                  f"({serial / together:.2f}x); exact {serial_texts == expected}/{texts == expected}", flush=True)
        if args.memory:
            data["memory"] = _memory(client, process.pid, min(paths, key=os.path.getsize), args)
    finally:
        process.send_signal(signal.SIGINT)
        process.wait(timeout=60)
    write_figures(args.out, data, _table(data), command_line(), found)
    print(_table(data))


def _memory(client, pid: int, path: str, args) -> dict:
    samples, done = [], 0
    tenth = max(1, args.memory // 10)
    with ThreadPoolExecutor(args.clients) as pool:
        while done < args.memory:
            count = min(tenth, args.memory - done)
            list(pool.map(lambda _: _ask(client, path), range(count)))
            done += count
            samples.append((done, round(_rss_mb(pid), 1)))
            print(f"{done} requests: server RSS {samples[-1][1]} MB", flush=True)
    return {"requests": args.memory, "recording": Path(path).name, "rss_mb": samples}


def _table(data: dict) -> str:
    lines = []
    if data["rounds"]:
        rounds = data["rounds"]
        serial = statistics.median(r["serial_seconds"] for r in rounds)
        together = statistics.median(r["concurrent_seconds"] for r in rounds)
        serial_latency = [x for r in rounds for x in r["serial_latency"]]
        latency = [x for r in rounds for x in r["concurrent_latency"]]
        exact = all(r["serial_exact"] and r["concurrent_exact"] for r in rounds)
        audio = data["audio_seconds"]
        lines += [f"{data['clients']} requests of 10-30 s ({audio:.0f} s of audio), `{data['model']}` "
                  f"({data.get('dtype', 'float32')}{', ' + data['device'] if data.get('device', 'cpu') != 'cpu' else ''}), "
                  f"--max-batch {data['max_batch']}, median of {len(rounds)} interleaved rounds:", "",
                  "| | wall s | audio s per s | latency p50 s | latency p99 s | answers = `transcribe` |",
                  "| --- | --- | --- | --- | --- | --- |",
                  f"| one at a time | {serial:.1f} | {audio / serial:.1f} | {_percentile(serial_latency, 0.5):.2f} | "
                  f"{_percentile(serial_latency, 0.99):.2f} | {all(r['serial_exact'] for r in rounds)} |",
                  f"| {data['clients']} at once | {together:.1f} | {audio / together:.1f} | "
                  f"{_percentile(latency, 0.5):.2f} | {_percentile(latency, 0.99):.2f} | "
                  f"{all(r['concurrent_exact'] for r in rounds)} |", "",
                  f"Throughput {serial / together:.2f}x one at a time; every answer the words `transcribe` gives: "
                  f"{exact}."]
    if "memory" in data:
        memory = data["memory"]
        rss = [mb for _, mb in memory["rss_mb"]]
        lines += ["" if lines else "", f"Server memory over {memory['requests']} requests of "
                  f"{memory['recording']} (`{data['model']}`): resident MB after each tenth: "
                  f"{', '.join(f'{mb:.0f}' for mb in rss)} (first to last {rss[-1] - rss[0]:+.0f} MB)."]
    return "\n".join(lines).strip() + "\n"


if __name__ == "__main__":
    main()
