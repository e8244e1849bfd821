"""Dataset readers, registered in ``DATASET_REGISTRY`` (importing this package registers the built-ins): each turns
``data.path`` (or nothing, for the built-in scene) into a :class:`~gsrecon.data.scene.Scene` with ``read(data)``, and
takes its own options from ``data.<its name>``, checked against its ``Config`` (a reader without one takes none)."""

from gsrecon.data.readers import colmap, synthetic, transforms  # noqa: F401
