from esmshard.input.sizing import ModelSize
from esmshard.layout import Layout
from esmshard.models import ensure_available, parse_spec
from esmshard.steps.job import run_step
from esmshard.steps.shard import write_shards


def shard(settings, **params):
    # Weights first: a model that cannot be had stops the run before any shard work.
    ensure_available(parse_spec(settings["model"]))
    return write_shards(settings=settings, **params)


params = dict(snakemake.params.items())
del params["input_sha256"]  # there to re-run this step when an input's content changes
params["model_size"] = ModelSize(*params["model_size"])
run_step(
    snakemake.log[0],
    shard,
    inputs=list(snakemake.input),
    shard_dir=snakemake.output[0],
    store_root=params.pop("store"),
    checksum_cache=Layout(snakemake.config["outdir"]).checksums,
    **params,
)
