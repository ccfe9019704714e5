"""A settings key's index in object storage: which part holds each sequence, cut by the leading
hex digits of the sequence's key into nodes of at most NODE_ENTRIES entries, so that a run reads
the nodes of its own keys, never every part's manifest.

Layout, under the settings key's folder:

    .index/format.json      made once every part written before it is in the index
    .index/<digits>.keys    a node: the entries whose keys begin with those hex digits

The top nodes are named by TOP_DIGITS digits. A node that fills is frozen: never written again,
and what falls under it goes to its 16 children, one digit longer. So a key's entries lie along
one path of nodes, each at most NODE_ENTRIES long, whatever the store holds. Writers add with
conditional writes (a new node only where none is, a node's next version only over the one they
read); one that loses reads the node again and adds what is still missing. Entries are only
ever added: a reader takes, of a key's entries, one whose part is still there.
"""

import json
from concurrent.futures import ThreadPoolExecutor
from typing import NamedTuple

import numpy as np

from .keys import KEY_DTYPE
from .objects import Bucket

INDEX = ".index"
FORMAT = 1
TOP_DIGITS = 3  # 4,096 top nodes
NODE_ENTRIES = 16384  # at most 330 kB a node and its parts' names
AT_ONCE = 16  # requests in flight
ENTRY = np.dtype([("key", KEY_DTYPE), ("part", np.uint32)])  # part: a number in the node's list


def is_index(relative: str) -> bool:
    """Whether `relative` (a store's file) is one of an index's."""
    return f"/{INDEX}/" in f"/{relative}"


class Held(NamedTuple):
    """Sequence keys, each with the number of the part holding it in `names`."""

    keys: np.ndarray  # KEY_DTYPE
    codes: np.ndarray  # uint32
    names: list[str]

    def __len__(self) -> int:
        return self.keys.size

    def take(self, rows) -> "Held":
        return Held(self.keys[rows], self.codes[rows], self.names)

    def pairs(self, names: list[str]) -> np.ndarray:
        """Each entry as bytes (its key and its part's number in `names`, a list that holds
        every name of this one's), for comparing entries of two lists."""
        code = {name: i for i, name in enumerate(names)}
        found = np.empty(len(self), ENTRY)
        found["key"] = self.keys
        found["part"] = np.array([code[n] for n in self.names], np.uint32)[self.codes]
        return found.view(f"S{ENTRY.itemsize}")


def no_entries() -> Held:
    return Held(np.zeros(0, KEY_DTYPE), np.zeros(0, np.uint32), [])


def joined(*lists: Held) -> Held:
    """The entries of `lists`, numbered by one list of names."""
    names = list(dict.fromkeys(n for held in lists for n in held.names))
    code = {name: i for i, name in enumerate(names)}
    codes = [np.array([code[n] for n in h.names] or [0], np.uint32)[h.codes] for h in lists]
    keys = [h.keys for h in lists]
    return Held(np.concatenate(keys or [no_entries().keys]),
                np.concatenate(codes or [no_entries().codes]).astype(np.uint32), names)  # fmt: skip


class Node(NamedTuple):
    frozen: bool
    held: Held

    def encode(self) -> bytes:
        used = np.unique(self.held.codes)  # the names of its entries' parts alone
        entries = np.empty(len(self.held), ENTRY)
        entries["key"], entries["part"] = self.held.keys, np.searchsorted(used, self.held.codes)
        names = [self.held.names[i] for i in used]
        return (
            json.dumps({"frozen": self.frozen, "parts": names}).encode()
            + b"\n"
            + entries.tobytes()
        )


def decode(data: bytes) -> Node:
    head, _, body = data.partition(b"\n")
    found = json.loads(head)
    entries = np.frombuffer(body, ENTRY)
    return Node(bool(found["frozen"]), Held(entries["key"], entries["part"], list(found["parts"])))


def prefixes(keys: np.ndarray, digits: int) -> np.ndarray:
    """The first `digits` hex digits (at most 16) of each key, as a number."""
    head = np.ascontiguousarray(keys).view(np.uint8).reshape(-1, keys.itemsize)[:, :8]
    return head.copy().view(">u8").ravel() >> np.uint64(64 - 4 * digits)


class KeyIndex:
    """The index of settings key `key` in `bucket` (the store's root); `nodes_read` and
    `nodes_written` count what it cost."""

    def __init__(self, bucket: Bucket, key: str):
        self.bucket, self.key = bucket, key
        self.nodes_read = self.nodes_written = 0

    def node_name(self, prefix: int, digits: int) -> str:
        return f"{self.key}/{INDEX}/{prefix:0{digits}x}.keys"

    @property
    def format_name(self) -> str:
        return f"{self.key}/{INDEX}/format.json"

    def exists(self) -> bool:
        """Whether every part written before the index was made is in it."""
        return self.bucket.head(self.format_name) is not None

    def mark(self) -> None:
        """Say that every part written so far is in the index (after adding them)."""
        self.bucket.put(self.format_name, json.dumps({"key_index_format": FORMAT}).encode())

    def read(self, prefix: int, digits: int) -> tuple[Node | None, str | None]:
        """The node and its ETag; (None, None) where there is none."""
        found = self.bucket.fetch(self.node_name(prefix, digits))
        self.nodes_read += 1
        return (None, None) if found is None else (decode(found.body), found.etag)

    def holders(self, keys: np.ndarray) -> Held:
        """The entries of `keys` (unique), from the nodes along their paths alone."""
        found, digits, wanted = [], TOP_DIGITS, keys
        with ThreadPoolExecutor(AT_ONCE) as pool:
            while wanted.size:
                under = prefixes(wanted, digits)
                tops = np.unique(under)
                nodes = list(pool.map(lambda p: self.read(int(p), digits)[0], tops))
                deeper = []
                for prefix, node in zip(tops, nodes):
                    if node is None:
                        continue
                    mine = wanted[under == prefix]
                    found.append(node.held.take(np.isin(node.held.keys, mine)))
                    if node.frozen:
                        deeper.append(mine)
                wanted = np.concatenate(deeper) if deeper else keys[:0]
                digits += 1
        return joined(*found)

    def add(self, held: Held) -> None:
        """Add `held`'s entries, each top node's on its own (AT_ONCE at a time)."""
        under = prefixes(held.keys, TOP_DIGITS)
        with ThreadPoolExecutor(AT_ONCE) as pool:
            jobs = [
                pool.submit(self.add_under, int(top), TOP_DIGITS, held.take(under == top))
                for top in np.unique(under)
            ]
            for job in jobs:
                job.result()

    def add_under(self, prefix: int, digits: int, held: Held) -> None:
        """Add `held` (keys that begin with `prefix`) to its node, or beneath it where it is
        frozen or fills; a write that loses to another writer's reads the node again."""
        while True:
            node, etag = self.read(prefix, digits)
            now = node.held if node else no_entries()
            names = list(dict.fromkeys(held.names + now.names))
            fresh = held.take(~np.isin(held.pairs(names), now.pairs(names)))
            if node is not None and node.frozen:
                return self.add_below(prefix, digits, fresh)
            if not len(fresh):
                return
            room = NODE_ENTRIES - len(now)
            merged = joined(now, fresh.take(slice(0, room)))
            written = self.bucket.put(
                self.node_name(prefix, digits),
                Node(len(merged) >= NODE_ENTRIES, merged).encode(),
                only_new=etag is None,
                if_match=etag,
            )
            if written is not None:
                self.nodes_written += 1
                return self.add_below(prefix, digits, fresh.take(slice(room, None)))

    def add_below(self, prefix: int, digits: int, held: Held) -> None:
        """Add `held` to the 16 children of the frozen node `prefix`."""
        if not len(held):
            return
        under = prefixes(held.keys, digits + 1)
        for child in np.unique(under):
            self.add_under(int(child), digits + 1, held.take(under == child))
