"""Models: names to weights (`registry`), CTranslate2 files to PyTorch (`ct2`, `convert`), precisions (`precision`,
`int8`) and decoder layers kept out of memory (`offload`, `layer_store`)."""
