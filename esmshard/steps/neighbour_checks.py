"""The neighbours keys checked with the config, before any job: the layer among those kept, the
reference a run's embeddings of the same model (or a per-protein file of its width) holding it,
the annotations readable as a table with an `id` column, and the ontology an OBO file.
"""

from pathlib import Path

from ..compute.provenance import weights_sha256
from ..files import DamagedFileError, is_object_url
from ..layout import Layout
from ..outputs import nearest as found
from ..outputs.per_protein import open_reference
from ..search import AnnotationsError, read_annotations
from ..search.annotations import annotation_columns
from ..search.approximate import faiss_missing
from ..search.ontology import ontology_problem
from .neighbours import LAST, SELF, reference_file


def neighbour_problems(config: dict, model=None) -> list[str]:
    """Why the neighbours keys cannot run as given, one line each: the reference and the
    annotations read as far as a check needs, before any job. `model`: the run's (ModelSpec)."""
    setting, annotations = config["neighbours"], config["neighbours_annotations"]
    if not setting:
        return [
            f"{name}: needs neighbours (the reference to search)"
            for name in ("neighbours_annotations", "neighbours_terms", "neighbours_ontology")
            if config.get(name)
        ]
    problems = []
    if config.get("neighbours_terms") and not annotations:
        problems.append("neighbours_terms: needs neighbours_annotations (the terms' table)")
    ontology = config.get("neighbours_ontology")
    if ontology and not config.get("neighbours_terms"):
        problems.append("neighbours_ontology: needs neighbours_terms (the column of GO terms)")
    elif ontology and (problem := ontology_problem(ontology)):
        problems.append(f"neighbours_ontology: {problem}")
    if missing := faiss_missing(index := config.get("neighbours_index")):
        problems.append(f"neighbours_index: {index} {missing} (or use exact)")
    if "mean" not in config["include"]:
        problems.append("neighbours: the search compares mean embeddings: add mean to include")
    layer = config["neighbours_layer"]
    num_layers = model.num_layers if model is not None else None
    kept = {stored_layer(n, num_layers) for n in config["repr_layers"]}
    if layer != LAST and stored_layer(layer, num_layers) not in kept:
        problems.append(
            f"neighbours_layer: {layer} is not one of repr_layers {config['repr_layers']}: "
            "add it there"
        )
    if setting != SELF:
        problems += reference_problems(setting, config, model)
    if annotations:
        try:
            head = read_annotations(annotations, head=True)
        except AnnotationsError as err:
            problems.append(f"neighbours_annotations: {err}")
        else:
            problems += terms_problems(config, annotation_columns(head))
    return problems


def terms_problems(config: dict, columns: list[str]) -> list[str]:
    """Why `neighbours_terms` cannot carry terms: no such column of the annotations, or a
    transfer by distance without one."""
    terms = config.get("neighbours_terms")
    if not terms:
        return []
    problems = []
    if terms not in columns:
        problems.append(
            f"neighbours_terms: {terms} is not a column of {config['neighbours_annotations']} "
            f"({', '.join(columns)}): name the column of the terms"
        )
    if config["neighbours_transfer"] == "distance" and not config["neighbours_max_distance"] > 0:
        problems.append(
            "neighbours_transfer: distance counts the neighbours within neighbours_max_distance: "
            "set it (greater than 0)"
        )
    return problems


def stored_layer(layer: int, num_layers: int | None) -> int:
    """The layer's stored number (-1: the model's last) where the model's depth is known."""
    return layer + num_layers + 1 if layer < 0 and num_layers else layer


def reference_problems(setting: str, config: dict, model) -> list[str]:
    """Why the reference `setting` cannot be searched: not a run's embeddings nor a per-protein
    file, another model's, or without the layer compared (or, a per-protein file from outside
    esmshard, of another width)."""
    give = "give the reference's esmshard outdir or embeddings.h5 (embedded with the same model)"
    path = reference_file(setting, "")
    if is_object_url(setting) or not Path(path).is_file():
        return [f"neighbours: {setting} is neither an embeddings.h5 nor an outdir that holds "
                "one: give the reference's (embedded with the same model), or self"]  # fmt: skip
    try:
        with open_reference(path) as reference:
            made, layers, width = reference.made_by, reference.layers, reference.dim
            num_layers = getattr(reference, "num_layers", None)
    except DamagedFileError as err:
        return [f"neighbours: {err.problem}: {give}, or self"]
    except OSError as err:
        return [f"neighbours: {path}: {err.strerror}: {give}, or self"]
    ours = run_model(config, model)
    if "model" not in made:  # a per-protein file from outside esmshard: its width alone
        if model is not None and model.embed_dim and width != model.embed_dim:
            return [f"neighbours: {path} holds vectors {width} wide, this run's model "
                    f"{model.embed_dim}: {give}"]  # fmt: skip
        return []
    problems = []
    if ours and found.model_of(made) != ours:
        problems.append(
            f"neighbours: {path} was embedded with {found.model_of(made)}, this run with "
            f"{ours}: {give}"
        )
    layer = config["neighbours_layer"]
    wanted = config["repr_layers"][-1] if layer == LAST else layer
    if layers is not None and stored_layer(wanted, num_layers) not in layers.get("mean", []):
        problems.append(
            f"neighbours: {path} holds mean embeddings at layers {layers.get('mean', [])}, not "
            f"at {wanted}: set neighbours_layer to one of them (and in repr_layers)"
        )
    return problems


def run_model(config: dict, model) -> str | None:
    """The run's model as `esmshard.outputs.nearest.model_of` names a file's, or None before
    its weights are on this machine (a hub model not yet downloaded)."""
    if model is None or "outdir" not in config:
        return None
    sha256 = weights_sha256(model, Layout(config["outdir"]).checksums)
    if sha256 == "unknown":
        return None
    return found.model_of({"model": config["model"], "weights_sha256": sha256})
