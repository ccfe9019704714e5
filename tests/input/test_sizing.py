import bz2
import gzip

from helpers import PROTEINS

from esmshard.input.sizing import (
    JOB_OVERHEAD_SECONDS,
    MAX_SHARDS,
    auto_shard_count,
    embed_mem_mb,
    embed_runtime_minutes,
    estimated_text_bytes,
    fast_gpu_seconds,
)


def test_auto_shards_keep_job_overhead_under_3_percent_for_the_650m_model():
    params = 12 * 33 * 1280**2  # esm2_t33_650M
    # 100 million proteins of ~350 residues, and 650 million: every shard's GPU time on a fast
    # GPU is at least JOB_OVERHEAD_SECONDS / 3%.
    for residues in (1_400_000, 350e6, 35e9, 227e9):
        n = auto_shard_count(residues, params)
        seconds = fast_gpu_seconds(residues, params) / n
        assert n == 1 or JOB_OVERHEAD_SECONDS / seconds < 0.03
    assert auto_shard_count(35e9, params) == 172  # UniRef50-sized: shards of ~13 minutes
    assert auto_shard_count(227e9, params) == 1115
    assert auto_shard_count(1_400_000, params) == 1  # a proteome: seconds of GPU work
    assert auto_shard_count(1e14, params) == MAX_SHARDS
    assert auto_shard_count(35e9, 12 * 6 * 320**2) < auto_shard_count(
        35e9, params
    )  # faster models
    counts = [auto_shard_count(n, params) for n in range(0, 10**11, 10**9)]
    assert counts == sorted(counts)


def test_auto_shards_give_every_slot_of_the_pool_one_at_least():
    params = 12 * 33 * 1280**2  # esm2_t33_650M
    assert auto_shard_count(1_400_000, params, slots=4) == 4  # a proteome on 4 GPUs
    assert auto_shard_count(0, params, slots=8) == 8  # the caller caps it by the sequences
    # beyond the pool, the work decides as before
    assert auto_shard_count(35e9, params, slots=4) == auto_shard_count(35e9, params)


def test_on_a_cluster_the_jobs_at_once_are_a_floor_where_each_holds_a_jobs_fixed_cost():
    params = 12 * 33 * 1280**2  # esm2_t33_650M
    proteome = 1_400_000  # residues: 5.5 s of fast-GPU work, under one job's fixed cost (20 s)
    assert auto_shard_count(proteome, params, slots=100, cluster=True) == 1
    assert auto_shard_count(proteome, params, slots=100) == 100  # one machine: every slot
    million = 350e6  # 1,376 s of fast-GPU work: 68 jobs of at least 20 s each
    assert auto_shard_count(million, params, slots=100, cluster=True) == 68
    assert auto_shard_count(million, params, slots=8, cluster=True) == 8
    assert auto_shard_count(million, params) == 1


def test_compressed_inputs_count_twice_their_size(tmp_path):

    for suffix, opener in ((".gz", gzip.open), (".bz2", bz2.open)):
        path = tmp_path / f"p.fasta{suffix}"
        with opener(path, "wb") as fh:
            fh.write(PROTEINS.read_bytes())
        assert estimated_text_bytes([path]) == int(path.stat().st_size * 2.0)


def test_cluster_requests_grow_with_the_work_and_double_per_retry():
    params = 12 * 33 * 1280**2
    first, retry = (
        embed_runtime_minutes(1e6, params),
        embed_runtime_minutes(1e6, params, attempt=2),
    )
    assert 2 * first - 1 <= retry <= 2 * first  # both rounded up
    assert embed_runtime_minutes(1e8, params) > embed_runtime_minutes(1e6, params) >= 10
    assert embed_mem_mb(params) > embed_mem_mb(12 * 6 * 320**2) > 4096
