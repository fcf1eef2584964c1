"""`asr serve`: the OpenAI-compatible transcription server (`asr.serve`) under uvicorn."""

from __future__ import annotations

import click

from asr.cli.runtime import parse_offload, runtime_options, setup_runtime

SERVE_EXTRA = "the server needs FastAPI and uvicorn: pip install 'assisted-whisper[serve]'"


@click.command("serve", context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on (0.0.0.0: every interface; then set an --api-key).")
@click.option("--port", default=8000, show_default=True, type=int)
@click.option("--model", default="base", show_default=True, help="Model name (see `asr models`), hub id or folder.")
@click.option("--assistant", default="auto", show_default=True,
              help="Drafts a request decoded alone (auto: the shipped draft where it pays; none: plain decoding). "
                   "Concurrent requests are decoded together, as one batch.")
@click.option("--api-key", envvar="ASR_API_KEY", default=None,
              help="Requests must carry `Authorization: Bearer KEY` [env: ASR_API_KEY] (default: no key).")
@click.option("--max-upload", default="25MB", show_default=True, metavar="SIZE",
              help="Largest upload accepted (413 beyond it).")
@click.option("--max-batch", default=8, show_default=True, type=int,
              help="Windows of concurrent requests decoded together.")
@click.option("--max-queue", default=64, show_default=True, type=int,
              help="Requests waiting beyond those being decoded; one more is answered 503.")
@runtime_options(threads_help="Torch CPU threads.")
@click.option("--log-level", type=click.Choice(["critical", "error", "warning", "info", "debug"]), default="info",
              show_default=True)
def serve_command(host, port, model, assistant, api_key, max_upload, max_batch, max_queue, device, dtype, offload,
                  offload_folder, max_memory, threads, log_level) -> None:
    """Serve OpenAI's audio API (POST /v1/audio/transcriptions and /translations, GET /v1/models), a live
    WebSocket (/v1/audio/live) and a page for people (/) with one model loaded once.

    Point the OpenAI SDK at it: OpenAI(base_url="http://127.0.0.1:8000/v1", api_key=KEY or "none").
    """
    from importlib.util import find_spec

    if not all(find_spec(name) for name in ("fastapi", "uvicorn", "python_multipart")):
        raise click.ClickException(SERVE_EXTRA)
    import uvicorn

    from asr.assist.choose import load_pair
    from asr.cli.options import describe_assistant
    from asr.serve import ServerSettings, create_app
    from asr.models.offload import parse_size

    if not 0 <= port <= 65535:
        raise click.BadParameter(f"must be from 0 to 65535, got {port}", param_hint="--port")
    if max_batch < 1:
        raise click.BadParameter(f"must be >= 1, got {max_batch}", param_hint="--max-batch")
    if max_queue < 0:
        raise click.BadParameter(f"must be >= 0, got {max_queue}", param_hint="--max-queue")
    try:
        limit = parse_size(max_upload, "--max-upload")
    except ValueError as error:
        raise click.BadParameter(str(error).removeprefix("--max-upload: "), param_hint="--max-upload") from None
    if api_key is not None and not api_key.strip():
        raise click.BadParameter("an empty key would let anyone in; omit --api-key for no key", param_hint="--api-key")
    device, precision = setup_runtime(device, dtype, threads)
    offloading = parse_offload(offload, offload_folder, max_memory)
    click.echo(f"loading {model} on {device} ({str(precision).removeprefix('torch.')})", err=True)
    try:
        bundle, chosen = load_pair(model, assistant, device=device, dtype=precision, offload=offloading)
    except ValueError as error:
        raise click.ClickException(str(error)) from None
    click.echo(describe_assistant(assistant, chosen), err=True)
    if host not in ("127.0.0.1", "localhost", "::1") and api_key is None:
        click.echo(f"warning: listening on {host} without --api-key: anyone who reaches it can use it", err=True)
    settings = ServerSettings(model_name=model, api_key=api_key, max_upload=limit, max_batch=max_batch,
                              max_queue=max_queue)
    app = create_app(bundle, chosen, settings)
    uvicorn.run(app, host=host, port=port, log_level=log_level, timeout_graceful_shutdown=5)
