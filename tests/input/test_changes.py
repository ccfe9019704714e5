"""Changes beyond substitutions (esmshard.input.changes): where a mutant sequence starts to
differ, and the window both sequences are cropped to. The crop was checked once against
esm-variants' own `crop_indel` (fetched): equal on 1,665 random deletions, insertions and
delins of SARS-CoV-2's polyprotein cut to 1,000-7,096 residues; here its recipe's cases."""

import numpy as np
import pytest
from helpers import LONG_PROTEIN, read_records

from esmshard.embeddings_h5.scores import AMINO_ACIDS
from esmshard.input.changes import Change, crop, first_difference, one_pass_pll

POLYPROTEIN = read_records(LONG_PROTEIN)[0][1]


def test_a_change_starts_where_the_sequences_first_differ():
    assert first_difference("MKTAY", "MKSAY") == 3
    assert first_difference("MKTAY", "MKAY") == 3  # a deletion
    assert first_difference("MKTAY", "MKTAYW") == 6  # an insertion at the end
    assert first_difference("MKTAY", "MKTAY") is None


def test_sequences_within_the_window_are_scored_whole():
    wild = POLYPROTEIN[:1000]
    mutant = wild[:500] + wild[510:]
    assert crop(Change(wild, mutant, 501), 1022) == (wild, mutant)


def test_a_long_proteins_change_is_cropped_to_one_window_around_it():
    wild = POLYPROTEIN[:3000]
    mutant = wild[:1999] + "GGG" + wild[1999:]  # an insertion at 2,000
    got_wild, got_mutant = crop(Change(wild, mutant, 2000), 1022)
    # half a window before the start (511), the rest after: the longer one whole (1,022),
    # the other shorter by the difference, as the reference cuts them
    assert got_mutant == mutant[1488:2510] and len(got_mutant) == 1022
    assert got_wild == wild[1488:2507]
    deleted = wild[:1999] + wild[2009:]  # 10 residues deleted at 2,000
    got_wild, got_mutant = crop(Change(wild, deleted, 2000), 1022)
    assert got_wild == wild[1488:2510] and got_mutant == deleted[1488:2500]


@pytest.mark.parametrize("start", [1, 20, 600, 2990, 3000])
def test_near_either_end_the_window_stays_within_the_protein(start):
    wild = POLYPROTEIN[:3000]
    mutant = wild[: start - 1] + "W" + wild[start:]
    got_wild, got_mutant = crop(Change(wild, mutant, start), 1022)
    assert len(got_wild) <= 1022 and len(got_mutant) <= 1022
    begin = wild.index(got_wild)
    assert begin <= start - 1 < begin + len(got_wild)  # the change is inside
    if start > 600:  # moved left so that the window is whole
        assert len(got_wild) == 1022


def test_the_one_pass_pll_is_the_sum_of_each_residues_own_log_probability():
    log_probs = np.log(np.full((3, 20), 1 / 20))
    log_probs[1, AMINO_ACIDS.index("K")] = -0.5
    assert one_pass_pll(log_probs, "MKT") == pytest.approx(2 * np.log(1 / 20) - 0.5)
    assert np.isnan(one_pass_pll(log_probs, "MXT"))
