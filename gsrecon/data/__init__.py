"""Datasets by role: the training contract (scene, splits, errors, pipeline, prefetch), the spatial plan of block
training (blocks), readers/, formats/ and prepare/ (offline preparation run by `gsrecon data ...`)."""
