"""The SSE parser against the spec's own rules (WHATWG HTML, "Interpreting an event stream").
Simulates nothing: the inputs are wire text, as servers and proxies send it."""

from __future__ import annotations

import pytest

from rigkit.verify.sse import Decoder, Event, parse


def test_data_with_and_without_the_space_after_the_colon():
    assert parse("data: a\n\ndata:b\n\ndata:  c\n\n") == [Event("a"), Event("b"), Event(" c")]


def test_several_data_lines_join_with_newlines_into_one_event():
    assert parse('data: {"a":\ndata: 1}\n\n') == [Event('{"a":\n1}')]


def test_comments_are_keep_alives_not_events():
    assert parse(": keep-alive\n\n:ping\ndata: x\n\n: bye\n\n") == [Event("x")]


def test_event_and_id_lines_name_the_event():
    assert parse("event: error\nid: 7\ndata: boom\n\ndata: next\n\n") == [
        Event("boom", "error", "7"), Event("next", "message", "7")]


def test_a_blank_line_dispatches_and_an_event_without_data_is_dropped():
    assert parse("event: ping\n\nretry: 10\nunknown: x\n\n") == []


@pytest.mark.parametrize("end", ["\n", "\r\n", "\r"])
def test_every_line_ending_the_spec_allows(end):
    text = f"data: a{end}data: b{end}{end}data: c{end}{end}"
    assert parse(text) == [Event("a\nb"), Event("c")]


def test_a_bare_field_name_is_a_field_with_an_empty_value():
    assert parse("data\ndata\n\n") == [Event("\n")]


def test_an_event_cut_off_by_the_end_of_the_stream_is_not_dispatched():
    assert parse("data: whole\n\ndata: cut") == [Event("whole")]
    assert parse("data: whole\n\ndata: cut\n") == [Event("whole")]


def test_pieces_split_anywhere_even_inside_a_crlf_or_a_utf8_character():
    wire = "\ufeffdata: é1\r\n\r\n: c\r\ndata:2\r\n\r\n".encode()
    for size in (1, 2, 3, 5):
        decoder, events = Decoder(), []
        for i in range(0, len(wire), size):
            events += decoder.feed(wire[i:i + size])
        events += decoder.finish()
        assert events == [Event("é1"), Event("2")], size


def test_the_event_arrives_with_the_piece_that_holds_its_blank_line():
    decoder = Decoder()
    assert decoder.feed("data: a\n") == []
    assert decoder.feed("\n") == [Event("a")]


def test_an_event_that_never_ends_is_bounded():
    """A server that sends data without ever ending the line or the event: the decoder stops at
    MAX_EVENT_CHARS instead of holding it all; an event of that size that ends is not what it refuses."""
    import pytest

    from rigkit.verify.sse import MAX_EVENT_CHARS, EventTooLong

    endless = Decoder()
    with pytest.raises(EventTooLong):
        for _ in range(MAX_EVENT_CHARS // 4096 + 2):
            endless.feed(b"data: " + b"x" * 4096)
    many_lines = Decoder()
    with pytest.raises(EventTooLong):
        for _ in range(MAX_EVENT_CHARS // 4096 + 2):
            many_lines.feed(b"data: " + b"x" * 4096 + b"\n")
    assert parse(b"data: " + b"y" * (MAX_EVENT_CHARS // 2) + b"\n\n")[0].data == "y" * (MAX_EVENT_CHARS // 2)
