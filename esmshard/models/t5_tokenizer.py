"""A T5 encoder's residue tokens, read from the tokenizer its folder ships: never an id table of
esmshard's own, since ProtT5 and Ankh number their residues differently.

Both give the tokenizer one word per residue (ProtT5 space-separates the residues, Ankh passes
them split into words), so a residue's token is what the tokenizer makes of it as a word; a
sequence is its residues' tokens and the `</s>` the tokenizer appends, no BOS; ProstT5's (a ProtT5
whose tokenizer has its `<AA2fold>` token) take that token first. ProtT5 and ProstT5 read U, Z,
O and B as X (t5_files.Variant.rare_as_x). The table is built once per job, the tokenizer asked
about each letter esmshard's input can hold (esmshard.input.fasta.ALPHABET).
"""

import re
from pathlib import Path

from ..input.fasta import ALPHABET
from .spec import Alphabet, ModelError, unaccounted_tokens
from .t5_files import Variant, tokenizer_file

RARE = "UZOB"
EOS, PAD = "</s>", "<pad>"
# ProstT5's tokenizer marks what follows it: amino acids (residues in upper case) to be read as
# such, rather than its 3Di structure letters (lower case). Its authors put it before every
# sequence; a ProtT5 tokenizer has no such token.
AA2FOLD = "<AA2fold>"
# ProstT5's other prefix (3Di input, which esmshard does not take) and its 3Di letters.
FOLD2AA = "<fold2AA>"
# The tokens a protein T5's tokenizer holds beside its residues: T5's own (its specials and the
# sentinels of its pre-training, `<extra_id_N>`) and sentencepiece's word mark.
T5_TOKENS = re.compile(r"<pad>|</s>|<unk>|<extra_id_\d+>|▁")


class _Tokenizer:
    """What esmshard asks of either tokenizer file: a word's ids, and the ids it appends."""

    def __init__(self, path: Path):
        self.path = path
        if path.name == "tokenizer.json":
            from tokenizers import Tokenizer

            self.fast = Tokenizer.from_file(str(path))
            self.sentencepiece = None
        else:
            import sentencepiece

            self.fast = None
            self.sentencepiece = sentencepiece.SentencePieceProcessor(model_file=str(path))

    def word(self, word: str) -> list[int]:
        if self.fast:
            return self.fast.encode([word], is_pretokenized=True, add_special_tokens=False).ids
        return self.sentencepiece.encode(word)

    def appended(self, word: str) -> list[int]:
        """The ids around a word's own when the tokenizer adds its special tokens (transformers'
        T5 tokenizers append `</s>`; a bare sentencepiece model adds nothing itself)."""
        if self.fast:
            return self.fast.encode([word], is_pretokenized=True).ids
        eos = self.sentencepiece.eos_id()
        return self.word(word) + [eos if eos >= 0 else self.token_id(EOS)]

    def vocabulary(self) -> list[str]:
        if self.fast:
            return list(self.fast.get_vocab(with_added_tokens=True))
        return [
            self.sentencepiece.id_to_piece(i) for i in range(self.sentencepiece.get_piece_size())
        ]

    def token_id(self, token: str) -> int | None:
        if self.fast:
            return self.fast.token_to_id(token)
        index = self.sentencepiece.piece_to_id(token)
        return None if index == self.sentencepiece.unk_id() and token != "<unk>" else index


def alphabet(folder: Path, variant: Variant) -> Alphabet:
    """The Alphabet of the T5 encoder in `folder`; ModelError naming the tokenizer file where a
    residue is no single token or the tokenizer adds a token before the sequence."""
    tokenizer = _Tokenizer(tokenizer_file(folder))
    path = tokenizer.path
    residues = {}
    for letter in sorted(ALPHABET):
        word = "X" if variant.rare_as_x and letter in RARE else letter
        ids = tokenizer.word(word)
        if len(ids) != 1:
            raise ModelError(
                f"{path}: the residue {word} is {len(ids)} tokens {ids}, not one; is this the "
                f"tokenizer of a protein T5 ({variant.title})?"
            )
        residues[letter] = ids[0]
    around = tokenizer.appended("A")
    if around[:1] != [residues["A"]] or len(around) != 2 or around[1] is None:
        raise ModelError(
            f"{path}: the tokenizer makes {around} of the residue A ({residues['A']}) with its "
            f"special tokens; esmshard's T5 encoders take the residues and one {EOS} alone"
        )
    pad = tokenizer.token_id(PAD)
    if pad is None:
        raise ModelError(f"{path}: the tokenizer has no {PAD} token")
    # ProstT5: its prefix first, as BOS is elsewhere (left out of means and per-residue rows).
    prefix = tokenizer.token_id(AA2FOLD)
    unknown = unaccounted(tokenizer.vocabulary(), prostt5=prefix is not None)
    if unknown:
        raise unaccounted_tokens(
            path,
            unknown,
            "ProtT5's, ProstT5's and Ankh's hold T5's own, the residue letters "
            "and ProstT5's prefixes and 3Di letters",
        )
    return Alphabet(
        residues,
        padding_idx=pad,
        cls_idx=prefix,
        eos_idx=around[1],
        mask_idx=None,
        prepend_bos=prefix is not None,
    )


def unaccounted(vocabulary, prostt5: bool) -> list[str]:
    """The tokens of a protein T5's `vocabulary` that are none of T5's own, a residue letter (as
    a word: sentencepiece marks it `▁`) or, for ProstT5, its prefixes and 3Di letters."""

    def known(token: str) -> bool:
        letter = token.removeprefix("▁")
        if T5_TOKENS.fullmatch(token) or (len(letter) == 1 and letter.isupper()):
            return True
        return prostt5 and (token in (AA2FOLD, FOLD2AA) or (len(letter) == 1 and letter.islower()))

    return sorted(token for token in vocabulary if not known(token))


def write_tokenizer(folder: Path, residues: str, extra=()) -> Path:
    """A tokenizer.json of the kind Ankh publishes, for random-weight T5 encoders (tests,
    benchmarks): T5's specials (<pad>, </s>, <unk>), then one token per letter of `residues`, in
    that order, then the `extra` tokens; each word one token, `</s>` appended."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    vocab = {token: i for i, token in enumerate([PAD, EOS, "<unk>", *residues, *extra])}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"$A {EOS}", special_tokens=[(EOS, vocab[EOS])]
    )
    path = Path(folder) / "tokenizer.json"
    tokenizer.save(str(path))
    return path
