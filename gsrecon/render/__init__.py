"""Renderers: turn Gaussian parameters and cameras into images (see `base.Renderer`)."""
