"""The forward pass over batches on one device: tokens, out-of-memory halving, look-ahead, windows."""

import logging
import os
import time
from typing import NamedTuple

import numpy as np
import torch

from ..embeddings_h5 import attentions as attention_maps
from ..embeddings_h5 import scores
from ..embeddings_h5.contacts import NAME as CONTACTS
from ..embeddings_h5.contacts import upper_triangle
from ..embeddings_h5.representations import LAYERED, Representation
from ..input.long_sequences import chunk_spans
from ..models.esm2 import FastESM2
from ..models.layers import FastForward, Packed
from ..store.passes import Passes
from ..store.shardfile import Failure
from . import windowed
from .batching import CPU_TOKENS_PER_BATCH
from .placement import placed
from .precision import Precision, autocast
from .reduction import FINITE, gather, reduce, reduce_packed

log = logging.getLogger(__name__)

MEAN, PER_TOK, BOS = LAYERED  # the layered kinds, as the read-back names them
LOGITS, MASKED_MARGINALS, PLL = scores.LOGITS, scores.MASKED_MARGINALS, scores.PLL
ATTENTIONS = attention_maps.NAME

# Test hook: batches of more tokens than this raise an out-of-memory error, as CUDA would.
INJECT_OOM_ENV = "ESMSHARD_INJECT_OOM_TOKENS"
# Test hook: each batch takes this many seconds more, as a large model's would (a scheduler's
# time limit reached mid-shard, whatever the test machine's speed).
SLOW_BATCHES_ENV = "ESMSHARD_TEST_SECONDS_PER_BATCH"


class Launched(NamedTuple):
    """A batch whose forward pass and read-back are queued; `Embedder.finish` reads it."""

    # per layered kind: layers × rows × D; contacts: B × L × L; logits, masked marginals:
    # residues × 20; pll: B × 2; attentions: B × layers × heads × L × L; FINITE: B
    values: dict[str, torch.Tensor]
    copied: "torch.cuda.Event | None"  # passed once `values` are on the host (None on a CPU)
    lengths: np.ndarray  # residues of each sequence


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
        kinds=tuple(LAYERED),
        packed=False,
        budget=CPU_TOKENS_PER_BATCH,
        attentions: attention_maps.Asked | None = None,
        score_windows: str = "weighted",
    ):
        # Contact maps need the attention maps, and attention maps are kept only by fair-esm's
        # own forward pass. A family whose model is a fast forward pass itself (ESM C) has no
        # other one.
        self.contacts, self.attentions = contacts, attentions
        if isinstance(model, FastForward) and (contacts or attentions):
            raise ValueError("contact and attention maps need fair-esm's model (ESM-2, ESM-1b/1v)")
        # esmshard's own forward pass (it packs and compiles where its family does); fair-esm's
        # ESM-2 and ESM-1b/1v have it unless asked otherwise
        self.fast = isinstance(model, FastForward) or (
            fast_path and not contacts and not attentions and FastESM2.takes(model)
        )
        placed(model, device, precision if self.fast else None)
        self.model = model
        if isinstance(model, FastForward):
            self.net = model
            model.ready(device)
        else:
            self.net = FastESM2(model) if self.fast else model
        if precision.fp8_products:
            if not self.fast:  # fair-esm's own forward pass (contact or attention maps)
                raise ValueError(
                    "precision: fp8 runs esmshard's own forward pass, which computes no contact "
                    "or attention maps (and fast_path: false asks for fair-esm's)"
                )
            self.net.use_fp8()
        # Packed batches (esmshard.models.layers.Packed) where the forward pass takes them.
        self.packed = packed and self.fast and self.net.packs
        self.alphabet = alphabet
        self.bos = int(alphabet.prepend_bos)  # tokens before the residues: 1 or 0
        self.layers = sorted(layers)
        self.device = device
        self.precision = precision
        self.kinds = tuple(kinds)
        # The language-model scores asked for (esmshard.embeddings_h5.scores): they need the
        # last layer and the head over it, masked marginals a pass per residue.
        self.scores = [kind for kind in self.kinds if kind in scores.NEEDS_HEAD]
        self.head = None
        if self.scores:
            self.head = getattr(self.model, "lm_head", None)
            if self.head is None or not getattr(self.model, "has_lm_head", True):
                raise ValueError("language-model scores need a model with its language-model head")
            self.columns = torch.tensor(scores.column_tokens(alphabet.tok_to_idx), device=device)
        # a long sequence's one-pass scores: esmshard.input.score_windows' recipe
        self.score_windows = score_windows
        self.num_layers = model.num_layers
        self.net_layers = sorted(set(self.layers) | ({self.num_layers} if self.scores else set()))
        self.budget = budget  # tokens per masked-marginal pass: a number, or of the longest
        self.inject_oom_tokens = int(os.environ.get(INJECT_OOM_ENV, 0)) or None
        self.seconds_per_batch = float(os.environ.get(SLOW_BATCHES_ENV, 0))
        # Each protein's masked passes so far, by its index in the batches (an embed job's
        # keeps them in the store: esmshard.store.passes).
        self.passes = Passes()
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

    def launch(self, sequences: list[str], kinds=None, indices=None) -> Launched:
        """Queue the batch's forward pass and the read-back of `kinds` (default: the Embedder's);
        `finish` waits for them. The host does not wait for the device here, so on a GPU it can
        prepare the next batch meanwhile. `indices` name the sequences to `passes` (default:
        their positions in the batch).
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
            out, batch = self.run(toks, counts if self.packed else None, self.net_layers, True)
            reps = [out["representations"][layer] for layer in self.layers]
            if self.packed:
                values = reduce_packed(reps, batch, self.to_device(residue), kinds, self.bos)
            else:
                values = reduce(reps, self.to_device(residue), kinds, self.bos)
            positions = self.to_device(np.flatnonzero(residue))
            if PER_TOK in kinds:
                values[PER_TOK] = gather(reps, positions)
            if self.contacts:
                values[CONTACTS] = out["contacts"].float()
            if self.attentions:  # B × layers × heads × tokens × tokens
                maps = out["attentions"][:, [layer - 1 for layer in self.attentions.layers]]
                if self.attentions.heads == "mean":
                    maps = maps.mean(2, keepdim=True, dtype=torch.float32)
                values[ATTENTIONS] = maps.float()
            if LOGITS in kinds:
                last = out["representations"][self.num_layers]
                logp = self.log_probs(last.reshape(-1, last.shape[-1]), positions)
                values[LOGITS] = logp[:, self.columns]
            if MASKED_MARGINALS in kinds or PLL in kinds:
                values.update(self.masked(sequences, kinds, indices))
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

    def run(self, toks: np.ndarray, counts, layers, maps: bool = False):
        """The forward pass over host tokens (packed where `counts` gives each sequence's
        tokens; `maps`: with the contact and attention maps the Embedder keeps): its output,
        and the Packed batch (None when padded)."""
        batch = None
        with autocast(self.precision, self.device):
            if counts is not None:
                batch = Packed.of(toks, counts, self.to_device)
                out = self.net(batch, layers)
            elif maps and (self.contacts or self.attentions):
                out = self.net(
                    self.to_device(toks),
                    repr_layers=layers,
                    need_head_weights=self.attentions is not None,
                    return_contacts=self.contacts,
                )
            elif self.fast:
                padded = bool((toks == self.alphabet.padding_idx).any())  # known on the host
                out = self.net(self.to_device(toks), layers, padded=padded)
            else:
                out = self.net(self.to_device(toks), repr_layers=layers)
        return out, batch

    def log_probs(self, last: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """The language-model head over the last layer's `rows` (tokens × D): the log-softmax
        over the whole vocabulary, in fp32."""
        with autocast(self.precision, self.device):
            logits = self.head(torch.index_select(last, 0, rows))
        return torch.log_softmax(logits.float(), dim=-1)

    def window_log_probs(self, toks: np.ndarray, flat: np.ndarray) -> torch.Tensor:
        """The log-softmax over the whole vocabulary, in fp32, at the flat positions `flat` of
        token rows `toks` (windows × width, no padding) passed as they are: a long protein's
        windows (esmshard.compute.windowed), whose slices may lack BOS or EOS."""
        with torch.inference_mode():
            out, _ = self.run(toks, None, [self.num_layers])
            last = out["representations"][self.num_layers]
            return self.log_probs(last.reshape(-1, last.shape[-1]), self.to_device(flat))

    def masked(self, sequences: list[str], kinds, indices=None) -> dict[str, torch.Tensor]:
        """Masked marginals (residues × 20) and pseudo-log-likelihoods (B × 2) of the batch:
        copies of its sequences, one residue masked in each, as fair-esm's predict.py masks
        them one at a time, passed in batches of copies within the token budget. The passes
        that `passes` holds already (of `indices`) are not passed again."""
        indices = list(range(len(sequences)) if indices is None else indices)
        lengths = np.array([len(s) for s in sequences])
        done = np.array([self.passes.begin(i, n) for i, n in zip(indices, lengths)], dtype=int)
        todo = lengths - done
        owner = np.repeat(np.arange(len(sequences)), todo)  # each copy's sequence
        position = np.arange(todo.sum()) - np.repeat(np.cumsum(todo) - todo, todo)
        position += np.repeat(done, todo)
        tokens = lengths[owner] + self.bos + 1  # each copy's
        start = 0
        while start < owner.size:
            budget = self.budget(int(tokens[start])) if callable(self.budget) else self.budget
            if self.packed:
                fits = np.cumsum(tokens[start:]) <= budget
            else:  # padded to the longest copy (the first: the batch is longest first)
                fits = tokens[start] * np.arange(1, owner.size - start + 1) <= budget
            stop = start + max(1, int(fits.sum()))
            copies = [sequences[k] for k in owner[start:stop]]
            at = position[start:stop] + self.bos  # the masked token in each copy
            if self.packed:
                toks, counts, _ = self.packed_tokens(copies)
                flat = np.cumsum(counts) - counts + at
            else:
                toks, counts = self.tokens(copies).numpy(), None
                flat = np.arange(len(copies)) * toks.shape[1] + at
            original = toks.reshape(-1)[flat].copy()
            toks.reshape(-1)[flat] = self.alphabet.mask_idx
            out, _ = self.run(toks, counts, [self.num_layers])
            last = out["representations"][self.num_layers]
            logp = self.log_probs(last.reshape(-1, last.shape[-1]), self.to_device(flat))
            marginals = logp[:, self.columns]
            own = logp.gather(1, self.to_device(original)[:, None])[:, 0]
            # each sequence's copies are consecutive: its share of the batch, in order
            owners, first = np.unique(owner[start:stop], return_index=True)
            for k, (a, b) in zip(owners, zip(first, [*first[1:], stop - start])):
                self.passes.add(indices[k], marginals[a:b], own[a:b])
            self.passes.batch_done()
            start = stop
            time.sleep(self.seconds_per_batch)
        rows = [self.passes.finish(i) for i in indices]  # each sequence's batches of passes
        values = {}
        if MASKED_MARGINALS in kinds:
            values[MASKED_MARGINALS] = torch.cat(
                [self.tensor(b.marginals) for r in rows for b in r]
            )
        if PLL in kinds:
            total = torch.stack([torch.cat([self.tensor(b.own) for b in r]).sum() for r in rows])
            per_residue = total / self.to_device(lengths.astype(np.float32))
            values[PLL] = torch.stack([total, per_residue], dim=1)
        return values

    def tensor(self, values) -> torch.Tensor:
        """`values` (kept passes on the host, or this job's on the device) on the device."""
        return values if isinstance(values, torch.Tensor) else self.to_device(values)

    def finish(self, launched: Launched) -> tuple[list[dict[int, Representation]], np.ndarray]:
        """Per sequence, {layer: Representation} (float32, on the CPU), and its finite flag."""
        values, copied, lengths = launched
        if copied is not None:
            copied.synchronize()
        started = time.perf_counter()
        arrays = {name: value.numpy() for name, value in values.items()}
        finite = arrays.pop(FINITE)
        maps = arrays.pop(CONTACTS, None)  # B × L × L, BOS and EOS already left out
        heads = arrays.pop(ATTENTIONS, None)  # B × layers × heads × tokens × tokens
        # the scores: the same at every layer
        per_residue = {k: arrays.pop(k) for k in (LOGITS, MASKED_MARGINALS) if k in arrays}
        plls = arrays.pop(PLL, None)
        offsets = np.concatenate([[0], np.cumsum(lengths)])
        reps = []
        for row, n in enumerate(lengths):
            residues = slice(offsets[row], offsets[row + 1])
            unlayered = {kind: scored[residues] for kind, scored in per_residue.items()}
            if maps is not None:
                unlayered[CONTACTS] = upper_triangle(maps[row, :n, :n])
            if plls is not None:
                unlayered[PLL] = plls[row]
            if heads is not None:
                residues_only = heads[row, :, :, self.bos : self.bos + n, self.bos : self.bos + n]
                unlayered[ATTENTIONS] = attention_maps.rows(residues_only)
            rows = {kind: (residues if kind == PER_TOK else row) for kind in arrays}
            reps.append(
                {
                    layer: Representation(
                        int(n),
                        **unlayered,
                        **{kind: array[k, rows[kind]] for kind, array in arrays.items()},
                    )
                    for k, layer in enumerate(self.layers)
                }
            )
            for kept in unlayered.values():
                finite[row] &= np.isfinite(kept).all()
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
            return [(indices, self.launch(sequences, kinds, indices))]
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
        sequence, taken once they are stitched. Its scores come from windows of their own
        (esmshard.compute.windowed).
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
        scored = {}
        if self.scores:
            try:
                scored = windowed.chunked_scores(
                    self, sequence, window, self.scores, self.score_windows, index
                )
            except torch.OutOfMemoryError as err:
                failed.append(Failure(index, f"out of memory even on one score window: {err}"))
                return None
            if not all(np.isfinite(values).all() for values in scored.values()):
                failed.append(Failure(index, "non-finite values in the scores of its windows"))
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
            )._replace(**scored)
            for layer in pieces[0]
        }
