"""The Gaussian model: its parameters and initialisation, the one owner of its rows (``ops.py``), its PLY layout,
its optimisers, and the per-view modules (``views/``)."""
