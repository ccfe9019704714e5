"""`esmshard store`: what a store holds, verified, pruned or with a setting's entries removed."""

import contextlib
import json
import logging
import os
from pathlib import Path

from .. import store as stores
from ..files import human_bytes, is_object_url, unwritable
from ..steps.object_store import bucket_store
from ..store import storelock
from ..store.object_file import object_file
from ..store.storelock import StoreBusyError


def store_of(path: Path) -> Path:
    """The store that `path` names: the store itself, or the one a run in outdir `path` used."""
    named = (stores.read_json_object(path / "run.json") or {}).get("store")
    if isinstance(named, str):
        return Path(named)
    return path / "store" if (path / "store").is_dir() else path


def bucket_store_of(url: str) -> str:
    """The store that `url` names in object storage: the store itself (it holds the store's
    mark), or the one a run in outdir `url` used (its run.json says which)."""
    url = url.rstrip("/")
    try:
        return json.loads(object_file(f"{url}/run.json").read())["store"]
    except (FileNotFoundError, ValueError, KeyError, TypeError):
        return url


def show_bucket_store(parser, args) -> int:
    """`esmshard store` of a store in object storage: list it, or --verify it."""
    if args.remove is not None or args.prune:
        parser.exit(1, "esmshard store: --remove and --prune change a store in a folder only "
                       "for now; list or --verify a store in object storage\n")  # fmt: skip
    try:
        with bucket_store(bucket_store_of(args.path)) as store:
            # its objects' writers are on other machines: no lock here holds them
            return store_command(args, store.checked(), None, contextlib.nullcontext())
    except (KeyError, ValueError) as err:
        parser.exit(1, f"esmshard store: {err.args[0]}\n")
    except OSError as err:
        parser.exit(1, f"esmshard store: {err}\n")


def show_store(parser, args) -> int:
    if is_object_url(args.path):
        return show_bucket_store(parser, args)
    if not args.path.is_dir():
        parser.error(f"{args.path} is not a folder; give a store or a run's outdir")
    try:
        store = stores.Store(str(store_of(args.path))).checked()
        read_only = unwritable(store.root)
        if read_only and (args.remove is not None or args.apply):
            raise ValueError(f"{read_only}; nothing was removed")
        if args.remove is not None:
            stores.remove(store, args.remove)
            print(f"removed the entries of settings {args.remove} from {store.root}")
            return 0
        # What a live run or call writes, its kept pieces included, is held from maintenance
        # by its settings key: every key is taken before anything is read (a store that
        # cannot be written is changed by no one: nothing to hold).
        held = contextlib.nullcontext()
        if (args.verify or args.prune) and not read_only:
            doing = "verify" if args.verify else "prune"
            held = storelock.exclusive(store.root, store.settings_keys(), doing)
        return store_command(args, store, read_only, held)
    except (KeyError, ValueError, StoreBusyError) as err:
        parser.exit(1, f"esmshard store: {err.args[0]}\n")
    except OSError as err:  # e.g. a part another user owns: no traceback for a path
        parser.exit(1, f"esmshard store: {err}\n")


def store_command(args, store, read_only: str | None, held) -> int:
    """Verify or prune `store` (`held` from runs meanwhile), or list what it holds."""
    if args.verify or args.prune:
        with held:
            if args.verify:
                return verify_store(store, read_only)
            return prune_store(store, args.keep, args.apply)
    return list_store(store)


def list_store(store) -> int:
    """Print what `store` holds, per settings key; exit status 1 where it holds nothing."""
    rows = stores.summary(store)
    foreign = store.foreign()
    if not rows:
        print(f"{store.name}: no embeddings stored")
    else:
        print(f"{store.name}:")
    for row in rows:
        settings = ", ".join(f"{k}={json.dumps(v)}" for k, v in row["settings"].items())
        kept = (
            f"; {row['piece_sequences']} sequences kept by interrupted jobs in {row['pieces']} "
            f"pieces, {human_bytes(row['piece_bytes'])}"
            if row["pieces"]
            else ""
        )
        print(
            f"  {row['key']}: {row['sequences']} sequences in {row['parts']} parts, "
            f"{human_bytes(row['bytes'])}{kept}\n    {settings}"
        )
    for name in foreign:
        why = (
            " (its settings.json is not one esmshard wrote, or is damaged)"
            if stores.SETTINGS_KEY.match(name) and os.path.exists(store.settings(name))
            else ""
        )
        print(f"  {name}: not esmshard's, left alone{why}")
    return 0 if rows else 1


def verify_store(store, read_only: str | None) -> int:
    # Each damaged part gets one line below; the store's own warning for it would be a second.
    logging.getLogger(stores.__name__).setLevel(logging.ERROR)
    verified = stores.verify(store)
    done = f"left in place ({read_only})" if read_only else "set aside"
    for part, reason in verified.damaged:
        print(f"damaged: {store.shown(part)}: {reason}; {done} (the next run recomputes its "
              "sequences)")  # fmt: skip
    pieces = f" and {verified.n_pieces} kept pieces" if verified.n_pieces else ""
    print(
        f"{store.name}: {verified.n_parts} parts{pieces} checked, {len(verified.damaged)} damaged"
    )
    return 1 if verified.damaged else 0


def prune_store(store, keep, apply: bool) -> int:
    files = stores.unused(store, keep)
    for f in files:
        print(f"{human_bytes(f.bytes):>10}  {f.path}")
    total = human_bytes(sum(f.bytes for f in files))
    if not apply:
        print(f"{len(files)} files, {total}, are used by none of {len(keep)} outdirs; "
              "nothing removed (add --apply to remove them)")  # fmt: skip
        return 0
    stores.prune(files)
    print(f"removed {len(files)} files, {total}")
    return 0
