// A training step of the cpu renderer in two calls instead of a graph of a dozen: forward projects, rasterizes,
// composites over the backgrounds and scores the image against its photo (L1, SSIM: values and gradients in the
// image); backward takes the terms' weights, goes back through the composite, the rasterizer and the projection.
// The weights come to backward (autograd's gradients of the two values), not to forward: a step whose update is
// skipped pays for no backward, and any sum of the terms is differentiated right.
//
// Each part is the kernel the separate path calls (project.cpp, rasterize.cpp, image_loss.cpp); the composite and
// its adjoint are written here, per pixel: results do not depend on the thread count.

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>

#include <algorithm>
#include <cstdint>

#include "kernels.h"

// The composite and its adjoint round every product and sum as the render-then-terms path's torch operations do (no
// fused multiply-add), so that a step gives that path's losses and gradients bit for bit.
#pragma GCC optimize("fp-contract=off")

namespace gsrecon {
namespace {

constexpr int kRgb = 3;

// f(row) for each row of pixels, rows shared among the threads (each pixel's values depend on that pixel alone).
template <class F>
void for_rows(int64_t rows, const F& f) {
  at::parallel_for(0, rows, 16, [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end; ++row) f(row);
  });
}

void check_photos(const Photos& photos, int64_t n_cams, int64_t height, int64_t width) {
  check_tensor(photos.images, "photos", at::kFloat, {n_cams, height, width, kRgb});
  if (photos.mask.defined()) check_tensor(photos.mask, "mask", at::kFloat, {n_cams, height, width});
  check_tensor(photos.backgrounds, "backgrounds", at::kFloat, {n_cams, kRgb});
}

}  // namespace

StepForward step_forward(const Gaussians& gaussians, const PinholeCameras& cameras, const ProjectSettings& project,
                         const RasterSettings& raster, const Photos& photos, const StepTerms& terms) {
  const int64_t n_cams = cameras.viewmats.size(0), height = raster.height, width = raster.width;
  check_photos(photos, n_cams, height, width);
  StepForward out;
  out.projection = project_forward(gaussians, cameras, project);
  const Projection& p = out.projection;
  out.raster = rasterize_forward({p.means2d, p.conics, p.log_opacities, p.colors, p.depths, p.radii}, raster, false);
  const auto opts = gaussians.means.options();
  out.image = at::empty({n_cams, height, width, kRgb}, opts);
  out.depth = at::empty({n_cams, height, width, 1}, opts);
  const float* composited = out.raster.image.data_ptr<float>();
  const float* backgrounds = photos.backgrounds.data_ptr<float>();
  float *image = out.image.data_ptr<float>(), *depth = out.depth.data_ptr<float>();
  // The render over its background and its expected depth, as the separate path's torch code computes them.
  for_rows(n_cams * height, [&](int64_t row) {
    const float* bg = backgrounds + (row / height) * kRgb;
    for (int64_t px = row * width; px < (row + 1) * width; ++px) {
      const float* c = composited + px * kComposited;
      const float alpha = c[4], clear = 1.f - alpha;
      for (int ch = 0; ch < kRgb; ++ch) image[px * kRgb + ch] = c[ch] + clear * bg[ch];
      depth[px] = alpha > 0.f ? c[3] / std::max(alpha, 1e-10f) : 0.f;
    }
  });
  const ImagePair pair{out.image, photos.images, photos.mask};
  if (terms.l1) out.l1 = l1_loss(pair, true);
  if (terms.ssim) out.ssim = ssim_loss(pair, terms.ssim_settings, true);
  return out;
}

StepGrads step_backward(const Gaussians& gaussians, const PinholeCameras& cameras, const ProjectSettings& project,
                        const RasterSettings& raster, const at::Tensor& backgrounds, const StepForward& forward,
                        double l1_weight, double ssim_weight) {
  const Projection& p = forward.projection;
  const int64_t n_cams = cameras.viewmats.size(0), height = raster.height, width = raster.width;
  check_tensor(backgrounds, "backgrounds", at::kFloat, {n_cams, kRgb});
  const bool l1 = forward.l1.grad.defined(), ssim = forward.ssim.grad.defined();
  TORCH_CHECK_VALUE(l1 || ssim, "kernel arguments 'l1_grad' and 'ssim_grad' are both missing");
  if (l1) check_tensor(forward.l1.grad, "l1_grad", at::kFloat, {n_cams, height, width, kRgb});
  if (ssim) check_tensor(forward.ssim.grad, "ssim_grad", at::kFloat, {n_cams, height, width, kRgb});
  const float w_l1 = static_cast<float>(l1_weight), w_ssim = static_cast<float>(ssim_weight);
  const float* g_l1 = l1 ? forward.l1.grad.data_ptr<float>() : nullptr;
  const float* g_ssim = ssim ? forward.ssim.grad.data_ptr<float>() : nullptr;
  const float* bg_all = backgrounds.data_ptr<float>();
  at::Tensor grad_composited = at::empty({n_cams, height, width, kComposited}, backgrounds.options());
  float* grad = grad_composited.data_ptr<float>();
  // The adjoint of the composite: rgb passes its gradient, alpha gets -<gradient, background>, the depth channel none
  // (the loss does not read it).
  for_rows(n_cams * height, [&](int64_t row) {
    const float* bg = bg_all + (row / height) * kRgb;
    for (int64_t px = row * width; px < (row + 1) * width; ++px) {
      float* g = grad + px * kComposited;
      float through_alpha = 0.f;
      for (int ch = 0; ch < kRgb; ++ch) {
        const int64_t e = px * kRgb + ch;
        const float v = (l1 ? w_l1 * g_l1[e] : 0.f) + (ssim ? w_ssim * g_ssim[e] : 0.f);
        g[ch] = v;
        through_alpha += v * bg[ch];
      }
      g[3] = 0.f;
      g[4] = -through_alpha;
    }
  });
  const Splats splats{p.means2d, p.conics, p.log_opacities, p.colors, p.depths, p.radii};
  const SplatGrads s = rasterize_backward(splats, forward.raster, grad_composited, raster);
  StepGrads out;
  out.gaussians = project_backward(gaussians, cameras, project, p.radii,
                                   {s.means2d, s.conics, s.depths, at::Tensor(), s.log_opacities, s.colors}, false);
  out.means2d = s.means2d;
  out.abs_means2d = s.abs_means2d;
  return out;
}

}  // namespace gsrecon
