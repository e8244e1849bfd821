"""Offline preparation run by `gsrecon data ...` and `gsrecon train --data`: structure from motion, triangulation
from known poses, video frames, which shipped config suits a capture, and structure from motion into the cache for
photos and videos without poses."""
