"""Levels of detail: coarser levels merged from finer ones (``merge``) and the PlayCanvas streamed SOG site that
holds them (``site``: ``lod-meta.json`` and its chunks). Training the levels is ``gsrecon.lod``'s."""
