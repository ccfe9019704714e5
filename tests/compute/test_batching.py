import pytest
from helpers import PROTEINS, REPO, read_records

from esmshard.compute import batching

SEQUENCES = [seq[:1022] for _, seq in read_records(PROTEINS)]


def test_batches_respect_token_budget_and_cover_everything():
    lengths = [len(s) for s in SEQUENCES]
    batches = batching.make_batches(lengths, 4096)
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    for batch in batches:
        width = max(lengths[i] for i in batch) + 2
        assert width * len(batch) <= 4096 or len(batch) == 1
    assert batching.make_batches([5000], 1024) == [[0]]
    # two 8- and 10-residue sequences share a 12-token width: 2 padded tokens of 34
    assert batching.padded_fraction([10, 8, 8], [[0, 1], [2]]) == pytest.approx(2 / 34)


def test_batches_follow_a_budget_that_depends_on_the_longest_sequence():
    lengths = [1000, 900, 300, 300, 300, 300, 100, 100]
    batches = batching.make_batches(lengths, lambda longest: 1100 if longest > 500 else 1300)
    assert batches == [[0], [1], [2, 3, 4, 5], [6, 7]]


def test_auto_budget_grows_with_free_memory_and_shrinks_with_sequence_length():
    small = batching.auto_token_budget(8 << 30, 2_600_000_000, 16 * 1280, 20, 1024)
    large = batching.auto_token_budget(80 << 30, 2_600_000_000, 16 * 1280, 20, 1024)
    assert 1024 <= small < large
    # a longer batch needs more memory per token (ESM C's batches reach 2050 tokens)
    assert batching.auto_token_budget(80 << 30, 0, 16 * 1280, 20, 200) > large
    assert batching.auto_token_budget(80 << 30, 2_600_000_000, 16 * 1280, 20, 2050) < large
    # never below one sequence of the batch's width, even without room
    assert batching.auto_token_budget(1 << 20, 2_600_000_000, 16 * 1280, 20, 900) == 900
    # bf16 activations take fewer bytes: more tokens fit
    assert batching.auto_token_budget(80 << 30, 0, 16 * 1280, 20, 1024, bytes_per_value=3) > large


def test_padding_per_shard_of_the_real_proteome_stays_below_five_percent(monkeypatch):
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    import throughput  # the figure in docs/benchmarks.md comes from this function

    fractions = throughput.padding(throughput.DEFAULT_FASTA, batching.CPU_TOKENS_PER_BATCH)
    assert len(fractions) > 1 and max(fractions) < 0.05


def test_packed_batches_count_real_tokens_only():
    lengths = [98, 48, 48, 10, 10, 10]  # 100, 50, 50, 12, 12, 12 tokens with BOS and EOS
    assert batching.make_batches(lengths, 200, packed=True) == [[0, 1, 2], [3, 4, 5]]
    assert batching.make_batches(lengths, 200) == [[0, 1], [2, 3, 4, 5]]  # padded: 2 × 100, 4 × 50
