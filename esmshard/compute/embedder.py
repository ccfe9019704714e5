"""The forward pass over batches on one device: tokens, out-of-memory halving, look-ahead, windows."""

import logging
import os
import time
from typing import NamedTuple

import numpy as np
import torch

from ..contacts import NAME as CONTACTS
from ..contacts import upper_triangle
from ..input.long_sequences import chunk_spans
from ..models.esm2 import FastESM2
from ..models.layers import FastForward, Packed
from ..representations import KINDS, Representation
from ..store.shardfile import Failure
from .precision import Precision, autocast

log = logging.getLogger(__name__)

MEAN, PER_TOK, BOS = KINDS  # the representation kinds, as the read-back names them

# Test hook: batches of more tokens than this raise an out-of-memory error, as CUDA would.
INJECT_OOM_ENV = "ESMSHARD_INJECT_OOM_TOKENS"
# Test hook: each batch takes this many seconds more, as a large model's would (a scheduler's
# time limit reached mid-shard, whatever the test machine's speed).
SLOW_BATCHES_ENV = "ESMSHARD_TEST_SECONDS_PER_BATCH"


# What a batch's read-back holds besides the representation kinds and the contact maps.
FINITE = "finite"  # one flag per sequence: every value at every layer is finite


class Launched(NamedTuple):
    """A batch whose forward pass and read-back are queued; `Embedder.finish` reads it."""

    values: dict[str, torch.Tensor]  # per kind: layers × rows × D; contacts: B × L × L; FINITE: B
    copied: "torch.cuda.Event | None"  # passed once `values` are on the host (None on a CPU)
    lengths: np.ndarray  # residues of each sequence


def placed(model, device, precision: Precision | None) -> None:
    """`model`'s weights moved to `device` tensor by tensor (host memory never holds a second
    copy), in the dtypes esmshard's forward pass computes with (`precision`): fp32, whatever
    dtype the files hold (the 6B ESM C's are bf16), except on a GPU under autocast (bf16, fp16),
    where the dense layers' weights take its dtype: the values autocast would cast them to for
    each product (the same numbers, half the device memory, no cast per batch). `precision`
    None: in the dtypes they have (fair-esm's own forward pass)."""
    half = None
    if precision and precision.autocast_dtype and device.type != "cpu":
        half = getattr(torch, precision.autocast_dtype)
    moved = {}  # id of a tensor -> what it became: a weight two modules share stays one
    for module in model.modules():
        dense = isinstance(module, torch.nn.Linear)
        for table in (module._parameters, module._buffers):
            for name, tensor in table.items():
                if tensor is None:
                    continue
                if id(tensor) not in moved:
                    dtype = None
                    if precision and tensor.is_floating_point():
                        dtype = half if dense and half else torch.float32
                    moved[id(tensor)] = _moved(tensor, device, dtype)
                table[name] = moved[id(tensor)]


def _moved(tensor, device, dtype):
    """`tensor` on `device` in `dtype` (None: its own), a parameter still one."""
    data = tensor.detach().to(device, dtype)
    if isinstance(tensor, torch.nn.Parameter):
        return torch.nn.Parameter(data, requires_grad=tensor.requires_grad)
    return data


class Embedder:
    """A model's forward pass with fair-esm's token layout (BOS, residues, EOS; no BOS where
    the alphabet has none), on one device.

    Only what `kinds` asks for leaves the device: the mean over each sequence's residues and the
    BOS row are reduced there (in fp32, whatever the precision), per-residue rows are gathered
    without their padding, and each kind crosses to the host as one copy for the whole batch.
    """

    def __init__(
        self,
        model,
        alphabet,
        layers,
        device,
        precision: Precision,
        fast_path=True,
        contacts=False,
        kinds=tuple(KINDS),
        packed=False,
    ):
        # Contact maps need the attention maps: fair-esm's own forward pass computes them. A
        # family whose model is a fast forward pass itself (ESM C) has no other one.
        self.contacts = contacts
        if isinstance(model, FastForward) and contacts:
            raise ValueError("contact maps need a model with a contact head (ESM-2)")
        # esmshard's own forward pass (it packs and compiles where its family does); fair-esm's
        # ESM-2 has it unless asked otherwise, fair-esm's ESM-1b none
        self.fast = isinstance(model, FastForward) or (
            fast_path and not contacts and FastESM2.takes(model)
        )
        placed(model, device, precision if self.fast else None)
        self.model = model
        if isinstance(model, FastForward):
            self.net = model
            model.ready(device)
        else:
            self.net = FastESM2(model) if self.fast else model
        # Packed batches (esmshard.models.layers.Packed) where the forward pass takes them.
        self.packed = packed and self.fast and self.net.packs
        self.alphabet = alphabet
        self.bos = int(alphabet.prepend_bos)  # tokens before the residues: 1 or 0
        self.layers = sorted(layers)
        self.device = device
        self.precision = precision
        self.kinds = tuple(kinds)
        self.inject_oom_tokens = int(os.environ.get(INJECT_OOM_ENV, 0)) or None
        self.seconds_per_batch = float(os.environ.get(SLOW_BATCHES_ENV, 0))
        # The host's own work on batches (tokens, read-back, checks), in seconds: not the
        # queueing of the forward pass, which waits for the device once its queue is full.
        self.host_seconds = 0.0
        # Token of each byte that is a one-letter token of the alphabet, -1 for the others.
        self.token_of_byte = np.full(256, -1, dtype=np.int64)
        for token, index in alphabet.tok_to_idx.items():
            if len(token) == 1:
                self.token_of_byte[ord(token)] = index

    @property
    def batching(self) -> str:
        return "packed" if self.packed else "padded"

    def tokens(self, sequences: list[str]) -> torch.Tensor:
        """fair-esm's batch layout ([BOS,] residues, EOS, padding) from one table lookup per batch.

        Encoding residue by residue in Python, as fair-esm's converter does, manages about 0.3M
        residues/s: on a GPU that would take longer than the forward pass.
        """
        lengths = np.array([len(s) for s in sequences])
        residues = self.residue_tokens(sequences)
        toks = np.full(
            (len(sequences), lengths.max() + self.bos + 1),
            self.alphabet.padding_idx,
            dtype=np.int64,
        )
        rows = np.repeat(np.arange(len(sequences)), lengths)
        start = np.repeat(np.cumsum(lengths) - lengths, lengths)
        toks[rows, np.arange(len(residues)) - start + self.bos] = residues
        if self.bos:
            toks[:, 0] = self.alphabet.cls_idx
        toks[np.arange(len(sequences)), lengths + self.bos] = self.alphabet.eos_idx
        return torch.from_numpy(toks)

    def packed_tokens(self, sequences: list[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The sequences' tokens laid end to end, each [BOS,] residues, EOS; each one's count of
        tokens; and which tokens are residues."""
        counts = np.array([len(s) + self.bos + 1 for s in sequences])
        ends = np.cumsum(counts)
        toks = np.full(ends[-1], self.alphabet.eos_idx, dtype=np.int64)
        residue = np.ones(ends[-1], dtype=bool)
        residue[ends - 1] = False
        if self.bos:
            toks[ends - counts] = self.alphabet.cls_idx
            residue[ends - counts] = False
        toks[residue] = self.residue_tokens(sequences)
        return toks, counts, residue

    def residue_tokens(self, sequences: list[str]) -> np.ndarray:
        """Every residue's token, the sequences one after the other."""
        residues = self.token_of_byte[
            np.frombuffer("".join(sequences).encode("ascii"), dtype=np.uint8)
        ]
        if (residues < 0).any():
            raise ValueError("a sequence holds characters that are not the model's residue tokens")
        return residues

    def to_device(self, array: np.ndarray) -> torch.Tensor:
        """A host array on the device, its copy queued without waiting (pinned memory on a GPU)."""
        tensor = torch.from_numpy(array)
        if self.device.type != "cuda":
            return tensor
        return tensor.pin_memory().to(self.device, non_blocking=True)

    def launch(self, sequences: list[str], kinds=None) -> Launched:
        """Queue the batch's forward pass and the read-back of `kinds` (default: the Embedder's);
        `finish` waits for them. The host does not wait for the device here, so on a GPU it can
        prepare the next batch meanwhile.
        """
        kinds = self.kinds if kinds is None else kinds
        started = time.perf_counter()
        lengths = np.array([len(s) for s in sequences])
        # Residue positions (BOS, EOS and padding left out), known on the host: no device sync.
        if self.packed:
            toks, counts, residue = self.packed_tokens(sequences)
        else:
            toks = self.tokens(sequences).numpy()
            width = toks.shape[1]
            residue = (np.arange(width) >= self.bos) & (
                np.arange(width) < lengths[:, None] + self.bos
            )
        self.host_seconds += time.perf_counter() - started
        time.sleep(self.seconds_per_batch)
        if self.inject_oom_tokens and toks.size > self.inject_oom_tokens:
            raise torch.OutOfMemoryError(f"injected: batch of {toks.size} tokens")
        with torch.inference_mode():
            with autocast(self.precision, self.device):
                if self.packed:
                    batch = Packed.of(toks, counts, self.to_device)
                    out = self.net(batch, self.layers)
                elif self.contacts:
                    out = self.net(
                        self.to_device(toks), repr_layers=self.layers, return_contacts=True
                    )
                elif self.fast:
                    padded = bool(residue.sum() < toks.size - (self.bos + 1) * len(sequences))
                    out = self.net(self.to_device(toks), self.layers, padded=padded)
                else:
                    out = self.net(self.to_device(toks), repr_layers=self.layers)
            reps = [out["representations"][layer] for layer in self.layers]
            if self.packed:
                values = self.reduce_packed(reps, batch, self.to_device(residue), kinds, self.bos)
            else:
                values = self.reduce(reps, self.to_device(residue), kinds, self.bos)
            if PER_TOK in kinds:
                values[PER_TOK] = self.gather(reps, self.to_device(np.flatnonzero(residue)))
            if self.contacts:
                values[CONTACTS] = out["contacts"].float()
            if self.device.type != "cuda":
                return Launched(values, None, lengths)
            host = {
                name: torch.empty(value.shape, dtype=value.dtype, pin_memory=True).copy_(
                    value, non_blocking=True
                )
                for name, value in values.items()
            }
            copied = torch.cuda.Event()
            copied.record()
            return Launched(host, copied, lengths)

    @staticmethod
    def reduce(reps: list[torch.Tensor], residue: torch.Tensor, kinds, bos=1) -> dict:
        """The per-sequence kinds and the finite flags, on the device, accumulated in fp32.

        A sequence's sum over its residues is finite exactly when each of them is (but for an
        overflow, which is no usable result either), so it and the BOS row stand for the check.
        """
        mask = residue[:, :, None]
        sums = [rep.masked_fill(~mask, 0).sum(1, dtype=torch.float32) for rep in reps]
        counts = residue.sum(1, keepdim=True, dtype=torch.float32)
        bos_rows = [rep[:, 0] for rep in reps] if bos else None
        return Embedder.per_sequence(sums, bos_rows, counts, kinds)

    @staticmethod
    def reduce_packed(reps, packed: Packed, residue: torch.Tensor, kinds, bos=1) -> dict:
        """`reduce` for a packed batch: each sequence's sum by a segment reduction (in order,
        so a sequence's numbers do not depend on where in the batch it lies)."""
        counts = packed.bounds.diff()
        sums = [
            torch.segment_reduce(
                rep.masked_fill(~residue[:, None], 0).float(), "sum", lengths=counts
            )
            for rep in reps
        ]
        first = packed.bounds[:-1].long()
        residues = (counts - bos - 1).float()[:, None]
        bos_rows = [rep[first] for rep in reps] if bos else None
        return Embedder.per_sequence(sums, bos_rows, residues, kinds)

    @staticmethod
    def per_sequence(sums, bos_rows, counts, kinds) -> dict[str, torch.Tensor]:
        """From each layer's per-sequence sums, BOS rows (None without a BOS) and residue
        counts: the kinds asked for and the finite flags."""
        checked = sums + (bos_rows or [])
        finite = torch.stack([torch.isfinite(s).all(1) for s in checked]).all(0)
        values = {FINITE: finite}
        if MEAN in kinds:
            values[MEAN] = torch.stack([s / counts for s in sums])
        if BOS in kinds and bos_rows:
            values[BOS] = torch.stack([b.float() for b in bos_rows])
        return values

    @staticmethod
    def gather(reps: list[torch.Tensor], positions: torch.Tensor) -> torch.Tensor:
        """layers × residues × D: every sequence's residue rows, one after the other."""
        dim = reps[0].shape[-1]
        out = torch.empty(
            (len(reps), len(positions), dim), dtype=torch.float32, device=reps[0].device
        )
        for k, rep in enumerate(reps):
            torch.index_select(rep.float().reshape(-1, dim), 0, positions, out=out[k])
        return out

    def finish(self, launched: Launched) -> tuple[list[dict[int, Representation]], np.ndarray]:
        """Per sequence, {layer: Representation} (float32, on the CPU), and its finite flag."""
        values, copied, lengths = launched
        if copied is not None:
            copied.synchronize()
        started = time.perf_counter()
        arrays = {name: value.numpy() for name, value in values.items()}
        finite = arrays.pop(FINITE)
        maps = arrays.pop(CONTACTS, None)  # B × L × L, BOS and EOS already left out
        offsets = np.concatenate([[0], np.cumsum(lengths)])
        reps = []
        for row, n in enumerate(lengths):
            triangle = None if maps is None else upper_triangle(maps[row, :n, :n])
            rows = {
                kind: (slice(offsets[row], offsets[row + 1]) if kind == PER_TOK else row)
                for kind in arrays
            }
            reps.append(
                {
                    layer: Representation(
                        int(n),
                        contacts=triangle,
                        **{kind: array[k, rows[kind]] for kind, array in arrays.items()},
                    )
                    for k, layer in enumerate(self.layers)
                }
            )
            if triangle is not None:
                finite[row] &= np.isfinite(triangle).all()
        self.host_seconds += time.perf_counter() - started
        return reps, finite

    def forward(self, sequences: list[str], kinds=None) -> list[dict[int, Representation]]:
        """One batch, start to end."""
        return self.finish(self.launch(sequences, kinds))[0]

    def launch_halving(
        self, indices: list[int], sequences: list[str], failed: list[Failure], kinds=None
    ) -> list[tuple]:
        """`launch` the batch, or on out-of-memory its halves, down to single sequences.

        Returns (indices, launched) per part; a sequence that does not fit even alone is appended
        to `failed`.
        """
        try:
            return [(indices, self.launch(sequences, kinds))]
        except torch.OutOfMemoryError as err:
            reason = str(err)
        # Retried outside the handler: the exception's traceback holds the failed attempt's
        # frames, and with them every tensor it had allocated, until the handler is left.
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        if len(sequences) == 1:
            failed.append(
                Failure(
                    indices[0],
                    f"out of memory even alone ({len(sequences[0])} residues): {reason}",
                )
            )
            return []
        half = len(sequences) // 2
        log.warning(
            "out of memory on a batch of %d sequences; retrying as two halves", len(sequences)
        )
        return self.launch_halving(
            indices[:half], sequences[:half], failed, kinds
        ) + self.launch_halving(indices[half:], sequences[half:], failed, kinds)

    def finish_checked(self, parts: list[tuple], failed: list[Failure]) -> list[tuple]:
        """(indices, representations) per launched part; sequences with non-finite values go to `failed`."""
        results = []
        for indices, launched in parts:
            reps, finite = self.finish(launched)
            for index, ok in zip(indices, finite):
                if not ok:
                    failed.append(Failure(index, "non-finite values in the representations"))
            kept = [(index, rep) for index, rep, ok in zip(indices, reps, finite) if ok]
            if kept:
                results.append(([i for i, _ in kept], [r for _, r in kept]))
        return results

    def embed(
        self, indices: list[int], sequences: list[str], failed: list[Failure], kinds=None
    ) -> list[tuple]:
        """(indices, representations) for the batch, halving it on out-of-memory."""
        return self.finish_checked(self.launch_halving(indices, sequences, failed, kinds), failed)

    def embed_batches(self, batches, failed: list[Failure]):
        """Yield `embed`'s result for each (indices, sequences) of `batches`, in order.

        Each batch is launched before the previous one's results are read back, so that a GPU
        computes while the host copies, checks and writes the batch before.
        """
        previous = None
        for indices, sequences in batches:
            parts = self.launch_halving(indices, sequences, failed)
            if previous is not None:
                yield self.finish_checked(previous, failed)
            previous = parts
        if previous is not None:
            yield self.finish_checked(previous, failed)

    def embed_chunked(self, index: int, sequence: str, window: int, failed: list[Failure]):
        """One long sequence through overlapping windows, stitched; None (and `failed` noted) if a window fails.

        The windows' residue rows come back whatever `kinds` says: the mean is over the whole
        sequence, taken once they are stitched.
        """
        spans = chunk_spans(len(sequence), window)
        pieces, window_failures = {}, []
        windows = [sequence[span.start : span.end] for span in spans]
        kinds = (PER_TOK, BOS) if self.bos else (PER_TOK,)
        for done, reps in self.embed(list(range(len(spans))), windows, window_failures, kinds):
            pieces.update(zip(done, reps))
        if window_failures:
            k, reason = window_failures[0]
            failed.append(Failure(index, f"window {k + 1} of {len(spans)} failed: {reason}"))
            return None
        return {
            layer: Representation.from_per_tok(
                np.concatenate(
                    [
                        pieces[k][layer].per_tok[
                            span.keep_from - span.start : span.keep_to - span.start
                        ]
                        for k, span in enumerate(spans)
                    ]
                ),
                pieces[0][layer].bos,
            )
            for layer in pieces[0]
        }
