"""The bounded cache behind the route cache: what is in use stays."""

from __future__ import annotations

from flask_quota.core.generations import Generations


def test_an_entry_in_use_outlives_any_number_of_others() -> None:
    cache: Generations[int, str] = Generations(4)
    cache.put(0, "hot")
    for key in range(1, 100):
        cache.put(key, str(key))
        found = cache.current.get(0) or cache.recall(0)  # how callers read it
        assert found == "hot", key
    assert len(cache.current) <= 4 and len(cache.retired) <= 4


def test_entries_not_in_use_go_after_two_generations() -> None:
    cache: Generations[int, str] = Generations(2)
    for key in range(5):
        cache.put(key, str(key))
    assert cache.current == {4: "4"} and cache.retired == {2: "2", 3: "3"}
    assert cache.recall(0) is None and cache.recall(2) == "2"
    assert 2 in cache.current and 2 not in cache.retired  # moved, not copied
    cache.clear()
    assert cache.current == {} and cache.retired == {}
