import numpy as np
import pytest
from helpers import PROTEINS, PROTEOME, read_records

from esmshard.input.balance import assign, estimated_cost, record_cost, record_costs


def test_assignment_balances_cost_deterministically():
    lengths = [len(seq) for _, seq in read_records(PROTEINS)]
    costs = [estimated_cost(min(n, 1022), 320) for n in lengths]
    shard_of = assign(costs, 4)
    assert np.array_equal(shard_of, assign(costs, 4))
    loads = [sum(c for c, s in zip(costs, shard_of) if s == k) for k in range(4)]
    # LPT bound: no shard exceeds the mean by more than the costliest record.
    assert max(loads) - sum(loads) / 4 <= max(costs)
    assert max(loads) / min(loads) < 1.2


def test_cost_grows_faster_than_length():
    assert estimated_cost(1000, 320) > 10 * estimated_cost(100, 320)


def test_record_cost_follows_the_long_sequence_policy():
    assert record_cost(3000, 1022, "truncate", 320) == estimated_cost(1022, 320)
    assert record_cost(3000, 1022, "skip", 320) == estimated_cost(0, 320)
    assert record_cost(3000, 1022, "chunk", 320) > 3 * estimated_cost(1022, 320)


@pytest.mark.parametrize("copies, n_shards", [(1, 3), (1, 16), (1, 64), (40, 7), (40, 300)])
def test_slowest_shard_of_the_real_proteome_within_2_percent_of_the_mean(copies, n_shards):
    """40 copies (174,520 records) deal out many rounds per step, as 100 million records do."""
    lengths = np.array([len(s) for _, s in read_records(PROTEOME)] * copies, dtype=np.int32)
    costs = record_costs(lengths, 1022, "truncate", 1280)
    loads = np.bincount(assign(costs, n_shards), weights=costs, minlength=n_shards)
    assert loads.max() / loads.mean() <= 1.02
    assert loads.max() - loads.mean() <= costs.max()


@pytest.mark.parametrize("policy", ["truncate", "chunk", "skip", "fail"])
def test_record_costs_are_record_cost_of_each_record(policy):
    lengths = np.array([10, 500, 1022, 1023, 3000, 35_000], dtype=np.int32)
    want = [record_cost(int(n), 1022, policy, 320) for n in lengths]
    np.testing.assert_allclose(record_costs(lengths, 1022, policy, 320), want, rtol=1e-6)
