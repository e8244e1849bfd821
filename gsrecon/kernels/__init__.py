"""gsrecon's compiled C++ kernels (projection, SH colours, tile binning and sorting, compositing, forward and backward;
the L1 and SSIM terms with their gradients) and their build (:mod:`gsrecon.kernels.build`): the floor under the
``cpu`` renderer (`gsrecon.render.cpu`) and the loss terms and metrics that take the compiled path."""
