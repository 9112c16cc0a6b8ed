"""What a session's input log keeps for its checkpoints (``inference_worker/input_hold.py``).

The trim never passes the last checkpoint's oldest entry, nor the entry that holds the input
buffer's first byte, unless what they hold is past the bounds: then it goes to what was
applied, the checkpoint is forfeit (said once), and the buffer's first entry is known to be
gone rather than guessed.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from inference_worker.input_hold import InputHold

pytestmark = pytest.mark.timeout(60)

FENCE = 2


def applied(hold: InputHold, audio: list[int], *, start: int = 1, size: int = 100,
            heard: int = 0) -> int:
    """Entries ``start, ...`` applied, each with ``audio[i]`` bytes of audio, after ``heard``
    bytes of audio; the audio heard then."""
    for offset, length in enumerate(audio):
        heard += length
        hold.applied(FENCE, start + offset, heard, size)
    return heard


def test_the_buffer_and_the_checkpoint_hold_their_entries() -> None:
    """Entry 1 a command without audio, 2-5 of 10 bytes each. A buffer of the last 25 bytes
    starts in entry 3; with none, nothing is held. A checkpoint that keeps entry 3 holds it
    after the buffer moved on."""
    hold = InputHold(max_entries=100, max_bytes=10_000)
    heard = applied(hold, [0, 10, 10, 10, 10])
    start = hold.buffer_start(heard, 25)
    assert start is not None and start.index == 3
    assert hold.trim_to(5, heard, 25) == (3, False)
    assert hold.buffer_start(heard, 0) is None
    hold.written(start)
    assert hold.trim_to(5, heard, 0) == (3, False)
    heard = applied(hold, [10, 10], start=6, heard=heard)
    assert hold.trim_to(7, heard, 5) == (3, False)  # the buffer: entry 7; the checkpoint: 3
    hold.written(hold.at_end(FENCE, 7, heard))
    assert hold.trim_to(7, heard, 0) == (7, False)


def test_past_the_entry_bound_the_trim_overtakes_the_checkpoint_once() -> None:
    hold = InputHold(max_entries=10, max_bytes=10_000)
    heard = applied(hold, [0])
    hold.written(hold.at_end(FENCE, 1, heard))
    heard = applied(hold, [10] * 10, start=2, heard=heard)
    assert hold.trim_to(11, heard, 100) == (1, False)  # 10 entries held: at the bound
    heard = applied(hold, [10], start=12, heard=heard)
    assert hold.trim_to(12, heard, 110) == (12, True)
    assert hold.keep is None
    with pytest.raises(LookupError):
        hold.buffer_start(heard, 110)  # its first entry is gone: no checkpoint can keep it
    assert hold.trim_to(12, heard, 110) == (12, False)  # nothing more to forfeit
    kept = hold.buffer_start(heard, 5)
    assert kept is not None and kept.index == 12, (
        "the entry the trim went to stays in the log, and its audio can still be read back")
    heard = applied(hold, [10, 10], start=13, heard=heard)
    with pytest.raises(LookupError):
        hold.buffer_start(heard, 130)  # the newer entries do not hold its first byte
    last = hold.buffer_start(heard, 10)
    assert last is not None and last.index == 14  # a buffer begun since is found


def test_past_the_byte_bound_the_trim_overtakes_the_checkpoint() -> None:
    hold = InputHold(max_entries=100, max_bytes=1_000)
    heard = applied(hold, [0], size=10)
    hold.written(hold.at_end(FENCE, 1, heard))
    heard = applied(hold, [0] * 4, start=2, size=250)
    assert hold.trim_to(5, heard, 0) == (1, False)  # 1,000 bytes held after entry 1
    heard = applied(hold, [0], start=6, size=1)
    assert hold.trim_to(6, heard, 0) == (6, True)


@settings(max_examples=300, deadline=None)
@given(steps=st.lists(st.tuples(st.integers(0, 30), st.integers(0, 400), st.booleans()),
                      min_size=1, max_size=60),
       max_entries=st.integers(1, 40))
def test_the_trim_keeps_what_a_checkpoint_and_the_buffer_need(
        steps: list[tuple[int, int, bool]], max_entries: int) -> None:
    """Random entries (audio lengths), buffers (any tail of the audio) and checkpoints: the
    trim bound never passes the buffer's first entry or the checkpoint's, unless it said it
    overtook the checkpoint or the buffer held more than the bound; and a buffer start it
    finds really holds the buffer's first byte."""
    hold = InputHold(max_entries=max_entries, max_bytes=1 << 30)
    heard, firsts = 0, [0]  # firsts[i]: the audio heard before entry i + 1
    for index, (audio, buffered, checkpoint) in enumerate(steps, start=1):
        firsts.append(heard + audio)
        heard += audio
        hold.applied(FENCE, index, heard, 10)
        kept = min(buffered, heard)
        try:
            start = hold.buffer_start(heard, kept)
        except LookupError:
            start = None
        else:
            if start is not None:
                assert firsts[start.index - 1] <= heard - kept < firsts[start.index]
        keep = hold.keep
        bound, overtaken = hold.trim_to(index, heard, kept)
        for needed in (keep, start):
            if needed is not None and not overtaken and bound > needed.index:
                assert index - needed.index > max_entries
        if checkpoint:  # as the worker takes one: refused where the buffer's entry is gone
            try:
                hold.written(hold.buffer_start(heard, kept) or hold.at_end(FENCE, index, heard))
            except LookupError:
                pass
