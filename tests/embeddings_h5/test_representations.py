import numpy as np
import pytest
from helpers import CONFIG_SCHEMA

from esmshard.embeddings_h5 import contacts
from esmshard.embeddings_h5.representations import (
    KINDS,
    LAYERED,
    UNLAYERED,
    Representation,
    absolute_layers,
)


def test_absolute_layers_follow_fair_esm():
    assert absolute_layers([-1], 33) == [33]
    assert absolute_layers([0, -2, 5], 6) == [0, 5]
    with pytest.raises(ValueError, match="layer 7"):
        absolute_layers([7], 6)


def test_every_kind_is_a_config_choice():
    assert CONFIG_SCHEMA["properties"]["include"]["items"]["enum"] == [*KINDS]
    assert {*KINDS} == {*LAYERED, *UNLAYERED} and contacts.NAME in UNLAYERED


def test_a_kind_counts_its_rows_and_where_they_start():
    lengths = np.array([3, 0, 2])
    assert KINDS["mean"].starts(lengths).tolist() == [0, 1, 2, 3]
    assert KINDS["per_tok"].starts(lengths).tolist() == [0, 3, 3, 5]
    assert KINDS["logits"].starts(lengths).tolist() == [0, 3, 3, 5]
    assert KINDS["contacts"].starts(lengths).tolist() == [0, 6, 6, 9]
    assert KINDS["pll"].offsets is None and KINDS["per_tok"].offsets == "per_tok/offsets"
    assert (
        KINDS["logits"].offsets == "logits/offsets" and KINDS["logits"].values == "logits/values"
    )


def test_kinds_rows_per_record_or_per_residue():
    reps = [
        Representation.from_per_tok(np.ones((3, 4)), np.zeros(4)),
        Representation.from_per_tok(np.full((2, 4), 3.0), np.ones(4)),
    ]
    for kind in LAYERED.values():
        rows = kind.rows_of(reps)
        assert rows.shape == ((5, 4) if kind.per_residue else (2, 4)), kind.name
    np.testing.assert_array_equal(KINDS["mean"].rows_of(reps), [[1] * 4, [3] * 4])
    np.testing.assert_array_equal(KINDS["bos"].rows_of(reps), [[0] * 4, [1] * 4])
