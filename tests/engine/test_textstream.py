from __future__ import annotations

from engine.decoding.textstream import TextStream


def test_utf8_split_across_tokens_is_held_until_whole() -> None:
    s = TextStream()
    data = "é🎉".encode()
    assert s.push(data[:1]) == ""
    assert s.push(data[1:3]) == "é"
    assert s.push(data[3:]) == "🎉"
    assert s.flush() == ""


def test_stop_string_split_over_tokens() -> None:
    s = TextStream(["</end>"])
    assert s.push(b"hello </e") == "hello "
    assert not s.stopped
    assert s.push(b"nd> more") == ""
    assert s.stopped and s.flush() == ""


def test_false_alarm_is_released() -> None:
    s = TextStream(["STOP"])
    assert s.push(b"ST") == ""
    assert s.push(b"AY") == "STAY"
    assert s.push(b" S") == " "
    assert s.flush() == "S"


def test_earliest_stop_wins() -> None:
    s = TextStream(["b", "abc"])
    assert s.push(b"xxabc") == "xx"
    assert s.stopped
