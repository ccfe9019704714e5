"""ESM-2's largest shapes load without a second copy of their weights, and checkpoints whose
tensors carry fair-esm's shorter `encoder.` prefix load as fair-esm loads them."""

import json
import subprocess
import sys

import torch

from esmshard.models import load, parse_spec
from esmshard.models.esm2 import write_checkpoint

# A model of esm2_t48_15B's width (D = 5120, 40 heads) with 2 of its 48 layers: 2.5 GB.
WIDE = {"num_layers": 2, "embed_dim": 5120, "attention_heads": 40}
SEQUENCE = "MKTAYIAKQRQISFVKSHFSRQLEERLGLIEVQAPILSRVGDGTQDNLSGAEKAVQVKVKALPDAQ"

# In a process of its own, so that its peak memory is the load's: the peak resident memory
# before and after loading and after a forward pass (ru_maxrss, KiB), and that pass's mean.
CHILD = """
import json, resource, sys, torch
from esmshard.models import load, parse_spec
torch.set_num_threads(2)
spec = parse_spec(sys.argv[1])
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
model, alphabet = load(spec)
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
tokens = alphabet.get_batch_converter()([("p", sys.argv[2])])[2]
with torch.inference_mode():
    rep = model(tokens, repr_layers=[model.num_layers])["representations"][model.num_layers]
used = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"before_kib": before, "after_kib": after, "used_kib": used,
                  "mean": rep[0].mean(0).tolist()}))
"""


def test_a_checkpoint_of_15bs_width_loads_in_its_own_size_and_gives_fair_esms_numbers(tmp_path):
    from esm.model.esm2 import ESM2

    with torch.random.fork_rng():
        torch.manual_seed(0)
        fair = ESM2(**WIDE, alphabet="ESM-1b").eval()
    path = write_checkpoint(fair, tmp_path, "esm2_wide")
    tokens = fair.alphabet.get_batch_converter()([("p", SEQUENCE)])[2]
    with torch.inference_mode():  # fair-esm's forward pass on the model that wrote the file
        want = fair(tokens, repr_layers=[2])["representations"][2][0].mean(0)
    del fair
    size_kib = path.stat().st_size / 1024
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(path), SEQUENCE], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-3000:]
    child = json.loads(done.stdout)
    # The weights are mapped from the file, not copied: loading adds next to nothing (measured:
    # 0; fair-esm's loader adds 1.0x the file), and with every weight in use by a forward pass
    # the process holds the file's pages once: at most 1.3x the file in all.
    assert child["after_kib"] - child["before_kib"] <= 0.3 * size_kib, (child, size_kib)
    assert child["used_kib"] - child["before_kib"] <= 1.3 * size_kib, (child, size_kib)
    # The same numbers to float32's rounding: on a busy machine the math library may run the
    # products on fewer threads than asked, which sums their blocks in another order (seen: one
    # value's last bits differed under a full suite on 2 cores).
    torch.testing.assert_close(torch.tensor(child["mean"]), want, rtol=0, atol=1e-5)


def test_a_checkpoint_with_fair_esms_shorter_prefix_loads(tmp_path, checkpoint):
    data = torch.load(checkpoint, weights_only=False)
    data["model"] = {
        name.replace("encoder.sentence_encoder.", "encoder."): tensor
        for name, tensor in data["model"].items()
    }
    short = tmp_path / "esm2_short_prefix.pt"
    torch.save(data, short)
    regression = checkpoint.with_name(checkpoint.stem + "-contact-regression.pt")
    short.with_name(short.stem + "-contact-regression.pt").write_bytes(regression.read_bytes())
    ours, _ = load(parse_spec(str(short)))
    original, alphabet = load(parse_spec(str(checkpoint)))
    tokens = alphabet.get_batch_converter()([("p", SEQUENCE)])[2]
    with torch.inference_mode():
        got, want = (m(tokens, repr_layers=[6])["representations"][6] for m in (ours, original))
    assert torch.equal(got, want)
