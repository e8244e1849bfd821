// The CPU renderer's kernels (project.cpp, rasterize.cpp), the photometric loss of a CPU step (image_loss.cpp) and
// a whole training step in two calls (train_step.cpp), all bound to Python in bindings.cpp: their declarations, the
// types they share and the constants of the model they render, which are the torch renderer's
// (gsrecon/render/torch_renderer.py; tests/test_cpu_renderer.py checks that they are equal).
//
// Every entry point checks its tensors (float32 or int32/int64 as declared, contiguous, on the CPU, shaped as
// documented) and raises ValueError naming the argument otherwise. Standard C++17: no C++20 feature.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>
#include <c10/util/accumulate.h>
#include <sys/mman.h>

#include <cstdint>
#include <cstdlib>
#include <initializer_list>
#include <memory>

namespace gsrecon {

constexpr float kAlphaMin = 1.0f / 255.0f;     // ALPHA_MIN: a Gaussian whose alpha is below this is skipped
constexpr float kBboxSigmas = 3.33f;           // BBOX_SIGMAS: bounding boxes extend this many sigmas at most
constexpr float kTransmittanceMin = 1e-4f;     // TRANSMITTANCE_MIN: a pixel stops before T would reach this
constexpr float kClampMargin = 0.15f;          // CLAMP_MARGIN: J's x / z, y / z clamp past the image, per size
constexpr float kMedianTransmittance = 0.5f;   // MEDIAN_TRANSMITTANCE: the median depth is where T crosses this
constexpr float kTinyDeterminant = 1e-30f;     // floor of the undilated determinant (antialiased mode)
constexpr int kMaxShDegree = 3;                // gsrecon.sh.MAX_SH_DEGREE
constexpr int kMaxShCoeffs = (kMaxShDegree + 1) * (kMaxShDegree + 1);
constexpr int kComposited = 5;                 // composited channels: r, g, b, depth, alpha

// N Gaussians as the model stores them (float32): no [N, K, 3] copy of the SH coefficients is made.
struct Gaussians {
  at::Tensor means;       // [N, 3]
  at::Tensor quats;       // [N, 4] (w, x, y, z), any non-zero norm
  at::Tensor log_scales;  // [N, 3]
  at::Tensor logits;      // [N] opacity logits
  at::Tensor sh0;         // [N, 1, 3] SH coefficients of band 0
  at::Tensor shN;         // [N, S, 3] and of the higher bands
};

// C pinhole cameras of one image size (float32).
struct PinholeCameras {
  at::Tensor viewmats;  // [C, 4, 4] world-to-camera
  at::Tensor Ks;        // [C, 3, 3] intrinsics in pixels
  int64_t width;
  int64_t height;
};

struct ProjectSettings {
  int64_t sh_degree;  // the degree rendered, 0..kMaxShDegree: the first (degree + 1)^2 coefficients
  double near_plane;
  double far_plane;
  double eps2d;       // px^2 added to the 2D covariance
  bool antialiased;   // Mip-Splatting's opacity compensation
};

// The Gaussians in screen space, for C cameras (forward of the projection; its backward takes gradients of the same).
struct Projection {
  at::Tensor means2d;        // [C, N, 2] pixel coordinates of the centres (0 where not visible)
  at::Tensor conics;         // [C, N, 3] inverse 2D covariance (xx, xy, yy)
  at::Tensor depths;         // [C, N] camera-space z
  at::Tensor radii;          // [C, N, 2] int32 bounding-box half extents in pixels, 0 = not visible (no gradient)
  at::Tensor log_opacities;  // [C, N] ln(opacity) as composited (antialiased: with the compensation)
  at::Tensor colors;         // [C, N, 3] SH colours seen from each camera
};

// Gradients of the Gaussians' parameters (shaped as `Gaussians`; shN's zero past the degree rendered) and, when
// asked, of the cameras' poses ([C, 4, 4], else [0, 4, 4]).
struct GaussianGrads {
  at::Tensor means, quats, log_scales, logits, sh0, shN, viewmats;
};

// The screen-space Gaussians a rasterization composites (a Projection's float32 fields and radii).
struct Splats {
  at::Tensor means2d;        // [C, N, 2]
  at::Tensor conics;         // [C, N, 3]
  at::Tensor log_opacities;  // [C, N]
  at::Tensor colors;         // [C, N, 3]
  at::Tensor depths;         // [C, N]
  at::Tensor radii;          // [C, N, 2] int32, 0 = not visible
};

struct RasterSettings {
  int64_t width;
  int64_t height;
  int64_t tile_size;  // px, any size >= 1
  double alpha_max;   // per-Gaussian alpha clamp
};

// The (tile, Gaussian) pairs, as forward hands them to backward.
struct Binning {
  at::Tensor offsets;  // [C * tiles + 1] int64: first pair of each tile
  at::Tensor ids;      // [P] int32: Gaussian index (within its camera) of each pair, sorted front to back per tile
  at::Tensor first;    // [C * N + 1] int64: first entry of each Gaussian (of all cameras) in `slots`
  at::Tensor slots;    // [P] int64: each Gaussian's pairs (their positions in `ids`), in pair order
};

struct Raster {
  at::Tensor image;        // [C, H, W, 5] premultiplied rgb, sum of w z, alpha 1 - T
  at::Tensor median;       // [C, H, W] median depth (0 unless asked)
  Binning binning;
  at::Tensor last;         // [C, H, W] int32: the slots each pixel composited
  at::Tensor trans_final;  // [C, H, W] the transmittance left
};

// Gradients of a Splats' float fields, and |d loss / d means2d| summed over the pixels (AbsGS), [C, N, 2].
struct SplatGrads {
  at::Tensor means2d, conics, log_opacities, colors, depths, abs_means2d;
};

Projection project_forward(const Gaussians& gaussians, const PinholeCameras& cameras, const ProjectSettings& settings);
GaussianGrads project_backward(const Gaussians& gaussians, const PinholeCameras& cameras,
                               const ProjectSettings& settings, const at::Tensor& radii, const Projection& grads,
                               bool pose_grad);
Raster rasterize_forward(const Splats& splats, const RasterSettings& settings, bool median_depth);
SplatGrads rasterize_backward(const Splats& splats, const Raster& forward, const at::Tensor& grad_image,
                              const RasterSettings& settings);

// A render and its photo, [B, H, W, 3] each, and the pixels that count: a mask [B, H, W] (1 keeps a pixel; both
// images are multiplied by it first, as the torch terms do), or undefined for all.
struct ImagePair {
  at::Tensor pred;    // [B, H, W, 3]
  at::Tensor target;  // [B, H, W, 3]
  at::Tensor mask;    // [B, H, W] or undefined
};

struct SsimSettings {
  at::Tensor window;  // [taps] the normalised 1D Gaussian window (odd taps), gsrecon.losses.ssim.gaussian_window
  double c1, c2;      // SSIM's stabilising constants
};

// A loss term's value (a float32 scalar) and, when asked, its gradient in pred ([B, H, W, 3], else undefined).
struct LossTerm {
  at::Tensor value;
  at::Tensor grad;
};

// The mean |pred - target| over the kept pixels' channels (image_loss.cpp).
LossTerm l1_loss(const ImagePair& images, bool with_grad);
// The mean SSIM over the kept pixels' channels, the window's borders reflected (image_loss.cpp).
LossTerm ssim_loss(const ImagePair& images, const SsimSettings& settings, bool with_grad);

// A training step's photos: [C, H, W, 3], the pixels that count ([C, H, W], 1 keeps a pixel; undefined: all) and the
// colour [C, 3] each render is composited over (train_step.cpp).
struct Photos {
  at::Tensor images;
  at::Tensor mask;
  at::Tensor backgrounds;
};

// The loss terms a training step computes: L1 and SSIM, either or both.
struct StepTerms {
  bool l1;
  bool ssim;
  SsimSettings ssim_settings;
};

// A training step's forward: the projection and rasterization its backward needs, the image over the backgrounds
// ([C, H, W, 3]; alpha is raster.image's last channel), its expected depth ([C, H, W, 1], 0 where alpha is 0), and
// each term asked: its value and its gradient in the image (undefined where not asked).
struct StepForward {
  Projection projection;
  Raster raster;
  at::Tensor image;
  at::Tensor depth;
  LossTerm l1;
  LossTerm ssim;
};

// The gradients of l1_weight x L1 + ssim_weight x SSIM: the Gaussians' (no pose), and of the centres in screen space
// with their AbsGS sum, [C, N, 2] each (what the strategies read).
struct StepGrads {
  GaussianGrads gaussians;
  at::Tensor means2d;
  at::Tensor abs_means2d;
};

StepForward step_forward(const Gaussians& gaussians, const PinholeCameras& cameras, const ProjectSettings& project,
                         const RasterSettings& raster, const Photos& photos, const StepTerms& terms);
StepGrads step_backward(const Gaussians& gaussians, const PinholeCameras& cameras, const ProjectSettings& project,
                        const RasterSettings& raster, const at::Tensor& backgrounds, const StepForward& forward,
                        double l1_weight, double ssim_weight);

// Buffers from kHugeFrom bytes on are aligned to kHugePage and advised as huge pages (where the system backs them
// so): glibc maps a block that large afresh on every allocation, which then faults in 2 MiB at a time instead of
// 4 KiB (a 1M-Gaussian step's outputs and pairs: tens of thousands of faults a step, a fifth of its time on one
// thread). Smaller blocks are left to malloc, which reuses freed ones without faults; advised too, they measured
// slower (12 % on the projection's backward at 20k Gaussians).
constexpr size_t kHugePage = size_t{2} << 20;
constexpr size_t kHugeFrom = size_t{32} << 20;  // glibc's largest mmap threshold (DEFAULT_MMAP_THRESHOLD_MAX)

// Uninitialised memory for `bytes` (aligned to 64 bytes at least), freed with std::free.
inline void* alloc_large(size_t bytes) {
  const size_t align = bytes >= kHugeFrom ? kHugePage : 64;
  const size_t rounded = (std::max<size_t>(bytes, 1) + align - 1) / align * align;
  void* data = std::aligned_alloc(align, rounded);
  TORCH_CHECK(data != nullptr, "cpu kernels: out of memory allocating ", bytes, " bytes");
#ifdef MADV_HUGEPAGE
  if (align == kHugePage) madvise(data, rounded, MADV_HUGEPAGE);  // advice only: its failure changes nothing
#endif
  return data;
}

// An uninitialised contiguous CPU tensor, in alloc_large's memory from kHugeFrom bytes on.
inline at::Tensor empty_large(at::IntArrayRef sizes, const at::TensorOptions& options) {
  const size_t bytes = static_cast<size_t>(c10::multiply_integers(sizes)) * options.dtype().itemsize();
  if (bytes < kHugeFrom) return at::empty(sizes, options);
  return at::from_blob(alloc_large(bytes), sizes, [](void* data) { std::free(data); }, options);
}

struct FreeDeleter {
  void operator()(void* data) const { std::free(data); }
};

// An uninitialised array of n trivially constructible T, in alloc_large's memory.
template <class T>
using LargeArray = std::unique_ptr<T[], FreeDeleter>;

template <class T>
LargeArray<T> large_array(int64_t n) {
  return LargeArray<T>(static_cast<T*>(alloc_large(static_cast<size_t>(n) * sizeof(T))));
}

// Raises ValueError unless `t` is a contiguous CPU tensor of `dtype` and of `shape` (-1: any size there).
inline void check_tensor(const at::Tensor& t, const char* name, at::ScalarType dtype,
                         std::initializer_list<int64_t> shape) {
  TORCH_CHECK_VALUE(t.defined(), "kernel argument '", name, "' is missing");
  TORCH_CHECK_VALUE(t.scalar_type() == dtype, "kernel argument '", name, "' has dtype ", t.scalar_type(),
                    ", expected ", dtype);
  TORCH_CHECK_VALUE(t.device().is_cpu(), "kernel argument '", name, "' is on ", t.device(), ", expected the CPU");
  TORCH_CHECK_VALUE(t.is_contiguous(), "kernel argument '", name, "' is not contiguous");
  bool fits = t.dim() == static_cast<int64_t>(shape.size());
  int64_t d = 0;
  for (int64_t size : shape) {
    fits = fits && (size < 0 || t.size(d) == size);
    ++d;
  }
  TORCH_CHECK_VALUE(fits, "kernel argument '", name, "' has shape ", t.sizes(), ", expected ", at::IntArrayRef(shape),
                    " (-1: any)");
}

}  // namespace gsrecon
