"""Levels of detail trained on the photos (``gsrecon lod``) and the streamed site that holds them
(``gsrecon export --format lod``)."""
