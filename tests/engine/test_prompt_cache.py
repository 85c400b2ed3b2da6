from __future__ import annotations

from engine.host.prompt_cache import PromptStateCache, common_prefix


def test_common_prefix() -> None:
    assert common_prefix([1, 2, 3], [1, 2, 4]) == 2
    assert common_prefix([], [1]) == 0
    long = list(range(1000))
    assert common_prefix(long, [*long[:700], -1]) == 700
    assert common_prefix(long, long) == 1000


def test_best_match_lru_and_budget() -> None:
    c = PromptStateCache(max_bytes=10)
    c.put((1, 2, 3), b"aaaa")
    c.put((7, 8), b"bbbb")
    assert c.best([1, 2, 3, 4]) == ((1, 2, 3), 3)
    assert c.best([9]) is None
    assert c.get((1, 2, 3)) == b"aaaa"  # now most recently used
    c.put((5,), b"cccc")  # over budget: evicts (7, 8), the least recently used
    assert not c.contains((7, 8)) and c.contains((1, 2, 3)) and c.bytes_used == 8
    assert c.stats.evictions == 1


def test_extension_replaces_its_prefix_and_oversized_is_skipped() -> None:
    c = PromptStateCache(max_bytes=100)
    c.put((1, 2), b"x" * 10)
    c.put((1, 2, 3), b"y" * 20)
    assert len(c) == 1 and c.bytes_used == 20
    c.put((4,), b"z" * 101)
    assert not c.contains((4,))
