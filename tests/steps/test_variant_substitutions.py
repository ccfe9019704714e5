"""Every single substitution of a record, built at once, named as one at a time."""

from esmshard.embeddings_h5.scores import AMINO_ACIDS
from esmshard.input.variants import single_substitutions, substitution_name
from esmshard.steps import variant_substitutions


def test_every_substitution_named_at_once_as_one_at_a_time():
    for sequence, offset in (("MKTAYIAKQR", 1), ("MXKBTZ*A", -3), ("AC" * 60, 1000)):
        found = variant_substitutions.Substitutions.of("P", sequence.encode())
        names = variant_substitutions.substitution_names(
            found.positions, found.wild, found.mutant, offset
        )
        expected = [substitution_name(sequence, p, a, offset)
                    for p, a in single_substitutions(sequence)]  # fmt: skip
        assert names.to_pylist() == expected
        assert [AMINO_ACIDS[k] for k in found.mutant] == [
            a for _, a in single_substitutions(sequence)
        ]
