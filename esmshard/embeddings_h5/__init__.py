"""What embeddings.h5 holds, in one place: the kinds of values and their layer numbering
(representations), contact maps (contacts), language-model scores (scores), attention maps
(attentions), the ID index
(id_index), and values read in place from the store's parts (in_place). Shard files and pieces
(esmshard.store.shardfile) hold the same kinds."""
