"""Batches within a token budget, and the budget itself: fixed, or sized to a GPU's free memory."""

from .precision import Precision

CPU_TOKENS_PER_BATCH = 4096  # on a CPU larger batches do not run faster
MAX_AUTO_TOKENS = 1 << 20


def make_batches(lengths, toks_per_batch, packed: bool = False, masked: bool = False):
    """Longest first, each batch as many sequences as fit the token budget: once padded to the
    batch's longest, or `packed`, laid end to end (its real tokens alone count). `masked`: a
    sequence counts the tokens of its pass per residue too (masked marginals, whose copies the
    Embedder passes within the budget), so that a batch takes about as long as one without.

    `toks_per_batch` is a number or a function of the batch's longest sequence (in tokens).
    A sequence longer than the budget gets a batch of its own.
    """
    budget_for = toks_per_batch if callable(toks_per_batch) else (lambda _: toks_per_batch)
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    batches, current, width, total, budget = [], [], 0, 0, 0
    for i in order:
        tokens = lengths[i] + 2  # BOS and EOS
        if not current:
            budget = budget_for(tokens)
        width = max(width, tokens)
        if masked:
            tokens *= lengths[i] + 1
        size = total + tokens if packed or masked else width * (len(current) + 1)
        if current and size > budget:
            batches.append(current)
            current, width, total, budget = [], tokens, 0, budget_for(tokens)
        current.append(i)
        total += tokens
    if current:
        batches.append(current)
    return batches


def padded_fraction(lengths, batches) -> float:
    """Share of the batches' tokens that are padding (BOS/EOS count as real tokens)."""
    padded = sum((max(lengths[i] for i in batch) + 2) * len(batch) for batch in batches)
    real = sum(lengths[i] + 2 for batch in batches for i in batch)
    return 1 - real / padded if padded else 0.0


def auto_token_budget(
    free_bytes: int,
    model_bytes: int,
    activation_values: int,
    heads: int,
    longest_tokens: int,
    bytes_per_value: int = 4,
    contact_layers: int = 0,
) -> int:
    """Tokens per batch that fit the device's free memory next to the model.

    Per token a layer holds `activation_values` (ESM: about 16·D: residual, norms, q/k/v,
    output, the 4·D feed-forward in and out) and, as fair-esm materialises attention, 3·H·L
    scores for the batch's longest sequence L. Contact maps keep every
    layer's scores, twice (fair-esm stacks them, its contact head permutes them): 2·layers·H·L
    more. 20% is kept in reserve.
    """
    per_token = bytes_per_value * (
        activation_values
        + 3 * heads * longest_tokens
        + 2 * contact_layers * heads * longest_tokens
    )
    usable = 0.8 * free_bytes - model_bytes
    return int(max(longest_tokens, min(MAX_AUTO_TOKENS, usable // per_token)))


def token_budget(toks_per_batch, device, net, precision: Precision, contacts: bool = False):
    """The budget make_batches uses: the configured number, or one sized to the device's memory.

    Called before the model moves to the device, so free memory still includes its place.
    """
    if toks_per_batch != "auto":
        return toks_per_batch
    if device.type != "cuda":
        return CPU_TOKENS_PER_BATCH
    import torch

    free = torch.cuda.mem_get_info(device)[0]
    model_bytes = sum(p.numel() * p.element_size() for p in net.parameters())
    return lambda longest: auto_token_budget(
        free,
        model_bytes,
        # a model whose layers are not ESM's shape says what they hold (esmshard.models.t5)
        getattr(net, "activation_values", 16 * net.embed_dim),
        net.attention_heads,
        longest,
        precision.bytes_per_value,
        net.num_layers if contacts else 0,
    )
