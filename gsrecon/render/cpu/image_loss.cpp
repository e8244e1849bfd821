// The photometric loss terms of a CPU training step, each with its gradient in the same call: the mean L1 difference
// and the mean SSIM (Gaussian window, reflected borders) of [B, H, W, 3] images, as gsrecon/losses/l1.py and
// gsrecon/losses/ssim.py compute them (tests/test_compiled_loss.py checks values and gradients against those).
//
// SSIM's five blurred maps per channel (x, y, x^2, y^2, x y) are two 1D passes (the window is separable); its
// gradient is the transposed blur of three maps of d SSIM / d (mu_x, E[x^2], E[x y]). Planes (an image's channel)
// are handed to OpenMP threads and summed in plane order: results do not depend on the thread count.

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/scalar_tensor.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels.h"

namespace gsrecon {
namespace {

constexpr int kChannels = 3;

void check_images(const ImagePair& images) {
  check_tensor(images.pred, "pred", at::kFloat, {-1, -1, -1, kChannels});
  const int64_t b = images.pred.size(0), h = images.pred.size(1), w = images.pred.size(2);
  check_tensor(images.target, "target", at::kFloat, {b, h, w, kChannels});
  if (images.mask.defined()) check_tensor(images.mask, "mask", at::kFloat, {b, h, w});
}

// The sum over the kept pixels' channels of the weights (3 x the mask's sum, or every value), at least 1: the
// denominator of a masked mean, as the torch terms clamp it.
double weight_total(const ImagePair& images) {
  if (!images.mask.defined()) return static_cast<double>(images.pred.numel());
  const float* mask = images.mask.data_ptr<float>();
  double sum = 0.0;
  for (int64_t p = 0; p < images.mask.numel(); ++p) sum += mask[p];
  return std::max(kChannels * sum, 1.0);
}

// Reflected index of p into [0, n) (n > radius), as F.pad(mode="reflect").
inline int reflect(int p, int n) { return p < 0 ? -p : (p >= n ? 2 * (n - 1) - p : p); }

// The separable blur of one plane of h x w values and its transpose, with a symmetric window of 2 r + 1 taps.
class Blur {
 public:
  Blur(const float* window, int taps, int h, int w) : window_(window, window + taps), r_(taps / 2), h_(h), w_(w) {
    line_.resize(static_cast<size_t>(std::max(h, w) + 4 * r_ + 1));
    rows_.resize(static_cast<size_t>(h + 2 * r_) * w);
  }

  // out = blur(in): the vertical pass, then the horizontal one (F.pad's reflected borders, then two conv2d).
  void forward(const float* in, float* out) {
    const int taps = static_cast<int>(window_.size());
    for (int i = 0; i < h_; ++i) {
      float* row = &rows_[static_cast<size_t>(i) * w_];
      std::fill(row, row + w_, 0.f);
      for (int k = 0; k < taps; ++k) {
        const float wk = window_[k];
        const float* src = in + static_cast<size_t>(reflect(i + k - r_, h_)) * w_;
#pragma omp simd
        for (int j = 0; j < w_; ++j) row[j] += wk * src[j];
      }
    }
    float* padded = line_.data();
    for (int i = 0; i < h_; ++i) {
      const float* row = &rows_[static_cast<size_t>(i) * w_];
      for (int p = 0; p < w_ + 2 * r_; ++p) padded[p] = row[reflect(p - r_, w_)];
      float* dst = out + static_cast<size_t>(i) * w_;
      std::fill(dst, dst + w_, 0.f);
      for (int k = 0; k < taps; ++k) {
        const float wk = window_[k];
#pragma omp simd
        for (int j = 0; j < w_; ++j) dst[j] += wk * padded[j + k];
      }
    }
  }

  // out = blur^T(in): the horizontal pass's transpose, then the vertical one's. A reflected border's transpose
  // adds what the padding read back onto the pixel it copied.
  void transpose(const float* in, float* out) {
    const int taps = static_cast<int>(window_.size());
    // Horizontal: full[p] = sum_k w_k in[p - k] over the padded positions p in [0, w + 2 r), then folded.
    float* zero_padded = line_.data();  // in, with 2 r zeros either side
    std::vector<float>& full = full_;
    full.resize(static_cast<size_t>(w_ + 2 * r_));
    for (int i = 0; i < h_; ++i) {
      const float* src = in + static_cast<size_t>(i) * w_;
      std::fill(zero_padded, zero_padded + w_ + 4 * r_, 0.f);
      std::copy(src, src + w_, zero_padded + 2 * r_);
      std::fill(full.begin(), full.end(), 0.f);
      for (int k = 0; k < taps; ++k) {
        const float wk = window_[k];
        const float* shifted = zero_padded + 2 * r_ - k;
#pragma omp simd
        for (int p = 0; p < w_ + 2 * r_; ++p) full[p] += wk * shifted[p];
      }
      float* row = &rows_[static_cast<size_t>(i) * w_];
      std::copy(full.begin() + r_, full.begin() + r_ + w_, row);
      for (int p = 0; p < r_; ++p) row[reflect(p - r_, w_)] += full[p];
      for (int p = w_ + r_; p < w_ + 2 * r_; ++p) row[reflect(p - r_, w_)] += full[p];
    }
    // Vertical: the same on rows, into out (each input row scattered to the rows that read it).
    std::fill(out, out + static_cast<size_t>(h_) * w_, 0.f);
    for (int i = 0; i < h_; ++i) {
      const float* src = &rows_[static_cast<size_t>(i) * w_];
      for (int k = 0; k < taps; ++k) {
        const float wk = window_[k];
        float* dst = out + static_cast<size_t>(reflect(i + k - r_, h_)) * w_;
#pragma omp simd
        for (int j = 0; j < w_; ++j) dst[j] += wk * src[j];
      }
    }
  }

 private:
  std::vector<float> window_;
  int r_, h_, w_;
  std::vector<float> line_, rows_, full_;
};

}  // namespace

LossTerm l1_loss(const ImagePair& images, bool with_grad) {
  check_images(images);
  const int64_t n_pixels = images.pred.numel() / kChannels;
  const float *pred = images.pred.data_ptr<float>(), *target = images.target.data_ptr<float>();
  const float* mask = images.mask.defined() ? images.mask.data_ptr<float>() : nullptr;
  const double total = weight_total(images);
  at::Tensor grad = with_grad ? at::empty_like(images.pred) : at::Tensor();
  float* g = with_grad ? grad.data_ptr<float>() : nullptr;
  const float scale = static_cast<float>(1.0 / total);
  double sum = 0.0;
  for (int64_t p = 0; p < n_pixels; ++p) {
    const float w = mask ? mask[p] : 1.f;
    float row = 0.f;
    for (int ch = 0; ch < kChannels; ++ch) {
      const float d = pred[kChannels * p + ch] - target[kChannels * p + ch];
      row += std::abs(d) * w;
      if (g) g[kChannels * p + ch] = d > 0.f ? w * scale : (d < 0.f ? -w * scale : 0.f);
    }
    sum += row;
  }
  return {at::scalar_tensor(static_cast<float>(sum / total), images.pred.options()), grad};
}

LossTerm ssim_loss(const ImagePair& images, const SsimSettings& settings, bool with_grad) {
  check_images(images);
  check_tensor(settings.window, "window", at::kFloat, {-1});
  const int64_t batch = images.pred.size(0);
  const int h = static_cast<int>(images.pred.size(1)), w = static_cast<int>(images.pred.size(2));
  const int taps = static_cast<int>(settings.window.size(0));
  TORCH_CHECK_VALUE(taps % 2 == 1 && h > taps / 2 && w > taps / 2, "kernel argument 'pred' of ", h, "x", w,
                    " pixels is smaller than the window of ", taps, " taps needs (more than ", taps / 2, " a side)");
  const float* window = settings.window.data_ptr<float>();
  const float *pred = images.pred.data_ptr<float>(), *target = images.target.data_ptr<float>();
  const float* mask = images.mask.defined() ? images.mask.data_ptr<float>() : nullptr;
  const double total = weight_total(images);
  const float c1 = static_cast<float>(settings.c1), c2 = static_cast<float>(settings.c2);
  at::Tensor grad = with_grad ? at::empty_like(images.pred) : at::Tensor();
  float* g_out = with_grad ? grad.data_ptr<float>() : nullptr;
  const int64_t planes = batch * kChannels, plane_size = static_cast<int64_t>(h) * w;
  std::vector<double> plane_sums(planes, 0.0);

#pragma omp parallel num_threads(std::min<int64_t>(at::get_num_threads(), planes))
  {
    Blur blur(window, taps, h, w);
    // x, y, x^2, y^2, x y of the plane (masked), their blurs, and the gradient's three maps.
    std::vector<float> maps(5 * plane_size), blurred(5 * plane_size), grads(3 * plane_size);
#pragma omp for schedule(static)
    for (int64_t plane = 0; plane < planes; ++plane) {
      const int64_t b = plane / kChannels;
      const int ch = static_cast<int>(plane % kChannels);
      float *x = &maps[0], *y = x + plane_size, *xx = y + plane_size, *yy = xx + plane_size, *xy = yy + plane_size;
      for (int64_t p = 0; p < plane_size; ++p) {
        const int64_t pixel = b * plane_size + p;
        const float m = mask ? mask[pixel] : 1.f;
        x[p] = pred[kChannels * pixel + ch] * m;
        y[p] = target[kChannels * pixel + ch] * m;
        xx[p] = x[p] * x[p];
        yy[p] = y[p] * y[p];
        xy[p] = x[p] * y[p];
      }
      for (int q = 0; q < 5; ++q) blur.forward(&maps[q * plane_size], &blurred[q * plane_size]);
      const float *mu_x = &blurred[0], *mu_y = mu_x + plane_size, *e_xx = mu_y + plane_size;
      const float *e_yy = e_xx + plane_size, *e_xy = e_yy + plane_size;
      float *g_mu = &grads[0], *g_xx = g_mu + plane_size, *g_xy = g_xx + plane_size;
      const float scale = static_cast<float>(1.0 / total);
      double sum = 0.0;
      for (int i = 0; i < h; ++i) {
        float row_sum = 0.f;
        for (int j = 0; j < w; ++j) {
          const int64_t p = static_cast<int64_t>(i) * w + j;
          const float weight = mask ? mask[b * plane_size + p] : 1.f;
          const float mx = mu_x[p], my = mu_y[p];
          const float var_x_raw = e_xx[p] - mx * mx, var_y = std::max(e_yy[p] - my * my, 0.f);
          const float var_x = std::max(var_x_raw, 0.f), cov = e_xy[p] - mx * my;
          const float a1 = 2.f * mx * my + c1, a2 = 2.f * cov + c2;
          const float b1 = mx * mx + my * my + c1, b2 = var_x + var_y + c2;
          const float s = (a1 * a2) / (b1 * b2);
          row_sum += s * weight;
          if (!g_out) continue;
          // d s / d (a1, a2, b1, b2), times the pixel's share of the mean; var_x's clamp passes the gradient where
          // its input is >= 0 (torch's clamp_min).
          const float share = weight * scale, denom = b1 * b2;
          const float d_a1 = share * a2 / denom, d_a2 = share * a1 / denom;
          const float d_b1 = -share * s / b1, d_b2 = var_x_raw >= 0.f ? -share * s / b2 : 0.f;
          g_mu[p] = 2.f * my * (d_a1 - d_a2) + 2.f * mx * (d_b1 - d_b2);
          g_xx[p] = d_b2;
          g_xy[p] = 2.f * d_a2;
        }
        sum += row_sum;
      }
      plane_sums[plane] = sum;
      if (!g_out) continue;
      // d / d x = blur^T(g_mu) + 2 x blur^T(g_xx) + y blur^T(g_xy), then through the mask (x = pred m); the
      // transposes go where x^2, y^2 and x y were.
      float *t_mu = xx, *t_xx = yy, *t_xy = xy;
      blur.transpose(g_mu, t_mu);
      blur.transpose(g_xx, t_xx);
      blur.transpose(g_xy, t_xy);
      for (int64_t p = 0; p < plane_size; ++p) {
        const int64_t pixel = b * plane_size + p;
        const float m = mask ? mask[pixel] : 1.f;
        g_out[kChannels * pixel + ch] = m * (t_mu[p] + 2.f * x[p] * t_xx[p] + y[p] * t_xy[p]);
      }
    }
  }
  double sum = 0.0;
  for (double s : plane_sums) sum += s;
  return {at::scalar_tensor(static_cast<float>(sum / total), images.pred.options()), grad};
}

}  // namespace gsrecon
