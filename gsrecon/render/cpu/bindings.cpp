// The Python module of the CPU renderer's kernels (project.cpp, rasterize.cpp).

#include <torch/extension.h>

#include <vector>

std::vector<torch::Tensor> project_forward(torch::Tensor means, torch::Tensor quats, torch::Tensor log_scales,
                                           torch::Tensor logits, torch::Tensor sh0, torch::Tensor shN,
                                           int64_t n_coeffs, torch::Tensor viewmats, torch::Tensor Ks,
                                           int64_t width, int64_t height, double near_plane, double far_plane,
                                           double eps2d, bool antialiased);
std::vector<torch::Tensor> project_backward(torch::Tensor means, torch::Tensor quats, torch::Tensor log_scales,
                                            torch::Tensor logits, torch::Tensor sh0, torch::Tensor shN,
                                            int64_t n_coeffs, torch::Tensor viewmats, torch::Tensor Ks,
                                            int64_t width, int64_t height, double near_plane, double far_plane,
                                            double eps2d, bool antialiased, torch::Tensor radii,
                                            torch::Tensor v_means2d, torch::Tensor v_conics, torch::Tensor v_depths,
                                            torch::Tensor v_log_ops, torch::Tensor v_colors, bool pose_grad);
std::vector<torch::Tensor> rasterize_forward(torch::Tensor means2d, torch::Tensor conics, torch::Tensor log_ops,
                                             torch::Tensor colors, torch::Tensor depths, torch::Tensor radii,
                                             int64_t width, int64_t height, int64_t tile_size, double alpha_max,
                                             bool median_depth);
std::vector<torch::Tensor> rasterize_backward(torch::Tensor means2d, torch::Tensor conics, torch::Tensor log_ops,
                                              torch::Tensor colors, torch::Tensor depths, torch::Tensor radii,
                                              torch::Tensor offsets, torch::Tensor ids, torch::Tensor first,
                                              torch::Tensor slots, torch::Tensor last,
                                              torch::Tensor trans_final, torch::Tensor grad_out, int64_t width,
                                              int64_t height, int64_t tile_size, double alpha_max);

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("project_forward", &project_forward, "Project Gaussians into pinhole cameras, with SH colours");
  m.def("project_backward", &project_backward, "Gradients of project_forward's outputs");
  m.def("rasterize_forward", &rasterize_forward, "Bin, sort and composite projected Gaussians");
  m.def("rasterize_backward", &rasterize_backward, "Gradients of rasterize_forward's composited channels");
}
