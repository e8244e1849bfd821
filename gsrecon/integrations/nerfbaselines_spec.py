"""gsrecon's nerfbaselines method spec, loaded through the ``nerfbaselines.specs`` entry point of
``pip install gsrecon[nerfbaselines]``: ``nerfbaselines train --method gsrecon --backend python --data DIR``."""

from __future__ import annotations

from nerfbaselines import register

GSRECON_SPEC = {
    "id": "gsrecon",
    "method_class": "gsrecon.integrations.nerfbaselines:GsreconMethod",
    "metadata": {
        "name": "gsrecon",
        "description": "3D Gaussian Splatting trained by gsrecon (its configs/mipnerf360.yaml; blender: "
        "configs/blender_lego.yaml); --set KEY=VALUE passes gsrecon config overrides, e.g. --set max_steps=7000.",
        "licenses": [{"name": "Apache-2.0", "url": "https://www.apache.org/licenses/LICENSE-2.0"}],
    },
    "presets": {
        "blender": {"@apply": [{"dataset": "blender"}], "config": "blender_lego.yaml"},
    },
    "implementation_status": {},
}

register(GSRECON_SPEC)
