"""LogFollower: pushes plus gap reads yield every index exactly once, in order."""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import given, settings, strategies as st

from contract.follower import REWIND_WINDOW, LogFollower


def entry(i: int) -> bytes:
    """The payload of log index ``i``."""
    return b"e%d" % i


def batch(first: int, count: int) -> list[bytes]:
    """Payloads of indices ``first .. first + count - 1``."""
    return [entry(i) for i in range(first, first + count)]


def test_starts_after_what_was_delivered() -> None:
    """A fresh follower expects index 1; a resumed one expects the index after its last."""
    assert LogFollower().next_index == 1
    assert LogFollower(delivered_up_to=41).next_index == 42


def test_in_order_batches_are_delivered_whole() -> None:
    """Contiguous batches come out as they went in, numbered from their first index."""
    follower = LogFollower()
    assert follower.offer(1, batch(1, 3)) == ([(1, b"e1"), (2, b"e2"), (3, b"e3")], False)
    assert follower.offer(4, batch(4, 1)) == ([(4, b"e4")], False)
    assert follower.next_index == 5


def test_duplicate_batch_is_dropped() -> None:
    """A batch already delivered yields nothing and reports no gap."""
    follower = LogFollower()
    follower.offer(1, batch(1, 3))
    assert follower.offer(1, batch(1, 3)) == ([], False)
    assert follower.offer(2, batch(2, 1)) == ([], False)
    assert follower.next_index == 4


def test_overlapping_batch_delivers_only_the_new_tail() -> None:
    """A batch that straddles the delivered position yields only the unseen entries."""
    follower = LogFollower()
    follower.offer(1, batch(1, 2))
    assert follower.offer(2, batch(2, 3)) == ([(3, b"e3"), (4, b"e4")], False)
    assert follower.next_index == 5


def test_gap_delivers_nothing_and_asks_for_a_read() -> None:
    """A batch beyond the next index is held back and signals a gap at next_index."""
    follower = LogFollower()
    follower.offer(1, batch(1, 1))
    assert follower.offer(4, batch(4, 2)) == ([], True)
    assert follower.next_index == 2


def test_single_missing_index_is_a_gap() -> None:
    """Missing exactly one index is already a gap."""
    follower = LogFollower()
    follower.offer(1, batch(1, 2))
    assert follower.offer(4, batch(4, 1)) == ([], True)
    assert follower.next_index == 3


def test_gap_filled_by_read_then_late_push_is_dropped() -> None:
    """After a read fills the gap, the late push and the held-back batch are duplicates."""
    follower = LogFollower()
    follower.offer(1, batch(1, 1))
    assert follower.offer(4, batch(4, 2))[1]
    read = follower.offer(follower.next_index, batch(2, 4))
    assert read == ([(2, b"e2"), (3, b"e3"), (4, b"e4"), (5, b"e5")], False)
    assert follower.offer(2, batch(2, 2)) == ([], False)
    assert follower.offer(4, batch(4, 2)) == ([], False)
    assert follower.offer(6, batch(6, 1)) == ([(6, b"e6")], False)


def test_resumed_follower_skips_what_the_client_has() -> None:
    """A follower resumed at k drops replays up to k and delivers from k + 1."""
    follower = LogFollower(delivered_up_to=3)
    assert follower.offer(1, batch(1, 5)) == ([(4, b"e4"), (5, b"e5")], False)


def test_duplicates_are_not_a_rewind_but_other_entries_are() -> None:
    """The same entries again are duplicates; another entry under a delivered index is the
    first index at which the log went back."""
    follower = LogFollower()
    follower.offer(1, batch(1, 10))
    assert follower.rewound_at(3, batch(3, 5)) is None
    assert follower.rewound_at(8, [entry(8), b"other", entry(10)]) == 9
    assert follower.rewound_at(10, [entry(10), b"x"]) is None, "index 11 is not delivered yet"
    assert LogFollower(delivered_up_to=5).rewound_at(1, [b"x"]) is None, "nothing to compare"


def test_rewind_delivers_again_from_the_index() -> None:
    """After a rewind the new entries under old indices are delivered, then compared anew."""
    follower = LogFollower()
    follower.offer(1, batch(1, 6))
    follower.rewind(4)
    assert follower.next_index == 4
    fresh, gap = follower.offer(4, [b"new4", b"new5"])
    assert (fresh, gap) == ([(4, b"new4"), (5, b"new5")], False)
    assert follower.rewound_at(4, [b"new4", b"new5"]) is None
    assert follower.rewound_at(4, [entry(4)]) == 4


def test_rewind_memory_is_a_bounded_window() -> None:
    """Only the last REWIND_WINDOW indices are compared; older ones read as duplicates."""
    follower = LogFollower()
    follower.offer(1, batch(1, REWIND_WINDOW + 10))
    assert follower.rewound_at(1, [b"x"]) is None
    assert follower.rewound_at(REWIND_WINDOW + 10, [b"x"]) == REWIND_WINDOW + 10


def test_empty_batch_at_next_index_changes_nothing() -> None:
    """An empty offer at the expected index is a no-op."""
    follower = LogFollower()
    assert follower.offer(1, []) == ([], False)
    assert follower.next_index == 1


# --------------------------------------------------------------------------- property


@dataclass(frozen=True, slots=True)
class Scenario:
    """A producer's batches and the order in which their pushes reach the consumer."""

    sizes: list[int]
    deliveries: list[int]
    read_page: int
    resumed_at: int


@st.composite
def scenarios(draw: st.DrawFn) -> Scenario:
    """Batches of 1..5 entries; pushes duplicated, reordered and dropped at random."""
    sizes = draw(st.lists(st.integers(1, 5), min_size=0, max_size=25))
    indices = st.integers(0, max(0, len(sizes) - 1))
    deliveries = draw(st.lists(indices, max_size=60)) if sizes else []
    total = sum(sizes)
    return Scenario(
        sizes=sizes,
        deliveries=deliveries,
        read_page=draw(st.integers(1, 8)),
        resumed_at=draw(st.integers(0, total)),
    )


class Consumer:
    """A consumer that follows pushes and reads the log (in pages) whenever it sees a gap."""

    def __init__(self, log: list[bytes], page: int, resumed_at: int) -> None:
        self.log = log
        self.page = page
        self.follower = LogFollower(delivered_up_to=resumed_at)
        self.delivered: list[tuple[int, bytes]] = []

    def take(self, entries: list[tuple[int, bytes]]) -> None:
        """Deliver, checking the order at every step, not only at the end."""
        for index, payload in entries:
            expected = self.delivered[-1][0] + 1 if self.delivered else index
            assert index == expected, (index, expected)
            self.delivered.append((index, payload))

    def read_log(self, visible: int) -> None:
        """Read the log from next_index up to ``visible`` entries, one page at a time."""
        while self.follower.next_index <= visible:
            first = self.follower.next_index
            rows = self.log[first - 1:min(visible, first - 1 + self.page)]
            fresh, gap = self.follower.offer(first, rows)
            assert not gap
            assert len(fresh) == len(rows)
            self.take(fresh)

    def push(self, first: int, payloads: list[bytes], visible: int) -> None:
        """Handle one push; on a gap read the log as far as it is written."""
        fresh, gap = self.follower.offer(first, payloads)
        if gap:
            assert fresh == []
            assert first > self.follower.next_index
            self.read_log(visible)
            fresh, gap = self.follower.offer(first, payloads)
            assert not gap
            assert fresh == []  # the read covered this batch, which was already written
        self.take(fresh)


@settings(max_examples=400, deadline=None)
@given(scenarios())
def test_any_push_interleaving_yields_each_index_once_in_order(scenario: Scenario) -> None:
    """Duplicated, reordered and dropped pushes plus gap reads deliver 1..n once, in order."""
    firsts: list[int] = []
    log: list[bytes] = []
    for size in scenario.sizes:
        firsts.append(len(log) + 1)
        log.extend(batch(len(log) + 1, size))
    consumer = Consumer(log, scenario.read_page, scenario.resumed_at)
    # The log holds at least every batch whose push was sent, so a push of batch j means
    # batches 0..j are readable.
    written = 0
    for j in scenario.deliveries:
        written = max(written, firsts[j] + scenario.sizes[j] - 1)
        consumer.push(firsts[j], batch(firsts[j], scenario.sizes[j]), written)
    # Reconnect catch-up: the subscriber says "you may have missed something", read it all.
    consumer.read_log(len(log))
    expected = [(i, entry(i)) for i in range(scenario.resumed_at + 1, len(log) + 1)]
    assert consumer.delivered == expected
    assert consumer.follower.next_index == len(log) + 1
