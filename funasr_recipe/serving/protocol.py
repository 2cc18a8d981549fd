"""uvicorn's h11 protocol with the two limits it lacks: a deadline for a request's headers and a cap on
open connections.

uvicorn 0.54 arms no timer until a first response is complete (its keep-alive timer, which any byte
received cancels), so a client that sends half a request line holds its connection, and a file
descriptor, for ever: measured, 19,900 stalled connections were all still open after 100 s. Its
``limit_concurrency`` answers 503 to a *request* over the limit, which a client that never completes
its headers never makes. Reads and writes nothing.

  uvicorn.Config(app, http=guarded_protocol(header_timeout_s=10, max_connections=512, on_refused=f))
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from uvicorn.protocols.http.h11_impl import H11Protocol

log = logging.getLogger(__name__)


def guarded_protocol(header_timeout_s: float, max_connections: int,
                     on_refused: Callable[[str], None] | None = None) -> type[H11Protocol]:
    """An H11Protocol class that closes a connection whose next request's headers have not all arrived
    ``header_timeout_s`` after it opened or after its last response, and closes at once a connection
    beyond ``max_connections`` open ones; ``on_refused(reason)`` counts each (an idle keep-alive
    connection closed at its deadline is not counted: it sent nothing wrong)."""

    class GuardedH11Protocol(H11Protocol):
        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._header_timer: asyncio.TimerHandle | None = None
            if len(self.connections) > max_connections:
                self._refuse("too_many_connections")
                return
            self._arm()

        def _refuse(self, reason: str) -> None:
            if on_refused is not None:
                on_refused(reason)
            if not self.transport.is_closing():
                self.transport.close()

        def _arm(self) -> None:
            self._disarm()
            self._partial = False  # bytes of the next request seen: a stall, not an idle keep-alive
            self._header_timer = self.loop.call_later(header_timeout_s, self._headers_late)

        def data_received(self, data: bytes) -> None:
            self._partial = True
            super().data_received(data)

        def _disarm(self) -> None:
            if getattr(self, "_header_timer", None) is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _waiting_for_headers(self) -> bool:
            return self.cycle is None or self.cycle.response_complete

        def _headers_late(self) -> None:
            self._header_timer = None
            if not self._waiting_for_headers():
                return
            if self._partial or self.cycle is None:  # a stalled request, or a connection that sent none
                self._refuse("header_timeout")
            elif not self.transport.is_closing():  # an idle keep-alive connection: closed, not an error
                self.transport.close()

        def handle_events(self) -> None:
            super().handle_events()
            if not self._waiting_for_headers():  # a request's headers arrived: its body has its own limits
                self._disarm()

        def on_response_complete(self) -> None:
            self._arm()  # before super(), whose handle_events may start a pipelined request at once
            super().on_response_complete()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

    return GuardedH11Protocol
