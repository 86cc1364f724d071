"""aiohttp's server as the gateway runs it: a request aiohttp cannot parse is answered with a fixed text.

aiohttp answers a malformed request itself (its parser's error never reaches the application) with the
parser's message, and that quotes the offending bytes: a header over 8,190 bytes came back in the 400,
and went to the log, with its first 100 characters, which for `Authorization: Basic ...` is the base64
of `cluster:secret`. Here the answer names only the kind of error (`MALFORMED`), never the request's
bytes; `intake.HttpLog` logs it the same way. aiohttp has no option for this, so its request handler is
subclassed where it builds that answer, and the runner makes its server with it.
"""

from __future__ import annotations

from http import HTTPStatus

from aiohttp import web
from aiohttp.http_exceptions import (
    BadHttpMethod,
    BadStatusLine,
    HttpProcessingError,
    InvalidHeader,
    InvalidURLError,
    LineTooLong,
)
from aiohttp.web_protocol import RequestHandler
from aiohttp.web_request import BaseRequest

MALFORMED: list[tuple[type[HttpProcessingError], str]] = [
    (LineTooLong, "the request line or a header is too long (8190 bytes at most)"),
    (BadHttpMethod, "not an HTTP request, or an unknown method"),
    (BadStatusLine, "malformed request line"),
    (InvalidURLError, "malformed request target"),
    (InvalidHeader, "malformed header"),
]
"""What a malformed request is told, by the parser's error (the first that matches); anything else of the
parser is "malformed HTTP request"."""


def malformed_text(exc: BaseException) -> str:
    """The fixed words for a parser error: what kind it is, never what the request carried."""
    return next((text for kind, text in MALFORMED if isinstance(exc, kind)), "malformed HTTP request")


class QuietRequestHandler(RequestHandler):
    """aiohttp's connection handler, but the answer to what its parser refused quotes nothing."""

    def handle_error(
        self,
        request: BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        if isinstance(exc, HttpProcessingError):
            phrase = next((s.phrase for s in HTTPStatus if s.value == status), "Error")
            message = f"{status} {phrase}: {malformed_text(exc)}"
        return super().handle_error(request, status, exc, message)


class QuietServer(web.Server):
    """aiohttp's server, with `QuietRequestHandler` for its connections."""

    def __call__(self) -> RequestHandler:
        return QuietRequestHandler(self, loop=self._loop, **self._kwargs)


class GatewayRunner(web.AppRunner):
    """`web.AppRunner` whose server is a `QuietServer` (the same application, settings and handler)."""

    async def _make_server(self) -> web.Server:
        made = await super()._make_server()
        return QuietServer(
            made.request_handler,
            request_factory=made.request_factory,
            handler_cancellation=made.handler_cancellation,
            loop=made._loop,
            **made._kwargs,
        )
