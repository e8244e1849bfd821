// The Python module of the CPU renderer's kernels (kernels.h): keyword arguments in, dicts of named tensors out, and
// the model's constants (tested equal to the torch renderer's).

#include <torch/extension.h>

#include <initializer_list>
#include <optional>
#include <utility>

#include "kernels.h"

namespace py = pybind11;
using at::Tensor;

namespace {

// A dict of named tensors: what each kernel returns to Python.
py::dict named(std::initializer_list<std::pair<const char*, Tensor>> items) {
  py::dict out;
  for (const auto& [name, tensor] : items) out[name] = tensor;
  return out;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  using namespace gsrecon;
  m.attr("ALPHA_MIN") = kAlphaMin;
  m.attr("BBOX_SIGMAS") = kBboxSigmas;
  m.attr("TRANSMITTANCE_MIN") = kTransmittanceMin;
  m.attr("CLAMP_MARGIN") = kClampMargin;
  m.attr("MEDIAN_TRANSMITTANCE") = kMedianTransmittance;
  m.attr("TINY_DETERMINANT") = kTinyDeterminant;
  m.attr("MAX_SH_DEGREE") = kMaxShDegree;

  m.def(
      "project_forward",
      [](Tensor means, Tensor quats, Tensor log_scales, Tensor logits, Tensor sh0, Tensor shN, Tensor viewmats,
         Tensor Ks, int64_t width, int64_t height, int64_t sh_degree, double near_plane, double far_plane,
         double eps2d, bool antialiased) {
        const Projection p = project_forward({means, quats, log_scales, logits, sh0, shN},
                                             {viewmats, Ks, width, height},
                                             {sh_degree, near_plane, far_plane, eps2d, antialiased});
        return named({{"means2d", p.means2d}, {"conics", p.conics}, {"depths", p.depths}, {"radii", p.radii},
                      {"log_opacities", p.log_opacities}, {"colors", p.colors}});
      },
      "Project Gaussians into pinhole cameras, with SH colours: a dict of Projection's fields (kernels.h)",
      py::kw_only(), py::arg("means"), py::arg("quats"), py::arg("log_scales"), py::arg("logits"), py::arg("sh0"),
      py::arg("shN"), py::arg("viewmats"), py::arg("Ks"), py::arg("width"), py::arg("height"), py::arg("sh_degree"),
      py::arg("near_plane"), py::arg("far_plane"), py::arg("eps2d"), py::arg("antialiased"));

  m.def(
      "project_backward",
      [](Tensor means, Tensor quats, Tensor log_scales, Tensor logits, Tensor sh0, Tensor shN, Tensor viewmats,
         Tensor Ks, int64_t width, int64_t height, int64_t sh_degree, double near_plane, double far_plane,
         double eps2d, bool antialiased, Tensor radii, Tensor v_means2d, Tensor v_conics, Tensor v_depths,
         Tensor v_log_opacities, Tensor v_colors, bool pose_grad) {
        const GaussianGrads g = project_backward(
            {means, quats, log_scales, logits, sh0, shN}, {viewmats, Ks, width, height},
            {sh_degree, near_plane, far_plane, eps2d, antialiased}, radii,
            {v_means2d, v_conics, v_depths, Tensor(), v_log_opacities, v_colors}, pose_grad);
        return named({{"means", g.means}, {"quats", g.quats}, {"log_scales", g.log_scales}, {"logits", g.logits},
                      {"sh0", g.sh0}, {"shN", g.shN}, {"viewmats", g.viewmats}});
      },
      "Gradients of project_forward's outputs: a dict named as its inputs",
      py::kw_only(), py::arg("means"), py::arg("quats"), py::arg("log_scales"), py::arg("logits"), py::arg("sh0"),
      py::arg("shN"), py::arg("viewmats"), py::arg("Ks"), py::arg("width"), py::arg("height"), py::arg("sh_degree"),
      py::arg("near_plane"), py::arg("far_plane"), py::arg("eps2d"), py::arg("antialiased"), py::arg("radii"),
      py::arg("v_means2d"), py::arg("v_conics"), py::arg("v_depths"), py::arg("v_log_opacities"),
      py::arg("v_colors"), py::arg("pose_grad"));

  m.def(
      "rasterize_forward",
      [](Tensor means2d, Tensor conics, Tensor log_opacities, Tensor colors, Tensor depths, Tensor radii,
         int64_t width, int64_t height, int64_t tile_size, double alpha_max, bool median_depth) {
        const Raster r = rasterize_forward({means2d, conics, log_opacities, colors, depths, radii},
                                           {width, height, tile_size, alpha_max}, median_depth);
        return named({{"image", r.image}, {"median", r.median}, {"offsets", r.binning.offsets},
                      {"ids", r.binning.ids}, {"first", r.binning.first}, {"slots", r.binning.slots},
                      {"last", r.last}, {"trans_final", r.trans_final}});
      },
      "Bin, sort and composite projected Gaussians: a dict of Raster's fields, the binning's flattened (kernels.h)",
      py::kw_only(), py::arg("means2d"), py::arg("conics"), py::arg("log_opacities"), py::arg("colors"),
      py::arg("depths"), py::arg("radii"), py::arg("width"), py::arg("height"), py::arg("tile_size"),
      py::arg("alpha_max"), py::arg("median_depth"));

  m.def(
      "rasterize_backward",
      [](Tensor means2d, Tensor conics, Tensor log_opacities, Tensor colors, Tensor depths, Tensor radii,
         Tensor offsets, Tensor ids, Tensor first, Tensor slots, Tensor last, Tensor trans_final, Tensor grad_image,
         int64_t width, int64_t height, int64_t tile_size, double alpha_max) {
        const Raster forward{Tensor(), Tensor(), {offsets, ids, first, slots}, last, trans_final};
        const SplatGrads g = rasterize_backward({means2d, conics, log_opacities, colors, depths, radii}, forward,
                                                grad_image, {width, height, tile_size, alpha_max});
        return named({{"means2d", g.means2d}, {"conics", g.conics}, {"log_opacities", g.log_opacities},
                      {"colors", g.colors}, {"depths", g.depths}, {"abs_means2d", g.abs_means2d}});
      },
      "Gradients of rasterize_forward's image: a dict named as its inputs, and abs_means2d (AbsGS)",
      py::kw_only(), py::arg("means2d"), py::arg("conics"), py::arg("log_opacities"), py::arg("colors"),
      py::arg("depths"), py::arg("radii"), py::arg("offsets"), py::arg("ids"), py::arg("first"), py::arg("slots"),
      py::arg("last"), py::arg("trans_final"), py::arg("grad_image"), py::arg("width"), py::arg("height"),
      py::arg("tile_size"), py::arg("alpha_max"));
  m.def(
      "step_forward",
      [](Tensor means, Tensor quats, Tensor log_scales, Tensor logits, Tensor sh0, Tensor shN, Tensor viewmats,
         Tensor Ks, int64_t width, int64_t height, int64_t sh_degree, double near_plane, double far_plane,
         double eps2d, bool antialiased, int64_t tile_size, double alpha_max, Tensor photos,
         std::optional<Tensor> mask, Tensor backgrounds, bool l1, std::optional<Tensor> window, double c1,
         double c2) {
        const bool ssim = window.has_value();
        const StepForward f = step_forward(
            {means, quats, log_scales, logits, sh0, shN}, {viewmats, Ks, width, height},
            {sh_degree, near_plane, far_plane, eps2d, antialiased}, {width, height, tile_size, alpha_max},
            {photos, mask.value_or(Tensor()), backgrounds}, {l1, ssim, {window.value_or(Tensor()), c1, c2}});
        const Projection& p = f.projection;
        const Binning& b = f.raster.binning;
        return named({{"means2d", p.means2d}, {"conics", p.conics}, {"depths", p.depths}, {"radii", p.radii},
                      {"log_opacities", p.log_opacities}, {"colors", p.colors}, {"offsets", b.offsets},
                      {"ids", b.ids}, {"first", b.first}, {"slots", b.slots}, {"last", f.raster.last},
                      {"trans_final", f.raster.trans_final}, {"composited", f.raster.image}, {"image", f.image},
                      {"depth", f.depth}, {"l1", f.l1.value}, {"l1_grad", f.l1.grad}, {"ssim", f.ssim.value},
                      {"ssim_grad", f.ssim.grad}});
      },
      "A training step's forward: project, rasterize, composite over the backgrounds, and the L1 term (l1) and the "
      "SSIM term (a window given) with their gradients in the image; a dict of StepForward's fields (kernels.h)",
      py::kw_only(), py::arg("means"), py::arg("quats"), py::arg("log_scales"), py::arg("logits"), py::arg("sh0"),
      py::arg("shN"), py::arg("viewmats"), py::arg("Ks"), py::arg("width"), py::arg("height"), py::arg("sh_degree"),
      py::arg("near_plane"), py::arg("far_plane"), py::arg("eps2d"), py::arg("antialiased"), py::arg("tile_size"),
      py::arg("alpha_max"), py::arg("photos"), py::arg("mask"), py::arg("backgrounds"), py::arg("l1"),
      py::arg("window"), py::arg("c1"), py::arg("c2"));

  m.def(
      "step_backward",
      [](Tensor means, Tensor quats, Tensor log_scales, Tensor logits, Tensor sh0, Tensor shN, Tensor viewmats,
         Tensor Ks, int64_t width, int64_t height, int64_t sh_degree, double near_plane, double far_plane,
         double eps2d, bool antialiased, int64_t tile_size, double alpha_max, Tensor backgrounds, Tensor means2d,
         Tensor conics, Tensor depths, Tensor radii, Tensor log_opacities, Tensor colors, Tensor offsets, Tensor ids,
         Tensor first, Tensor slots, Tensor last, Tensor trans_final, std::optional<Tensor> l1_grad,
         std::optional<Tensor> ssim_grad, double l1_weight, double ssim_weight) {
        StepForward f;
        f.projection = {means2d, conics, depths, radii, log_opacities, colors};
        f.raster = {Tensor(), Tensor(), {offsets, ids, first, slots}, last, trans_final};
        f.l1.grad = l1_grad.value_or(Tensor());
        f.ssim.grad = ssim_grad.value_or(Tensor());
        const StepGrads g = step_backward(
            {means, quats, log_scales, logits, sh0, shN}, {viewmats, Ks, width, height},
            {sh_degree, near_plane, far_plane, eps2d, antialiased}, {width, height, tile_size, alpha_max},
            backgrounds, f, l1_weight, ssim_weight);
        const GaussianGrads& gg = g.gaussians;
        return named({{"means", gg.means}, {"quats", gg.quats}, {"log_scales", gg.log_scales},
                      {"logits", gg.logits}, {"sh0", gg.sh0}, {"shN", gg.shN}, {"means2d", g.means2d},
                      {"abs_means2d", g.abs_means2d}});
      },
      "Gradients of l1_weight x L1 + ssim_weight x SSIM of step_forward's image: the Gaussians' (named as "
      "step_forward's inputs), means2d's and abs_means2d (AbsGS)",
      py::kw_only(), py::arg("means"), py::arg("quats"), py::arg("log_scales"), py::arg("logits"), py::arg("sh0"),
      py::arg("shN"), py::arg("viewmats"), py::arg("Ks"), py::arg("width"), py::arg("height"), py::arg("sh_degree"),
      py::arg("near_plane"), py::arg("far_plane"), py::arg("eps2d"), py::arg("antialiased"), py::arg("tile_size"),
      py::arg("alpha_max"), py::arg("backgrounds"), py::arg("means2d"), py::arg("conics"), py::arg("depths"),
      py::arg("radii"), py::arg("log_opacities"), py::arg("colors"), py::arg("offsets"), py::arg("ids"),
      py::arg("first"), py::arg("slots"), py::arg("last"), py::arg("trans_final"), py::arg("l1_grad"),
      py::arg("ssim_grad"), py::arg("l1_weight"), py::arg("ssim_weight"));

  m.def(
      "l1_loss",
      [](Tensor pred, Tensor target, std::optional<Tensor> mask, bool with_grad) {
        const LossTerm l = l1_loss({pred, target, mask.value_or(Tensor())}, with_grad);
        return named({{"value", l.value}, {"grad", l.grad}});
      },
      "The mean L1 difference of [B, H, W, 3] images over a mask's pixels, and its gradient in pred (None unless "
      "with_grad)",
      py::kw_only(), py::arg("pred"), py::arg("target"), py::arg("mask"), py::arg("with_grad"));

  m.def(
      "ssim_loss",
      [](Tensor pred, Tensor target, std::optional<Tensor> mask, Tensor window, double c1, double c2,
         bool with_grad) {
        const LossTerm l = ssim_loss({pred, target, mask.value_or(Tensor())}, {window, c1, c2}, with_grad);
        return named({{"value", l.value}, {"grad", l.grad}});
      },
      "The mean SSIM of [B, H, W, 3] images over a mask's pixels, and its gradient in pred (None unless with_grad)",
      py::kw_only(), py::arg("pred"), py::arg("target"), py::arg("mask"), py::arg("window"), py::arg("c1"),
      py::arg("c2"), py::arg("with_grad"));
}
