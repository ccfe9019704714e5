# `neighbours`: the run's proteins against a reference cut into parts of its rows, one search job
# each, then the tables (esmshard.steps.neighbours).
rule neighbour_part:
    input:
        unpack(neighbour_part_inputs),
    output:
        # the top k last: once it exists, so do the figures
        hits=RUN.neighbour_part("{part}"),
        metrics=RUN.neighbour_metrics("{part}"),
    log:
        RUN.log("neighbours", "{part}"),
    conda:
        "../../envs/esmshard.yaml"
    resources:
        gpu=1,
        runtime=io_runtime,
    params:
        k=config["neighbours_k"],
        metric=config["neighbours_metric"],
        layer=NEIGHBOUR_LAYER,
        reference=config["neighbours"],
        # goPredSim's transfer counts the neighbours tied with the k-th too: a few more searched
        extra=TIES_SEARCHED if config["neighbours_terms"] else 0,
        # with an ontology, each aspect is searched among the references annotated in it
        transfer=TRANSFER,
        index=config["neighbours_index"],
    script:
        "../scripts/neighbour_part.py"


rule neighbours:
    input:
        unpack(neighbours_inputs),
    output:
        tsv=RUN.neighbours_tsv,
        parquet=RUN.neighbours_parquet,
        annotations=[RUN.annotations_tsv] if config["neighbours_annotations"] else [],
        # `neighbours_terms`: every counted neighbour's terms, goPredSim's way
        transfer=([RUN.transfer_tsv, RUN.transfer_parquet] if config["neighbours_terms"] else []),
    log:
        RUN.log("neighbours"),
    conda:
        "../../envs/esmshard.yaml"
    resources:
        runtime=io_runtime,
    params:
        k=config["neighbours_k"],
        metric=config["neighbours_metric"],
        reference=config["neighbours"],
        transfer=TRANSFER,
        unwritten=unwritten_tables(),
    script:
        "../scripts/neighbours.py"
