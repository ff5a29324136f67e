"""checkpoint.check_spans, the one span check safetensors and GGUF headers share: spans that touch are fine, a
one-byte overlap is not, and an end one byte past the buffer is refused (each format in its own words)."""

from __future__ import annotations

import pytest

from explorer.checkpoint.index import check_spans
from explorer.errors import CheckpointError

GGUF = {"of": " of the data", "buffer": "the file's {size:,} data bytes"}


def test_spans_that_touch_and_end_at_the_buffer_pass():
    check_spans([(4, 8, "b"), (0, 4, "a")], "x", 8)
    check_spans([(0, 4, "a"), (4, 8, "b")], "x", 8, **GGUF)


def test_a_one_byte_overlap_is_refused():
    with pytest.raises(CheckpointError) as info:
        check_spans([(0, 5, "a"), (4, 8, "b")], "x", None)
    assert info.value.reason == "tensors 'a' and 'b' overlap (bytes 4–5)"
    with pytest.raises(CheckpointError) as info:
        check_spans([(0, 5, "a"), (4, 8, "b")], "x", None, **GGUF)
    assert info.value.reason == "tensors 'a' and 'b' overlap (bytes 4–5 of the data)"


def test_an_end_one_byte_past_the_buffer_is_refused():
    with pytest.raises(CheckpointError) as info:
        check_spans([(0, 4, "a"), (4, 9, "b")], "x", 8)
    assert info.value.reason == "tensor 'b' ends at byte 9, past the data buffer (8 bytes)"
    with pytest.raises(CheckpointError) as info:
        check_spans([(0, 4, "a")], "x", -3, **GGUF)
    assert info.value.reason == "tensor 'a' ends at byte 4 of the data, past the file's 0 data bytes"
