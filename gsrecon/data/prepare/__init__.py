"""Offline preparation run by `gsrecon data ...`: structure from motion, triangulation from known poses, video
frames, and which shipped config suits a capture folder."""
