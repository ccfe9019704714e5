"""A settings key's index in object storage (against moto's S3 server): a run finds the parts of
its own keys by reading the nodes along their paths, in bytes that do not grow with the store
past a node's size, and writers adding at once lose nothing."""

import threading

import numpy as np
import pytest
from helpers import S3_ENV

from esmshard.store import key_index
from esmshard.store.key_index import Held, KeyIndex, no_entries, prefixes
from esmshard.store.keys import KEY_DTYPE
from esmshard.store.objects import Bucket, ObjectStore


@pytest.fixture
def bucket(port, monkeypatch, request):
    for name, value in S3_ENV.items():
        monkeypatch.setenv(name, value)
    return Bucket(ObjectStore(f"s3://lab/{request.node.name}", f"http://127.0.0.1:{port}"))


def random_keys(n: int, seed: int) -> np.ndarray:
    return np.frombuffer(np.random.default_rng(seed).bytes(16 * n), KEY_DTYPE)


def entries(keys: np.ndarray, n_parts: int, first: int = 0) -> Held:
    names = [f"{i:012x}-0000" for i in range(first, first + n_parts)]
    return Held(keys, (np.arange(keys.size) % n_parts).astype(np.uint32), names)


def as_set(held: Held) -> set[tuple[bytes, str]]:
    return set(zip(held.keys.tolist(), (held.names[code] for code in held.codes)))


def test_the_keys_asked_for_get_their_parts_and_no_others(bucket, monkeypatch):
    monkeypatch.setattr(key_index, "TOP_DIGITS", 2)
    keys = random_keys(3000, 1)
    KeyIndex(bucket, "k").add(entries(keys, 5))
    asked = np.concatenate([keys[::300], random_keys(10, 2)])  # 10 held, 10 not
    index = KeyIndex(bucket, "k")
    found = index.holders(asked)
    assert as_set(found) == as_set(entries(keys, 5).take(slice(None, None, 300)))
    # one top node a key's first two digits: the store's other nodes are not read
    assert index.nodes_read == np.unique(prefixes(asked, 2)).size


def test_full_nodes_freeze_and_every_entry_is_found_beneath(bucket, monkeypatch):
    monkeypatch.setattr(key_index, "TOP_DIGITS", 1)
    monkeypatch.setattr(key_index, "NODE_ENTRIES", 8)
    keys = random_keys(800, 3)
    index = KeyIndex(bucket, "k")
    runs = [entries(keys[start : start + 200], 3, first=start) for start in range(0, 800, 200)]
    for added in runs:  # four runs' merges, one after another
        index.add(added)
    assert as_set(index.holders(keys)) == as_set(key_index.joined(*runs))
    written = index.nodes_written
    index.add(runs[0])  # added again: nothing is written
    assert index.nodes_written == written
    one = KeyIndex(bucket, "k")
    found = one.holders(keys[7:8])
    assert len(found) == 1 and one.nodes_read <= 4  # the path of one key: log16(800 / 8) + 2


def test_bytes_read_for_a_few_keys_are_bounded_by_the_path_not_the_store(bucket, monkeypatch):
    monkeypatch.setattr(key_index, "TOP_DIGITS", 1)
    monkeypatch.setattr(key_index, "NODE_ENTRIES", 16)
    keys = random_keys(5000, 4)
    index = KeyIndex(bucket, "k")
    read = []
    for size in (500, 5000):  # the store grows tenfold
        index.add(entries(keys[:size], 40))
        before = bucket.received
        assert len(index.holders(keys[:20])) == 20
        read.append(bucket.received - before)
    node = 16 * key_index.ENTRY.itemsize + 40 * 20  # entries, and the names of 40 parts
    assert read[1] <= 20 * 4 * node, read  # four levels at most along each path


def test_two_writers_at_once_lose_no_entry(bucket, monkeypatch):
    monkeypatch.setattr(key_index, "TOP_DIGITS", 1)
    monkeypatch.setattr(key_index, "NODE_ENTRIES", 32)
    keys = random_keys(1200, 5)
    halves = [entries(keys[:600], 2, first=0), entries(keys[600:], 2, first=10)]
    writers = [threading.Thread(target=KeyIndex(bucket, "k").add, args=(h,)) for h in halves]
    for writer in writers:
        writer.start()
    for writer in writers:
        writer.join()
    assert as_set(KeyIndex(bucket, "k").holders(keys)) == as_set(key_index.joined(*halves))


def test_the_index_says_it_is_whole_only_once_marked(bucket):
    index = KeyIndex(bucket, "k")
    assert not index.exists()
    index.add(no_entries())
    assert not index.exists()
    index.mark()
    assert index.exists()


def test_prefixes_are_a_keys_leading_hex_digits():
    keys = np.array([bytes.fromhex("abcdef0123456789" + "00" * 8)], KEY_DTYPE)
    assert [int(prefixes(keys, d)[0]) for d in (1, 3, 5)] == [0xA, 0xABC, 0xABCDE]
