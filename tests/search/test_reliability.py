"""The reliability index, written from goPredSim's and EAT's definition: RI = 0.5 / (0.5 + d)."""

import numpy as np

from esmshard.search import reliability_index


def test_the_euclidean_ri_is_half_over_half_plus_the_distance():
    distances = np.array([0.0, 0.5, 1.0, 1.5, 4.5, np.inf])
    expected = [1.0, 0.5, 1 / 3, 0.25, 0.1, 0.0]
    np.testing.assert_allclose(reliability_index(distances), expected)


def test_it_falls_as_the_neighbour_moves_away():
    ri = reliability_index(np.linspace(0, 10, 50))
    assert (np.diff(ri) < 0).all() and 0 < ri[-1] < ri[0] == 1


def test_the_cosine_ri_is_the_similarity():
    np.testing.assert_allclose(reliability_index([0.0, 0.25, 1.0], "cosine"), [1.0, 0.75, 0.0])
