"""What both native relays share: an upstream SSE stream passed to the client frame by frame as it
arrives, each event's JSON read on the way (to store the answer), and the stream's end checked."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable

from gateway.errors import UpstreamError
from gateway.pipeline.call import ChatOutcome
from gateway.pipeline.stream import FrameSplitter, frame_data, parse_chunk
from gateway.ports import JSONObject, UpstreamResponse

BeforeDone = Callable[[ChatOutcome], Awaitable[None]]


class EventRelay:
    """Subclasses say how to read an event, whether the answer is finished, and how the API's in-band
    error frame looks; `_release_done()` runs the before-done hook once (thin mode, chains)."""

    def __init__(self, response: UpstreamResponse, before_done: BeforeDone | None = None) -> None:
        self._response = response
        self._before_done = before_done
        self._error: str | None = None

    async def frames(self) -> AsyncIterator[bytes]:
        splitter = FrameSplitter()
        try:
            async for chunk in self._response.body:
                for frame in splitter.feed(chunk):
                    data = frame_data(frame)
                    event = parse_chunk(data) if data is not None else None
                    if event is not None:
                        await self._read(event)
                    yield frame
        except UpstreamError as exc:
            self._error = exc.message
            yield self._error_frame(exc.status, exc.message)
            return
        rest = splitter.rest()
        if rest.strip():
            yield rest
        if not self._ended():
            self._error = "upstream stream ended before the answer was complete"
            yield self._error_frame(502, self._error)

    async def _release_done(self) -> None:
        if self._before_done is not None:
            hook, self._before_done = self._before_done, None
            await hook(self.outcome(200, disconnected=False))

    async def _read(self, event: JSONObject) -> None:
        raise NotImplementedError

    def _ended(self) -> bool:
        """The stream said it was over (finished, or failed in-band)."""
        raise NotImplementedError

    def _error_frame(self, status: int, message: str) -> bytes:
        raise NotImplementedError

    def outcome(self, http_status: int, *, disconnected: bool) -> ChatOutcome:
        raise NotImplementedError
