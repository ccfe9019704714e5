"""The windows of a long protein's scores (esmshard.input.score_windows): where they lie, their
weights, and what they cost the shard step."""

import numpy as np
import pytest

from esmshard.input.balance import forward_tokens, record_cost, record_costs
from esmshard.input.score_windows import optimal_starts, overlapping, score_passes, weighted

LENGTHS = [1023, 1100, 1531, 1532, 2000, 2700, 4700, 35_000]


@pytest.mark.parametrize("length", LENGTHS)
def test_weighted_windows_cover_every_residue_and_overlap_by_at_least_half(length):
    windows = weighted(length, 1022)
    starts = list(windows.starts)
    assert starts == sorted(starts) and starts[0] == 0 and starts[-1] == length - 1022
    assert all(b - a <= 1022 - 512 for a, b in zip(starts, starts[1:]))  # overlaps >= 512
    # a residue's weights sum to one once normalised: the mean of ones is one
    ones = np.ones((len(starts), 1022, 1))
    np.testing.assert_allclose(windows.combined(ones, length), 1.0, rtol=1e-12)
    # no ramp at the protein's own ends: the first and last residues weigh fully
    assert windows.weights[0, 0] == 1 and windows.weights[-1, -1] == 1


def test_weighted_windows_add_one_at_the_centre_where_the_pair_overlaps_too_little():
    # 1,531 residues: the flush windows overlap by 513 residues, enough; 1,532: by 512, and a
    # window is centred on residue 766, the middle of the 512 between the pair's inner ends
    # (510 to 1,021); 2,000: by 44, centred on residue 1,000
    assert list(weighted(1531, 1022).starts) == [0, 509]
    assert list(weighted(1532, 1022).starts) == [0, 255, 510]
    assert list(weighted(2000, 1022).starts) == [0, 489, 978]


def test_overlapping_slices_step_in_from_both_ends_by_half_a_slice_less_one():
    tokens = 4702  # 4,700 residues, BOS and EOS
    windows = overlapping(tokens, 1022)
    assert windows.width == 1024
    # left 0, 511, 1022, 1533; right 3678, 3167, 2656, 2145, stopped once they cross; the last
    # two overlap by 412 tokens (< 511): one more centred on token 2,351
    assert sorted(windows.starts) == [0, 511, 1022, 1533, 1839, 2145, 2656, 3167, 3678]
    weight = windows.weights[0]
    assert weight[0] == 1 and weight[1023] == 1 and weight[300] == 1  # ProteinGym's ends
    assert weight[1] < 1e-3 and abs(weight[128] - 0.5) < 1e-12 and weight[256] > 0.99


def test_overlapping_slices_add_one_at_the_centre_where_the_last_two_overlap_too_little():
    # 3,000 tokens: the second pair (511 and 1,465) overlaps by 70 tokens: one more centred
    # on token 1,500; 2,048 tokens: the second pair overlaps by 1,022, enough
    assert sorted(overlapping(3000, 1022).starts) == [0, 511, 988, 1465, 1976]
    assert sorted(overlapping(2048, 1022).starts) == [0, 511, 513, 1024]


def test_the_optimal_window_is_centred_on_the_masked_token_or_flush_with_the_nearer_end():
    tokens = 3000
    starts = optimal_starts(np.array([1, 511, 512, 1500, 2487, 2488, 2998]), tokens, 1022)
    assert list(starts) == [0, 0, 0, 988, 1975, 1976, 1976]
    assert list(optimal_starts(np.array([1, 500]), 800, 1022)) == [0, 0]  # whole: no window


def test_the_shard_step_counts_every_window_and_masked_pass_of_a_chunked_record():
    embedding = record_cost(4700, 1022, "chunk", 320)
    with_logits = record_cost(4700, 1022, "chunk", 320, ["mean", "logits"])
    masked = record_cost(4700, 1022, "chunk", 320, ["mean", "masked_marginals"])
    windows = len(weighted(4700, 1022).starts)
    assert with_logits == pytest.approx(embedding + windows * record_cost(1022, 1022, "x", 320))
    assert masked == pytest.approx(embedding + 4700 * record_cost(1022, 1022, "x", 320))
    assert score_passes(4700, 1022, ["pll"], "weighted") == [(4700, 1024)]
    lengths = np.array([300, 4700], dtype=np.int32)
    include = ["mean", "logits", "pll"]
    costs = record_costs(lengths, 1022, "chunk", 320, include, "overlapping")
    want = [record_cost(int(n), 1022, "chunk", 320, include, "overlapping") for n in lengths]
    np.testing.assert_allclose(costs, want, rtol=1e-6)
    # the whole record: its pass and one per residue; the chunked one: every window's tokens
    passes = score_passes(4700, 1022, include, "overlapping")
    assert passes == [(9, 1024), (4700, 1024)]
    spans = forward_tokens(np.array([4700]), 1022, "chunk", ["mean"])
    assert forward_tokens(lengths, 1022, "chunk", include, "overlapping") == (
        302 * 301 + spans + sum(p.count * p.tokens for p in passes)
    )
