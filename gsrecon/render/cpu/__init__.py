"""The compiled CPU renderer: the autograd functions (`gsrecon.render.cpu.functions`) of gsrecon's C++ kernels
(`gsrecon.kernels`) and the renderer `cpu`."""
