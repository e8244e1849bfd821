"""The training loss as a sum of named terms, one module per term (see :mod:`gsrecon.losses.base`)."""
