"""Server-Sent Events, parsed as the WHATWG HTML spec says (section "Interpreting an event stream").

Owns only the wire format, nothing about OpenAI payloads:
- lines end in CRLF, LF or CR, and may be split anywhere across network chunks;
- a line starting with `:` is a comment (servers and proxies send them as keep-alives);
- `field:value`, `field: value` (one leading space dropped) and a bare `field` are all valid;
- several `data:` lines in one event are joined with "\\n";
- `event:` names the event's type (default "message"), `id:` sets the last event id,
  `retry:` and unknown fields are ignored;
- a blank line dispatches the event; an event with no data is dropped, as is an
  event cut off by the end of the stream before its blank line;
- an event (or a line) that grows past MAX_EVENT_CHARS without ending raises EventTooLong: what a
  server sends is bounded before it is decoded further.
"""

from __future__ import annotations

import codecs
import re
from dataclasses import dataclass

_LINE_END = re.compile(r"\r\n|\r|\n")
MAX_EVENT_CHARS = 1 << 20  # an OpenAI chunk is a few hundred bytes; a megabyte unended is not a stream


class EventTooLong(ValueError):
    pass


@dataclass(frozen=True)
class Event:
    data: str
    event: str = "message"
    id: str | None = None


class Decoder:
    """Feed bytes or text as they arrive; get back the events each piece completed."""

    def __init__(self) -> None:
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._pending = ""
        self._started = False
        self._after_cr = False
        self._data: list[str] = []
        self._data_chars = 0
        self._type = ""
        self._last_id: str | None = None

    def feed(self, piece: bytes | str) -> list[Event]:
        text = self._utf8.decode(piece) if isinstance(piece, bytes) else piece
        if not self._started and text:
            self._started = True
            text = text.removeprefix("\ufeff")
        if self._after_cr and text.startswith("\n"):  # the LF of a CRLF split across pieces
            text = text[1:]
        if text:
            self._after_cr = text.endswith("\r")
        lines = _LINE_END.split(self._pending + text)
        self._pending = lines.pop()  # the unterminated rest
        events = []
        for line in lines:
            event = self.line(line)
            if event is not None:
                events.append(event)
        if len(self._pending) + self._data_chars > MAX_EVENT_CHARS:
            raise EventTooLong(f"an event of over {MAX_EVENT_CHARS:,} characters that did not end")
        return events

    def finish(self) -> list[Event]:
        """End of stream: an unterminated last line and an undispatched event are dropped."""
        events = self.feed(self._utf8.decode(b"", final=True))
        self._pending, self._data, self._type, self._data_chars = "", [], "", 0
        return events

    def line(self, line: str) -> Event | None:
        """One line without its terminator; returns the event a blank line dispatches."""
        if line == "":
            return self._dispatch()
        if line.startswith(":"):
            return None
        name, colon, value = line.partition(":")
        if colon and value.startswith(" "):
            value = value[1:]
        if name == "data":
            self._data.append(value)
            self._data_chars += len(value) + 1
        elif name == "event":
            self._type = value
        elif name == "id" and "\0" not in value:
            self._last_id = value
        return None

    def _dispatch(self) -> Event | None:
        data, kind = self._data, self._type
        self._data, self._type, self._data_chars = [], "", 0
        if not data:
            return None
        return Event(data="\n".join(data), event=kind or "message", id=self._last_id)


def parse(text: str | bytes) -> list[Event]:
    """All events of a complete stream."""
    decoder = Decoder()
    return decoder.feed(text) + decoder.finish()
