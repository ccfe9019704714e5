"""A residue's column in the scores' 20 amino acids, from text and bytes."""

from esmshard.embeddings_h5.scores import residue_columns


def test_residue_columns_of_text_and_bytes():
    assert residue_columns("AYxé*C").tolist() == [0, 19, -1, -1, -1, 1]
    assert residue_columns(b"AYx*C").tolist() == [0, 19, -1, -1, 1]
