"""The shard step, embed jobs and merge where the store is in object storage: each works on its
own copy of what it needs of the store (esmshard.store.mirror), fetched before it runs and sent
back as it goes, so that no job reads a file that another job wrote on its node, and no job
sends on what an earlier one left in its folder.
"""

import json
from contextlib import contextmanager
from pathlib import Path
from tempfile import TemporaryDirectory

from ..store import MARKER, PIECES, Store, settings_key
from ..store.key_index import KeyIndex, is_index
from ..store.location import Location, reaching
from ..store.mirror import WHOLE, mirrored
from ..store.parts import index_parts
from . import embed, merge, shard


def is_piece(relative: str) -> bool:
    return f"/{PIECES}/" in f"/{relative}"


def key_scope(key: str) -> tuple[str, ...]:
    """A settings key's folder (its settings named: they are fetched where the folder is not
    listed) and the store's mark: what the shard step and merge read."""
    return (f"{key}/", f"{key}/settings.json", MARKER)


def is_part(relative: str) -> bool:
    """A part's values (`<key>/<part>.h5`): fetched only where the step opens it."""
    return relative.count("/") == 1 and relative.endswith(".h5")


@contextmanager
def key_copy(settings: dict, lazy=is_part, listed=None):
    """The job's own copy of the store's settings key (the manifests, and each part's values
    once the step opens them; not the kept pieces, which only their shard's job reads), as a
    Store, in a temporary folder of its own that goes when the step ends: nothing of it is
    left for the next job or run in the same folder. `lazy`: what is fetched only when opened;
    `listed`: whether the key's folder is listed (None: only where the key has no index yet)."""
    key = settings_key(settings)
    if listed is None:
        listed = lambda bucket: not KeyIndex(bucket, key).exists()  # noqa: E731
    with TemporaryDirectory(prefix="esmshard-store-") as root:
        with mirrored(root, key_scope(key), is_piece, lazy, listed=listed) as mirror:
            yield Store(root, mirror.where.url, mirror)


def is_part_file(relative: str) -> bool:
    """A part's values or its manifest: merge opens those of the parts the run uses alone."""
    return is_part(relative) or (
        relative.count("/") == 1
        and relative.endswith(".json")
        and not relative.endswith("/settings.json")
    )


@contextmanager
def bucket_store(url: str):
    """The store at `url` in object storage, for a command (`esmshard store`): a Store on a
    temporary copy of its manifests, settings and kept pieces (not its keys' indexes, which the
    command reads and extends itself), each part's values fetched when the command opens it, and
    what the command changed there (parts set aside) sent back."""
    with TemporaryDirectory(prefix="esmshard-store-") as root:
        where = reaching(url)
        with mirrored(root, (WHOLE,), is_index, is_part, where=where) as mirror:
            yield Store(root, url, mirror)


def shard_step(settings: dict, model_size, store_root, input_names=None, **params):
    """`esmshard.steps.shard.shard_step` on the job's copy of the store's settings key, the
    plan naming the inputs' objects (`input_names`) by their URLs."""
    if not Location.of_job().in_objects:
        return shard.shard_step(settings, model_size, store_root=store_root, **params)
    with key_copy(settings) as store:
        return shard.shard_step(
            settings, model_size, store_root=store, input_names=input_names, **params
        )


def merge_step(settings: dict, store_root, **params):
    """`esmshard.steps.merge.merge` on the job's copy of the store's settings key, fetching
    the manifests and values of only the parts the run uses (looked up, the key's folder not
    listed); then the run's new parts are added to the key's index."""
    if not Location.of_job().in_objects:
        return merge.merge(settings=settings, store_root=store_root, **params)
    with key_copy(settings, is_part_file, listed=False) as store:
        counts = merge.merge(settings=settings, store_root=store, **params)
        plan_id, key = (
            json.loads(Path(params["plan_json"]).read_text())["plan"],
            settings_key(settings),
        )
        index_parts(store, key, [name for name in store.parts(key) if name.startswith(plan_id)])
        return counts


def run_shard(out_h5, shard, settings: dict, **params):
    """`esmshard.steps.embed.run_shard` with its shard's kept pieces fetched first and each piece
    sent to the object store as it is kept, so that the next job of the shard, on any node,
    resumes from them; once the part is made, its pieces are removed there too."""
    if not Location.of_job().in_objects:
        return embed.run_shard(out_h5=out_h5, shard=shard, settings=settings, **params)
    store = embed.part_store(out_h5)
    key = Path(out_h5).parent.name
    scope = (f"{key}/{PIECES}/{shard}/", f"{key}/settings.json")
    with mirrored(store.root, scope) as mirror:
        return embed.run_shard(
            out_h5=out_h5, shard=shard, settings=settings, on_kept=mirror.push, **params
        )
