"""Errors in the OpenAI API's JSON shape, and the guard on request bodies (size and pace).

OpenAI answers `{"error": {"message", "type", "param", "code"}}` with the status code that fits; clients such as
the `openai` package turn that into their own exceptions (BadRequestError, AuthenticationError, ...).
"""

from __future__ import annotations

import asyncio
import hmac
import json
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send


class APIError(Exception):
    """An error answered in OpenAI's shape."""

    def __init__(self, status: int, message: str, type: str = "invalid_request_error", code: str | None = None,
                 param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.code, self.param = status, message, type, code, param

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def check_key(request: Any, settings: Any, given: str | None = None) -> None:
    """Raises 401 unless the request carries the server's key (`Authorization: Bearer KEY`, or `given`)."""
    if settings.api_key is None:
        return
    if given is None:
        scheme, _, given = request.headers.get("authorization", "").partition(" ")
        given = given.strip() if scheme.lower() == "bearer" else ""
    if not hmac.compare_digest(given.encode(), settings.api_key.encode()):
        raise APIError(401, "Incorrect API key provided." if given else
                       "You didn't provide an API key (Authorization: Bearer KEY).", code="invalid_api_key")


def bad_request(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, param=param, code=code)


class TooLarge(APIError):
    def __init__(self, limit: int) -> None:
        super().__init__(413, f"the upload is larger than this server's limit of {describe_size(limit)}",
                         code="request_too_large")


class SlowClient(APIError):
    def __init__(self, timeout: float) -> None:
        super().__init__(408, f"the request body did not arrive within {timeout:g} s of waiting", code="timeout")


def describe_size(size: int) -> str:
    return f"{size / 1e6:g} MB" if size >= 1_000_000 else f"{size} bytes"


class BodyGuard:
    """ASGI middleware: a body over `limit` bytes is refused (413, by its Content-Length before it is read, else
    as soon as the bytes read pass the limit), and a client that pauses longer than `timeout` seconds while
    sending its body gets 408; both as OpenAI-shaped JSON, and the connection closes."""

    def __init__(self, app: ASGIApp, limit: int, timeout: float) -> None:
        self.app, self.limit, self.timeout = app, limit, timeout

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.limit:
            await send_error(send, TooLarge(self.limit))
            return
        received, body_done, started = 0, False, False

        async def guarded() -> Message:
            nonlocal received, body_done
            if body_done:  # after the body: a disconnect may take as long as it takes
                return await receive()
            try:
                message = await asyncio.wait_for(receive(), self.timeout)
            except asyncio.TimeoutError:
                raise SlowClient(self.timeout) from None
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                body_done = not message.get("more_body", False)
                if received > self.limit:
                    raise TooLarge(self.limit)
            return message

        async def tracked(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, guarded, tracked)
        except (TooLarge, SlowClient) as error:  # raised where the app read the body, outside its handlers
            if not started:
                await send_error(send, error)


async def send_error(send: Send, error: APIError) -> None:
    body = json.dumps(error.body()).encode()
    await send({"type": "http.response.start", "status": error.status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": body})
