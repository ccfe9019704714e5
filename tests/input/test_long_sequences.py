import pytest

from esmshard.input.long_sequences import chunk_spans, embedded_residues


@pytest.mark.parametrize("length", [5, 1022, 1023, 2358, 7096, 30000])
def test_chunk_windows_cover_every_residue_once(length):
    spans = chunk_spans(length, 1022)
    assert spans[0].keep_from == 0 and spans[-1].keep_to == length
    for span, following in zip(spans, spans[1:] + [None]):
        assert (
            span.end - span.start <= 1022
            and span.start <= span.keep_from < span.keep_to <= span.end
        )
        if following:
            assert span.keep_to == following.keep_from  # kept parts tile the sequence
            assert span.end - following.start >= 1022 // 4  # windows overlap by at least a quarter


@pytest.mark.parametrize(
    "policy, residues", [("truncate", 1022), ("chunk", 3000), ("skip", 0), ("fail", 0)]
)
def test_embedded_residues_per_policy(policy, residues):
    assert embedded_residues(3000, 1022, policy) == residues
    assert embedded_residues(500, 1022, policy) == 500
