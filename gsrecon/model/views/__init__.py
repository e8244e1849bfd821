"""Per-view modules: parameters of the training views (appearance, camera corrections), one module each."""
