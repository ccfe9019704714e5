"""The store's keys: a sequence's by its content, a settings folder's by the settings.

Sequences are matched on the first 128 bits of their SHA-256: a chance of a false match of
about n²/2¹²⁹, 10⁻¹⁵ for a trillion sequences.
"""

import hashlib
import json
import re

import numpy as np

KEY_BYTES = 16
KEY_DTYPE = np.dtype(f"S{KEY_BYTES}")
_HEX_VALUES = np.full(256, 255, dtype=np.uint8)
for _digit, _value in zip(b"0123456789abcdef", range(16)):
    _HEX_VALUES[_digit] = _value


def sequence_sha256(sequence: bytes) -> str:
    """The key of a sequence (its residues after the input rules), as lowercase hex."""
    return hashlib.sha256(sequence).hexdigest()


def keys_of(hex_digests) -> np.ndarray:
    """The 128-bit keys (KEY_DTYPE) of hex SHA-256 digests (str, bytes or an array of them)."""
    text = np.asarray(hex_digests, dtype="S64")
    nibbles = _HEX_VALUES[text.view(np.uint8).reshape(-1, 64)[:, : 2 * KEY_BYTES]]
    if np.any(nibbles == 255):
        raise ValueError("not a lowercase hex SHA-256 digest")
    return (nibbles[:, 0::2] << 4 | nibbles[:, 1::2]).copy().view(KEY_DTYPE).ravel()


def rows_of(held: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """The row of each of `keys` among the keys `held` (in any order), or -1 where absent."""
    if not held.size:
        return np.full(keys.size, -1, dtype=np.int64)
    order = np.argsort(held, kind="stable")
    ordered = held[order]
    at = np.minimum(np.searchsorted(ordered, keys), held.size - 1)
    return np.where(ordered[at] == keys, order[at], -1)


def settings_key(settings: dict) -> str:
    """The name of the store folder for embeddings computed with `settings`."""
    text = json.dumps(settings, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


# A settings folder's name is its key, 16 lowercase hex digits, and its settings.json holds the
# settings whose hash that key is (`settings_key`): esmshard's mark on it. No other folder of the
# store's root (a user's `.vscode/` or `analysis/`, or `cafebabedeadbeef/` holding a
# settings.json of its own) is ever read as one, listed, cleaned up or removed.
SETTINGS_KEY = re.compile(r"^[0-9a-f]{16}$")
# esmshard marks the root of every store it writes in, with the format of its layout. A store of
# an earlier esmshard (settings folders, no marker) is recognised by them and marked by its next run.
