import bz2
import gzip

from conftest import PROTEINS

from esmshard.sizing import (
    auto_shard_count,
    embed_mem_mb,
    embed_runtime_minutes,
    estimated_residues,
)


def test_auto_shard_count_depends_on_size_alone():
    assert auto_shard_count(50_000) == 1
    assert auto_shard_count(1_400_000) == 7
    assert auto_shard_count(200_000_000) == 64
    assert auto_shard_count(15_000_000_000) == 1500
    counts = [auto_shard_count(n) for n in range(0, 10**9, 10**7)]
    assert counts == sorted(counts)


def test_compressed_inputs_count_twice_their_size(tmp_path):

    for suffix, opener in ((".gz", gzip.open), (".bz2", bz2.open)):
        path = tmp_path / f"p.fasta{suffix}"
        with opener(path, "wb") as fh:
            fh.write(PROTEINS.read_bytes())
        assert estimated_residues([path]) == int(path.stat().st_size * 2.0 * 0.7)


def test_cluster_requests_grow_with_the_work_and_double_per_retry():
    first, retry = (
        embed_runtime_minutes(1e6, 33, 1280),
        embed_runtime_minutes(1e6, 33, 1280, attempt=2),
    )
    assert 2 * first - 1 <= retry <= 2 * first  # both rounded up
    assert embed_runtime_minutes(1e8, 33, 1280) > embed_runtime_minutes(1e6, 33, 1280) >= 10
    assert embed_mem_mb(33, 1280) > embed_mem_mb(6, 320) > 4096
