import numpy as np
import pytest
import yaml
from conftest import REPO

from esmshard import contacts
from esmshard.representations import KINDS, Representation, absolute_layers

SCHEMA = yaml.safe_load((REPO / "workflow" / "schemas" / "config.schema.yaml").read_text())


def test_absolute_layers_follow_fair_esm():
    assert absolute_layers([-1], 33) == [33]
    assert absolute_layers([0, -2, 5], 6) == [0, 5]
    with pytest.raises(ValueError, match="layer 7"):
        absolute_layers([7], 6)


def test_every_kind_and_contacts_are_the_config_choices():
    assert SCHEMA["properties"]["include"]["items"]["enum"] == [*KINDS, contacts.NAME]


def test_kinds_rows_per_record_or_per_residue():
    reps = [
        Representation.from_per_tok(np.ones((3, 4)), np.zeros(4)),
        Representation.from_per_tok(np.full((2, 4), 3.0), np.ones(4)),
    ]
    for kind in KINDS.values():
        rows = kind.rows(reps)
        assert rows.shape == ((5, 4) if kind.per_residue else (2, 4)), kind.name
    np.testing.assert_array_equal(KINDS["mean"].rows(reps), [[1] * 4, [3] * 4])
    np.testing.assert_array_equal(KINDS["bos"].rows(reps), [[0] * 4, [1] * 4])
