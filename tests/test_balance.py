from conftest import PROTEINS, read_records

from esmshard.balance import assign, estimated_cost, record_cost


def test_assignment_balances_cost_deterministically():
    lengths = [len(seq) for _, seq in read_records(PROTEINS)]
    costs = [estimated_cost(min(n, 1022), 320) for n in lengths]
    shard_of = assign(costs, 4)
    assert shard_of == assign(costs, 4)
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
