"""The forward pass over batches on one device: tokens, out-of-memory halving, look-ahead, windows."""

import logging
import os

import numpy as np
import torch

from .contacts import NAME as CONTACTS
from .contacts import upper_triangle
from .forward import FastESM2
from .long_sequences import chunk_spans
from .precision import Precision, autocast
from .representations import Representation
from .shardfile import Failure

log = logging.getLogger(__name__)

# Test hook: batches of more tokens than this raise an out-of-memory error, as CUDA would.
INJECT_OOM_ENV = "ESMSHARD_INJECT_OOM_TOKENS"


class Embedder:
    """fair-esm's ESM-2 forward pass with fair-esm's token layout, on one device."""

    def __init__(
        self, model, alphabet, layers, device, precision: Precision, fast_path=True, contacts=False
    ):
        self.model = model.to(device)
        # Contact maps need the attention maps: fair-esm's own forward pass computes them.
        self.contacts = contacts
        self.net = FastESM2(self.model) if fast_path and not contacts else self.model
        self.alphabet = alphabet
        self.layers = layers
        self.device = device
        self.precision = precision
        self.inject_oom_tokens = int(os.environ.get(INJECT_OOM_ENV, 0)) or None
        # Token of each byte that is a one-letter token of the alphabet, -1 for the others.
        self.token_of_byte = np.full(256, -1, dtype=np.int64)
        for token, index in alphabet.tok_to_idx.items():
            if len(token) == 1:
                self.token_of_byte[ord(token)] = index

    def tokens(self, sequences: list[str]) -> torch.Tensor:
        """fair-esm's batch layout (BOS, residues, EOS, padding) from one table lookup per batch.

        Encoding residue by residue in Python, as fair-esm's converter does, manages about 0.3M
        residues/s: on a GPU that would take longer than the forward pass.
        """
        lengths = np.array([len(s) for s in sequences])
        residues = self.token_of_byte[
            np.frombuffer("".join(sequences).encode("ascii"), dtype=np.uint8)
        ]
        if (residues < 0).any():
            raise ValueError("a sequence holds characters that are not ESM-2 residue tokens")
        toks = np.full(
            (len(sequences), lengths.max() + 2), self.alphabet.padding_idx, dtype=np.int64
        )
        rows = np.repeat(np.arange(len(sequences)), lengths)
        columns = np.arange(len(residues)) - np.repeat(np.cumsum(lengths) - lengths, lengths) + 1
        toks[rows, columns] = residues
        toks[:, 0] = self.alphabet.cls_idx
        toks[np.arange(len(sequences)), lengths + 1] = self.alphabet.eos_idx
        return torch.from_numpy(toks)

    def launch(self, sequences: list[str]):
        """Start the batch's forward pass; `finish` reads the results back.

        On a GPU both the forward pass and the copy of its results into pinned host memory are
        queued, so the host is free until it asks for them.
        """
        toks = self.tokens(sequences)
        if self.device.type == "cuda":
            toks = toks.pin_memory()  # lets the copy below overlap with queued GPU work
        if self.inject_oom_tokens and toks.numel() > self.inject_oom_tokens:
            raise torch.OutOfMemoryError(f"injected: batch of {toks.numel()} tokens")
        with torch.inference_mode(), autocast(self.precision, self.device):
            toks = toks.to(self.device, non_blocking=True)
            if self.contacts:
                out = self.net(toks, repr_layers=self.layers, return_contacts=True)
            else:
                out = self.net(toks, repr_layers=self.layers)
            results = {layer: rep.float() for layer, rep in out["representations"].items()}
            if self.contacts:
                results[CONTACTS] = out["contacts"].float()
            if self.device.type != "cuda":
                return results, None
            host = {
                name: torch.empty(result.shape, dtype=torch.float32, pin_memory=True).copy_(
                    result, non_blocking=True
                )
                for name, result in results.items()
            }
            copied = torch.cuda.Event()
            copied.record()
            return host, copied

    @staticmethod
    def finish(launched, sequences: list[str]) -> list[dict[int, Representation]]:
        """Per sequence, {layer: Representation}, float32 on the CPU."""
        results, copied = launched
        if copied is not None:
            copied.synchronize()
        arrays = {name: result.numpy() for name, result in results.items()}
        maps = arrays.pop(CONTACTS, None)  # B × L × L, BOS and EOS already left out
        reps = []
        for row, seq in enumerate(sequences):
            n = len(seq)
            triangle = None if maps is None else upper_triangle(maps[row, :n, :n])
            reps.append(
                {
                    layer: Representation(rep[row, 1 : n + 1], rep[row, 0], triangle)
                    for layer, rep in arrays.items()
                }
            )
        return reps

    def forward(self, sequences: list[str]) -> list[dict[int, Representation]]:
        """One batch, start to end."""
        return self.finish(self.launch(sequences), sequences)

    def launch_halving(
        self, indices: list[int], sequences: list[str], failed: list[Failure]
    ) -> list[tuple]:
        """`launch` the batch, or on out-of-memory its halves, down to single sequences.

        Returns (indices, sequences, launched) per part; a sequence that does not fit even alone
        is appended to `failed`.
        """
        try:
            return [(indices, sequences, self.launch(sequences))]
        except torch.OutOfMemoryError as err:
            if self.device.type == "cuda":
                torch.cuda.empty_cache()
            if len(sequences) == 1:
                failed.append(
                    Failure(
                        indices[0],
                        f"out of memory even alone ({len(sequences[0])} residues): {err}",
                    )
                )
                return []
            half = len(sequences) // 2
            log.warning(
                "out of memory on a batch of %d sequences; retrying as two halves", len(sequences)
            )
            return self.launch_halving(
                indices[:half], sequences[:half], failed
            ) + self.launch_halving(indices[half:], sequences[half:], failed)

    def finish_checked(self, parts: list[tuple], failed: list[Failure]) -> list[tuple]:
        """(indices, representations) per launched part; sequences with non-finite values go to `failed`."""
        results = []
        for indices, sequences, launched in parts:
            kept = []
            for index, rep in zip(indices, self.finish(launched, sequences)):
                first = next(iter(rep.values()))
                if all(
                    np.isfinite(r.per_tok).all() and np.isfinite(r.bos).all() for r in rep.values()
                ) and (first.contacts is None or np.isfinite(first.contacts).all()):
                    kept.append((index, rep))
                else:
                    failed.append(Failure(index, "non-finite values in the representations"))
            if kept:
                results.append(([i for i, _ in kept], [r for _, r in kept]))
        return results

    def embed(
        self, indices: list[int], sequences: list[str], failed: list[Failure]
    ) -> list[tuple]:
        """(indices, representations) for the batch, halving it on out-of-memory."""
        return self.finish_checked(self.launch_halving(indices, sequences, failed), failed)

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
        """One long sequence through overlapping windows, stitched; None (and `failed` noted) if a window fails."""
        spans = chunk_spans(len(sequence), window)
        pieces, window_failures = {}, []
        windows = [sequence[span.start : span.end] for span in spans]
        for done, reps in self.embed(list(range(len(spans))), windows, window_failures):
            pieces.update(zip(done, reps))
        if window_failures:
            k, reason = window_failures[0]
            failed.append(Failure(index, f"window {k + 1} of {len(spans)} failed: {reason}"))
            return None
        return {
            layer: Representation(
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
