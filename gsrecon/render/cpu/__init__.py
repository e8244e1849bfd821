"""The compiled CPU renderer: C++ kernels (projection, SH colours, tile binning and sorting, compositing, forward
and backward), their autograd functions (`gsrecon.render.cpu.functions`) and the renderer `cpu`."""
