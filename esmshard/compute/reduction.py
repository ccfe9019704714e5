"""Reduce a batch's representations on its device: each sequence's mean and BOS row, the finite
flags, and the per-residue rows without their padding."""

import torch

from ..embeddings_h5.representations import LAYERED
from ..models.layers import Packed

MEAN, PER_TOK, BOS = LAYERED  # the layered kinds, as the read-back names them
# What a batch's read-back holds besides the representation kinds and the contact maps.
FINITE = "finite"  # one flag per sequence: every value at every layer is finite


def reduce(reps: list[torch.Tensor], residue: torch.Tensor, kinds, bos=1) -> dict:
    """The per-sequence kinds and the finite flags, on the device, accumulated in fp32.

    A sequence's sum over its residues is finite exactly when each of them is (but for an
    overflow, which is no usable result either), so it and the BOS row stand for the check.
    """
    mask = residue[:, :, None]
    sums = [rep.masked_fill(~mask, 0).sum(1, dtype=torch.float32) for rep in reps]
    counts = residue.sum(1, keepdim=True, dtype=torch.float32)
    bos_rows = [rep[:, 0] for rep in reps] if bos else None
    return per_sequence(sums, bos_rows, counts, kinds)


def reduce_packed(reps, packed: Packed, residue: torch.Tensor, kinds, bos=1) -> dict:
    """`reduce` for a packed batch: each sequence's sum by a segment reduction (in order,
    so a sequence's numbers do not depend on where in the batch it lies)."""
    counts = packed.bounds.diff()
    sums = [
        torch.segment_reduce(rep.masked_fill(~residue[:, None], 0).float(), "sum", lengths=counts)
        for rep in reps
    ]
    first = packed.bounds[:-1].long()
    residues = (counts - bos - 1).float()[:, None]
    bos_rows = [rep[first] for rep in reps] if bos else None
    return per_sequence(sums, bos_rows, residues, kinds)


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


def gather(reps: list[torch.Tensor], positions: torch.Tensor) -> torch.Tensor:
    """layers × residues × D: every sequence's residue rows, one after the other."""
    dim = reps[0].shape[-1]
    out = torch.empty((len(reps), len(positions), dim), dtype=torch.float32, device=reps[0].device)
    for k, rep in enumerate(reps):
        torch.index_select(rep.float().reshape(-1, dim), 0, positions, out=out[k])
    return out
