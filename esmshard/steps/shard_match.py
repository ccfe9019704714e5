"""The shard step's matching: each record's sequence key against the other records' and the
store's, one bucket of keys at a time (an external hash partition by the key's first byte).
"""

import logging
import os
from pathlib import Path
from typing import NamedTuple

import numpy as np

from ..files import Buckets
from ..store import KEY_BYTES, KEY_DTYPE, Store, check_part, rows_of, set_aside
from ..store.parts import add_to_index, stored_keys

N_BUCKETS = 256
RECORDS_AT_ONCE = 1 << 22
STORED_ENTRY = np.dtype([("key", KEY_DTYPE), ("value", np.int32)])  # value: the part's number

log = logging.getLogger(__name__)


class KeyBuckets:
    """(key, value) entries spread over files by the key's first byte, so that each bucket
    can be matched in memory on its own (an external hash partition)."""

    def __init__(self, stem: Path, entry: np.dtype):
        self.entry = entry
        self.buckets = Buckets([f"{stem}.{b}" for b in range(N_BUCKETS)])

    def add(self, keys: np.ndarray, values: np.ndarray) -> None:
        entries = np.empty(keys.size, self.entry)
        entries["key"], entries["value"] = keys, values
        self.buckets.scatter(keys.view(np.uint8).reshape(-1, KEY_BYTES)[:, 0], entries)

    def flush(self) -> None:
        self.buckets.flush()

    def read(self, bucket: int) -> np.ndarray:
        path = self.buckets.paths[bucket]
        if not os.path.exists(path):
            return np.zeros(0, self.entry)
        return np.fromfile(path, self.entry)


class Stored(NamedTuple):
    """The store's keys that the run may use, by bucket, each with its part's number in `parts`."""

    keys: KeyBuckets
    parts: list[str]


def index_store(
    store: Store, key: str, run_keys: KeyBuckets, stem: Path, set_aside_parts
) -> Stored:
    """The keys the store holds: where its key's index names the parts (a bucket's), those of
    the run's keys alone; else every part's, from the manifests (a bucket's key not yet indexed
    is indexed from them). A part that cannot be read is set aside, and named in
    `set_aside_parts`."""
    if not store.lists_parts:
        return indexed_keys(store, key, run_keys, stem)
    parts = store.parts(key)
    stored = KeyBuckets(stem, STORED_ENTRY)
    for code, name in enumerate(parts):
        try:
            keys = stored_keys(store, key, name)
        except (OSError, KeyError, ValueError) as err:
            set_aside(store, key, name, f"unreadable: {err}")
            set_aside_parts.append(store.shown(store.part(key, name)))
            continue
        stored.add(keys, np.full(keys.size, code, dtype=np.int32))
    stored.flush()
    if store.key_index(key) is not None:  # what was just read, spread by first byte already
        by_byte = (stored.read(bucket) for bucket in range(N_BUCKETS))
        add_to_index(store, key, ((e["key"], e["value"]) for e in by_byte if e.size), parts,
                     every=True)  # fmt: skip
    return Stored(stored, parts)


def indexed_keys(store: Store, key: str, run_keys: KeyBuckets, stem: Path) -> Stored:
    """The entries of the run's keys in the key's index, of the parts that are still there."""
    index = store.key_index(key)
    stored, code_of, absent = KeyBuckets(stem, STORED_ENTRY), {}, set()
    for bucket in range(N_BUCKETS):
        keys = np.unique(run_keys.read(bucket)["key"])
        if not keys.size:
            continue
        held = index.holders(keys)
        used = [held.names[i] for i in np.unique(held.codes)]
        named = sorted(set(used) - code_of.keys() - absent)
        there = store.present(key, named)
        absent.update(set(named) - set(there))
        code_of.update((name, len(code_of) + i) for i, name in enumerate(there))
        codes = np.array([code_of.get(n, -1) for n in held.names] or [-1], np.int32)[held.codes]
        stored.add(held.keys[codes >= 0], codes[codes >= 0])
    stored.flush()
    log.info("key index: %d nodes read, %d parts hold sequences of this run%s", index.nodes_read,
             len(code_of), f" ({len(absent)} named there are gone)" if absent else "")  # fmt: skip
    return Stored(stored, list(code_of))


class Match(NamedTuple):
    """Each record's sequence against the others' and the store's."""

    first_of: np.ndarray  # the first record with the same sequence (itself if none before)
    stored_in: np.ndarray  # the store part that holds the sequence, or -1
    new_records: np.ndarray  # the first record of each sequence that the store lacks
    n_unique: int
    set_aside: list[str]  # the store parts that failed their check, as the user names them


def match_records(
    n, run_keys, stored, store, key, parts, checksum_cache, set_aside_parts
) -> Match:
    """Find every record's first equal, and the store parts holding the sequences, bucket by
    bucket; a part to be used must pass its check first (else it is set aside, named in
    `set_aside_parts`, and the lookup done again without it)."""
    first_of = np.empty(n, dtype=np.int64 if n >= 2**31 else np.int32)
    stored_in = np.full(n, -1, dtype=np.int32)
    checked, failed = set(), set()
    while True:
        used, n_unique = set(), 0
        for bucket in range(N_BUCKETS):
            entries = run_keys.read(bucket)
            if not entries.size:
                continue
            order = np.argsort(entries["key"], kind="stable")  # ties stay in input order
            keys, index = entries["key"][order], entries["value"][order]
            first = np.ones(keys.size, dtype=bool)
            np.not_equal(keys[1:], keys[:-1], out=first[1:])
            group = np.cumsum(first) - 1
            first_of[index] = index[first][group]
            held = lookup(stored.read(bucket), keys[first], failed)
            stored_in[index] = held[group]
            used.update(np.unique(held[held >= 0]).tolist())
            n_unique += int(first.sum())
        if used <= checked:
            break
        for code in sorted(used - checked):
            reason = check_part(store, key, parts[code], checksum_cache)
            if reason:
                set_aside(store, key, parts[code], reason)
                set_aside_parts.append(store.shown(store.part(key, parts[code])))
                failed.add(code)
            checked.add(code)
    new_records = np.concatenate(
        [
            start
            + np.flatnonzero(
                (
                    first_of[start : start + RECORDS_AT_ONCE]
                    == np.arange(start, min(n, start + RECORDS_AT_ONCE))
                )
                & (stored_in[start : start + RECORDS_AT_ONCE] < 0)
            )
            for start in range(0, n, RECORDS_AT_ONCE)
        ]
        or [np.zeros(0, dtype=np.int64)]
    ).astype(first_of.dtype)
    return Match(first_of, stored_in, new_records, n_unique, set_aside_parts)


def lookup(stored: np.ndarray, keys: np.ndarray, failed: set) -> np.ndarray:
    """The part holding each of `keys`, or -1."""
    if failed:
        stored = stored[~np.isin(stored["value"], sorted(failed))]
    if not stored.size:
        return np.full(keys.size, -1, dtype=np.int32)
    at = rows_of(stored["key"], keys)
    return np.where(at >= 0, stored["value"][at], -1).astype(np.int32)


def part_of_records(match: Match, shard_of: np.ndarray, n_parts: int) -> np.ndarray:
    """Each record's part, numbered as the store's `n_parts` parts and then the new shards."""
    part_of = match.stored_in  # reused in place: no second array per record
    for start in range(0, part_of.size, RECORDS_AT_ONCE):
        block = part_of[start : start + RECORDS_AT_ONCE]
        missing = np.flatnonzero(block < 0)
        first = match.first_of[start : start + RECORDS_AT_ONCE][missing]
        block[missing] = n_parts + shard_of[np.searchsorted(match.new_records, first)]
    return part_of
