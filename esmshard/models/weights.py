"""Reading what weight files hold without loading them: a folder's config.json, the tensor names
and shapes of safetensors files and of torch checkpoints (.pt, .pth), so that a model's family
is told from its own files when the workflow is planned, without torch. Also the two loaders that
every family shares: torch checkpoints, unpickling nothing but tensors, and the HuggingFace hub.
"""

import argparse
import collections
import contextlib
import contextvars
import json
import pickle
import re
import struct
import zipfile
from pathlib import Path
from typing import NamedTuple

from .spec import ModelError

# A transformers folder's weights where it has no .safetensors files (ProtT5's and ProtBert's
# repositories hold no other).
BIN_WEIGHTS = "pytorch_model*.bin"
# What is downloaded of a hub repository: its config, weights and tokenizer files; pytorch_model
# .bin files only where it has no .safetensors or .pth.
HF_PATTERNS = [
    "config.json",
    "*.safetensors",
    "*.pth",
    "tokenizer.json",
    "spiece.model",
    "vocab.txt",
]
HF_BIN_PATTERNS = [BIN_WEIGHTS]
CHECKPOINT_SUFFIXES = (".pt", ".pth")


class Tensor(NamedTuple):
    """A tensor in a file, by its shape alone."""

    shape: tuple[int, ...]


def read_config(folder: Path) -> dict | None:
    """A folder's config.json, None if there is none."""
    path = Path(folder) / "config.json"
    if not path.exists():
        return None
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise ModelError(
            f"{path} cannot be read ({err}); a model folder is one saved by transformers' "
            "save_pretrained (config.json and .safetensors files)"
        ) from err


def safetensors_files(folder: Path) -> list[Path]:
    files = sorted(Path(folder).glob("*.safetensors"))
    if not files:
        raise ModelError(
            f"{folder} holds no .safetensors weights; save the model with transformers' "
            "save_pretrained (safetensors is its default)"
        )
    return files


def folder_weight_files(folder: Path) -> list[Path]:
    """A transformers folder's .safetensors files, else its pytorch_model*.bin files."""
    files = sorted(Path(folder).glob("*.safetensors")) or sorted(Path(folder).glob(BIN_WEIGHTS))
    if not files:
        raise ModelError(
            f"{folder} holds no weights (.safetensors or pytorch_model.bin); save the model "
            "with transformers' save_pretrained"
        )
    return files


# Set inside `shapes_only`: the readers below give tensors of torch's meta device.
_SHAPES_ONLY = contextvars.ContextVar("esmshard_shapes_only", default=False)


FILLS = ("normal_", "uniform_")  # nn.init's random fills (kaiming_uniform_'s too)


@contextlib.contextmanager
def on_meta():
    """Parameters made inside have no storage (torch's meta device) nor their initial random
    values: the weights come from a file. Everything else a module computes as it is built (a
    rotary embedding's frequencies) is computed on the CPU as usual: on the meta device, an
    operation without a meta kernel goes through torch's reference decompositions, whose first
    use imports torch._dynamo (1.3 s of each embed job on a CPU)."""
    import torch
    from torch.overrides import TorchFunctionMode

    class SkipFills(TorchFunctionMode):
        """nn.init's random fills of a parameter on the meta device: nothing to fill."""

        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            tensor = args[0] if args else kwargs.get("tensor")  # nn.init.normal_(tensor=...)
            if getattr(func, "__name__", "") in FILLS and getattr(tensor, "is_meta", False):
                return tensor
            return func(*args, **kwargs)

    register = torch.nn.Module.register_parameter

    def register_on_meta(module, name, param):
        if param is not None and not param.is_meta:  # made on the CPU, never filled: no pages
            param = torch.nn.Parameter(param.to("meta"), requires_grad=param.requires_grad)
        register(module, name, param)

    torch.nn.Module.register_parameter = register_on_meta
    try:
        with SkipFills():
            yield
    finally:
        torch.nn.Module.register_parameter = register


@contextlib.contextmanager
def shapes_only():
    """Inside the block, `mapped_tensors` and `safe_load` give each tensor as one of torch's meta
    device, of the file's shape, read from the file's header (no weight is read), and models
    are built with their parameters there (`on_meta`, fair-esm's own ESM-1 loader's too): a
    family's own loader runs whole, its names, shapes and checks included, in a second and no
    memory (esmshard.models.fit_problems)."""
    token = _SHAPES_ONLY.set(True)
    try:
        with on_meta():
            yield
    finally:
        _SHAPES_ONLY.reset(token)


def _on_meta(value):
    """`value` (checkpoint_contents') with each Tensor(shape) a meta tensor of that shape."""
    import torch

    if isinstance(value, Tensor):
        return torch.empty(value.shape, device="meta")
    if isinstance(value, dict):
        return {k: _on_meta(v) for k, v in value.items()}
    return value


def mapped_tensors(path: Path) -> dict:
    """The tensors of a .safetensors file or a torch checkpoint, memory-mapped from the file
    (nothing is read until used), in its dtypes; inside `shapes_only`, their shapes alone."""
    if _SHAPES_ONLY.get():
        return _on_meta(
            safetensors_tensors([path])
            if path.suffix == ".safetensors"
            else checkpoint_contents(path)
        )
    if path.suffix == ".safetensors":
        from safetensors import safe_open

        with safe_open(str(path), framework="pt") as fh:  # the tensors map the file
            return {name: fh.get_tensor(name) for name in fh.keys()}
    return safe_load(path, mmap=True)


def safetensors_tensors(files) -> dict[str, Tensor]:
    """Names and shapes from the files' headers (8 bytes of length, then JSON)."""
    tensors = {}
    for path in files:
        with open(path, "rb") as fh:
            (size,) = struct.unpack("<Q", fh.read(8))
            header = json.loads(fh.read(size))
        tensors.update(
            {
                name: Tensor(tuple(v["shape"]))
                for name, v in header.items()
                if name != "__metadata__"
            }
        )
    return tensors


# What a checkpoint may hold besides tensors: fair-esm's config.
SAFE_GLOBALS = {
    ("collections", "OrderedDict"): collections.OrderedDict,
    ("argparse", "Namespace"): argparse.Namespace,
}
TENSOR_REBUILDERS = {
    ("torch._utils", "_rebuild_tensor_v2"): lambda storage, offset, size, *_: Tensor(tuple(size)),
    ("torch._utils", "_rebuild_parameter"): lambda data, *_: data,
    ("torch._tensor", "_rebuild_from_type_v2"): lambda fn, _type, args, _state: fn(*args),
}


class _ShapesUnpickler(pickle.Unpickler):
    """A torch checkpoint's structure with its tensors as Tensor(shape), reading no tensor data."""

    def find_class(self, module, name):
        if (module, name) in SAFE_GLOBALS:
            return SAFE_GLOBALS[module, name]
        if (module, name) in TENSOR_REBUILDERS:
            return TENSOR_REBUILDERS[module, name]
        if module == "torch" and (name.endswith("Storage") or name in ("float32", "bfloat16")):
            return name  # a storage's type: its data is not read
        raise pickle.UnpicklingError(f"GLOBAL {module}.{name}")

    def persistent_load(self, pid):
        return None


def renamed(name: str, renames, ignored: re.Pattern) -> tuple[str, int] | None:
    """A tensor's name in esmshard's module, and which part of it the tensor fills (a rename's
    third item, else 0); None for a tensor left out; KeyError for one that has no place.
    `renames` are (pattern, replacement[, part]), tried in order at the name's start."""
    if ignored.match(name):
        return None
    for pattern, replacement, *part in renames:
        new_name, n = re.subn("^" + pattern, replacement, name)
        if n:
            return new_name, (part[0] if part else 0)
    raise KeyError(name)


def checkpoint_contents(path: Path):
    """What a torch checkpoint holds (dicts, fair-esm's config), its tensors as Tensor(shape).

    A checkpoint that holds other objects is refused, as `safe_load` would refuse it.
    """
    try:
        with zipfile.ZipFile(path) as archive:
            (pickled,) = [n for n in archive.namelist() if n.endswith("/data.pkl")]
            with archive.open(pickled) as fh:
                return _ShapesUnpickler(fh).load()
    except zipfile.BadZipFile:  # torch's format before 1.6 (torch is imported), or no checkpoint
        not_one = not_a_checkpoint(path)
        if not_one:
            raise ModelError(f"'{path}' {not_one}") from None
        import torch

        return _tensor_shapes(safe_load(path), torch.Tensor)
    except pickle.UnpicklingError as err:
        raise ModelError(
            f"refusing to load '{path}': it holds objects other than tensors and a fair-esm "
            f"config, and unpickling them could run arbitrary code ({err})"
        ) from err
    except (OSError, ValueError) as err:
        raise ModelError(f"'{path}' cannot be read as a torch checkpoint ({err})") from err


# How a torch checkpoint file starts: a zip archive (torch 1.6 and later), or a pickle of
# protocol 2 (torch's earlier format, fair-esm's first releases).
_ZIP_START, _PICKLE_START = b"PK\x03\x04", b"\x80\x02"


def not_a_checkpoint(path: Path) -> str | None:
    """Why `path`, which is no whole zip archive, is no torch checkpoint, if its start shows it."""
    with open(path, "rb") as fh:
        start = fh.read(4)
    if not start:
        return "is empty: download the checkpoint again"
    if start.startswith(_ZIP_START):
        return "is cut short (an interrupted download or copy?): download the checkpoint again"
    if not start.startswith(_PICKLE_START):
        return (
            "is not a torch checkpoint (it starts as neither a zip archive nor a pickle): give "
            "a .pt/.pth file saved by torch, a model folder or a model name"
        )
    return None


def _tensor_shapes(value, tensor_type):
    if isinstance(value, tensor_type):
        return Tensor(tuple(value.shape))
    if isinstance(value, dict):
        return {k: _tensor_shapes(v, tensor_type) for k, v in value.items()}
    return value


def safe_load(path: Path, mmap: bool = False) -> dict:
    """torch.load that unpickles tensors and fair-esm's argparse.Namespace config, nothing else.
    `mmap`: the tensors stay in the file, memory-mapped, read as they are used (a file in torch's
    format before 1.6 cannot be mapped: it is read whole). Inside `shapes_only`, the tensors'
    shapes alone."""
    if _SHAPES_ONLY.get():
        return _on_meta(checkpoint_contents(path))
    import torch

    try:
        with torch.serialization.safe_globals([argparse.Namespace]):
            return torch.load(str(path), map_location="cpu", weights_only=True, mmap=mmap)
    except RuntimeError as err:
        if mmap and "mmap can only be used" in str(err):  # torch's format before 1.6: read whole
            return safe_load(path)
        raise _damaged(path) from None
    except pickle.UnpicklingError as err:
        found = [line for line in str(err).splitlines() if "GLOBAL" in line]
        if not found:  # no foreign object named: the pickle itself is broken
            raise _damaged(path) from None
        raise ModelError(
            f"refusing to load '{path}': it holds objects other than tensors and a fair-esm "
            f"config, and unpickling them could run arbitrary code ({' '.join(found)})"
        ) from err
    except (EOFError, KeyError, ValueError):  # torch's other ways to find a cut file
        raise _damaged(path) from None


def _damaged(path: Path) -> ModelError:
    return ModelError(
        f"'{path}' cannot be read as a torch checkpoint: it is cut short or damaged; download "
        "the checkpoint again"
    )


def hf_snapshot(repo: str) -> Path:
    """The HuggingFace cache's folder of `repo` (HF_PATTERNS of it), fetched into the cache if
    it is not there (ModelError if it cannot be)."""
    folder = _hf_download(repo, HF_PATTERNS)
    if not any(folder.glob("*.safetensors")) and not any(folder.glob("*.pth")):
        folder = _hf_download(repo, HF_BIN_PATTERNS)
    return folder


def _hf_download(repo: str, patterns: list[str]) -> Path:
    from huggingface_hub import constants, snapshot_download

    try:
        return Path(snapshot_download(repo, allow_patterns=patterns, local_files_only=True))
    except Exception:  # not cached (huggingface_hub's error types vary between versions)
        pass
    try:
        return Path(snapshot_download(repo, allow_patterns=patterns))
    except Exception as err:  # any network failure means the same advice
        raise ModelError(
            f"cannot download hf:{repo} from the HuggingFace hub ({type(err).__name__}: "
            f"{str(err).splitlines()[0] if str(err) else ''}). Without network access, run "
            f"`hf download {repo}` where there is network and copy the HuggingFace cache "
            f"({constants.HF_HUB_CACHE}; HF_HOME moves it) here, or set `model:` to a folder "
            "saved by transformers (its config.json, weights and tokenizer files)"
        ) from err
