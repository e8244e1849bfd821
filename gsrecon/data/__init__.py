"""Datasets by role: the training contract (scene, splits, errors, pipeline, prefetch), readers/, formats/ and
prepare/ (offline preparation run by `gsrecon data ...`)."""
