from proxy.routing.index import PrefixIndex


def chain(prefix: int, n: int) -> list[int]:
    """A fake chained hash list: distinct per (prefix, position)."""
    return [prefix * 1_000_000 + i for i in range(n)]


def test_longest_match_is_the_held_prefix():
    idx = PrefixIndex(default_capacity_blocks=1000)
    idx.insert("a", chain(1, 10))
    assert idx.match("a", chain(1, 10)) == 10
    assert idx.match("a", chain(1, 25)) == 10  # a longer, growing conversation
    assert idx.match("a", chain(1, 4)) == 4
    assert idx.match("a", chain(2, 10)) == 0
    assert idx.match("b", chain(1, 10)) == 0
    assert idx.match("a", []) == 0


def test_match_all_and_sizes():
    idx = PrefixIndex(default_capacity_blocks=1000)
    idx.insert("a", chain(1, 6))
    idx.insert("b", chain(1, 3))
    assert idx.match_all(["a", "b", "c"], chain(1, 8)) == {"a": 6, "b": 3, "c": 0}
    assert idx.size("a") == 6
    assert idx.size() == 9


def test_lru_evicts_old_conversation_tails_before_shared_roots():
    idx = PrefixIndex(default_capacity_blocks=8)
    shared = chain(9, 4)
    idx.insert("a", shared + chain(1, 4))  # 8 blocks: full
    idx.insert("a", shared + chain(2, 2))  # touches the shared root, adds 2 blocks
    assert idx.size("a") == 8
    # The shared system prompt survives; the old conversation lost its tail first.
    assert idx.match("a", shared) == 4
    assert idx.match("a", shared + chain(2, 2)) == 6
    assert idx.match("a", shared + chain(1, 4)) == 6  # 4 shared + 2 of the old tail left


def test_capacity_follows_the_engine_and_shrinking_evicts():
    idx = PrefixIndex(default_capacity_blocks=100)
    idx.insert("a", chain(1, 50))
    idx.set_capacity("a", 10)
    assert idx.capacity("a") == 10
    assert idx.size("a") == 10
    assert idx.match("a", chain(1, 50)) == 10  # the root half-chain is what stays
    assert idx.capacity("b") == 100


def test_removed_backend_entries_are_dropped():
    idx = PrefixIndex(default_capacity_blocks=100)
    idx.insert("a", chain(1, 5))
    idx.remove_backend("a")
    assert idx.match("a", chain(1, 5)) == 0
    assert idx.size() == 0
    assert idx.backends() == []


def test_recent_returns_most_recent_hashes_in_lru_order():
    idx = PrefixIndex(default_capacity_blocks=100)
    idx.insert("a", chain(1, 3))
    idx.insert("a", chain(2, 2))
    recent = idx.recent("a", 2)
    assert recent == [2_000_001, 2_000_000]  # root of the newest chain is the most recent
    assert idx.recent("zzz", 5) == []
