// The photometric loss terms of a CPU training step, each with its gradient in the same call: the mean L1 difference
// and the mean SSIM (Gaussian window, reflected borders) of [B, H, W, 3] images, as gsrecon/losses/l1.py and
// gsrecon/losses/ssim.py compute them (tests/test_compiled_loss.py checks values and gradients against those).
//
// SSIM's five blurred maps per channel (x, y, x^2, y^2, x y) are two 1D passes (the window is separable); its
// gradient is the transposed blur of three maps of d SSIM / d (mu_x, E[x^2], E[x y]). Rows of pixels (the three
// channels interleaved, as stored) are handed to OpenMP threads; each row's terms are summed in a fixed order and
// the rows' sums in row order: results do not depend on the thread count.

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

// One dimension of the blur with reflected borders over n positions, as lists of (source, weight) per output: the
// blur out[i] = sum_k w_k in[reflect(i + k - r)], or its transpose (what each input received, folded back onto the
// position its border copied). An output's terms are summed in their list's order, whichever thread computes it.
struct BlurTaps {
  std::vector<int> start;  // [n + 1] output i's terms are [start[i], start[i + 1])
  std::vector<int> source;
  std::vector<float> weight;
};

BlurTaps blur_taps(const float* window, int taps, int n, bool transpose) {
  const int r = taps / 2;
  std::vector<std::vector<std::pair<int, float>>> terms(n);
  for (int i = 0; i < n; ++i)
    for (int k = 0; k < taps; ++k) {
      const int j = reflect(i + k - r, n);
      if (transpose)
        terms[j].emplace_back(i, window[k]);
      else
        terms[i].emplace_back(j, window[k]);
    }
  BlurTaps out;
  out.start.push_back(0);
  for (const auto& list : terms) {
    for (const auto& [source, weight] : list) {
      out.source.push_back(source);
      out.weight.push_back(weight);
    }
    out.start.push_back(static_cast<int>(out.source.size()));
  }
  return out;
}

// The horizontal blur of a row of w pixels x 3 interleaved channels (3 w values) and its transpose. The channels
// stay interleaved: a tap is a shift by 3 values, so every pass is one vector loop over the whole row.
class RowBlur {
 public:
  RowBlur(const float* window, int taps, int w) : window_(window, window + taps), r_(taps / 2), w_(w) {
    padded_.resize(static_cast<size_t>(kChannels) * (w + 4 * r_));
    full_.resize(static_cast<size_t>(kChannels) * (w + 2 * r_));
  }

  // out = blur(in): F.pad's reflected borders, then the 1D window.
  void forward(const float* in, float* out) {
    float* padded = padded_.data();
    for (int p = 0; p < w_ + 2 * r_; ++p)
      for (int ch = 0; ch < kChannels; ++ch) padded[kChannels * p + ch] = in[kChannels * reflect(p - r_, w_) + ch];
    const int n = kChannels * w_;
    std::fill(out, out + n, 0.f);
    for (size_t k = 0; k < window_.size(); ++k) {
      const float wk = window_[k];
      const float* shifted = padded + kChannels * k;
#pragma omp simd
      for (int e = 0; e < n; ++e) out[e] += wk * shifted[e];
    }
  }

  // out = blur^T(in): each padded position's share (sum_k w_k in[p - k]), folded back onto the pixel it copied.
  void transpose(const float* in, float* out) {
    float* zero_padded = padded_.data();  // in, with 2 r zero pixels either side
    float* full = full_.data();
    const int n_full = kChannels * (w_ + 2 * r_);
    std::fill(zero_padded, zero_padded + padded_.size(), 0.f);
    std::copy(in, in + kChannels * w_, zero_padded + kChannels * 2 * r_);
    std::fill(full, full + n_full, 0.f);
    for (size_t k = 0; k < window_.size(); ++k) {
      const float wk = window_[k];
      const float* shifted = zero_padded + kChannels * (2 * r_ - static_cast<int>(k));
#pragma omp simd
      for (int e = 0; e < n_full; ++e) full[e] += wk * shifted[e];
    }
    std::copy(full + kChannels * r_, full + kChannels * (r_ + w_), out);
    for (int p = 0; p < w_ + 2 * r_; ++p) {
      if (p >= r_ && p < w_ + r_) continue;
      for (int ch = 0; ch < kChannels; ++ch) out[kChannels * reflect(p - r_, w_) + ch] += full[kChannels * p + ch];
    }
  }

 private:
  std::vector<float> window_;
  int r_, w_;
  std::vector<float> padded_, full_;
};

// Adds w times x, y, x^2, y^2 and x y of a row of n values (x = pred m, y = target m; m = 1 where mask is null)
// to sums [5][n]: one vector loop for each case, none testing the mask per value.
inline void add_moments(const float* pred, const float* target, const float* mask, float w, int n, float* sums) {
  float *s_x = sums, *s_y = s_x + n, *s_xx = s_y + n, *s_yy = s_xx + n, *s_xy = s_yy + n;
  auto add = [&](int e, float x, float y) {
    s_x[e] += w * x;
    s_y[e] += w * y;
    s_xx[e] += w * (x * x);
    s_yy[e] += w * (y * y);
    s_xy[e] += w * (x * y);
  };
  if (mask) {
#pragma omp simd
    for (int e = 0; e < n; ++e) add(e, pred[e] * mask[e], target[e] * mask[e]);
  } else {
#pragma omp simd
    for (int e = 0; e < n; ++e) add(e, pred[e], target[e]);
  }
}

// A mask [B, H, W] as one weight per value of the interleaved rows ([B, H, W, 3]), or empty for no mask.
std::vector<float> channel_weights(const ImagePair& images) {
  if (!images.mask.defined()) return {};
  const float* mask = images.mask.data_ptr<float>();
  const int64_t pixels = images.mask.numel();
  std::vector<float> out(kChannels * pixels);
#pragma omp parallel for schedule(static) num_threads(at::get_num_threads())
  for (int64_t p = 0; p < pixels; ++p)
    for (int ch = 0; ch < kChannels; ++ch) out[kChannels * p + ch] = mask[p];
  return out;
}

}  // namespace

LossTerm l1_loss(const ImagePair& images, bool with_grad) {
  check_images(images);
  const int64_t rows = images.pred.size(0) * images.pred.size(1);
  const int n = static_cast<int>(kChannels * images.pred.size(2));  // values in a row
  const float *pred = images.pred.data_ptr<float>(), *target = images.target.data_ptr<float>();
  const std::vector<float> weights = channel_weights(images);
  const float* mask = weights.empty() ? nullptr : weights.data();
  const double total = weight_total(images);
  at::Tensor grad = with_grad ? at::empty_like(images.pred) : at::Tensor();
  float* g_out = with_grad ? grad.data_ptr<float>() : nullptr;
  const float scale = static_cast<float>(1.0 / total);
  std::vector<double> row_sums(rows);
#pragma omp parallel for schedule(static) num_threads(at::get_num_threads())
  for (int64_t row = 0; row < rows; ++row) {
    const float *p = pred + row * n, *q = target + row * n, *m = mask ? mask + row * n : nullptr;
    double sum = 0.0;
#pragma omp simd reduction(+ : sum)
    for (int e = 0; e < n; ++e) {
      const float weight = m ? m[e] : 1.f, d = p[e] - q[e];
      sum += std::abs(d) * weight;
      if (g_out) g_out[row * n + e] = d > 0.f ? weight * scale : (d < 0.f ? -weight * scale : 0.f);
    }
    row_sums[row] = sum;
  }
  double sum = 0.0;
  for (double s : row_sums) sum += s;
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
  const std::vector<float> weights = channel_weights(images);
  const float* mask = weights.empty() ? nullptr : weights.data();
  const double total = weight_total(images);
  const float scale = static_cast<float>(1.0 / total);
  const float c1 = static_cast<float>(settings.c1), c2 = static_cast<float>(settings.c2);
  const int n = kChannels * w;  // values in a row
  const int64_t rows = batch * h;
  const BlurTaps down = blur_taps(window, taps, h, false), up = blur_taps(window, taps, h, true);
  at::Tensor grad = with_grad ? at::empty_like(images.pred) : at::Tensor();
  float* g_out = with_grad ? grad.data_ptr<float>() : nullptr;
  std::vector<double> row_sums(rows);
  // d SSIM / d (mu_x, E[x^2], E[x y]) of every row, through the horizontal blur's transpose already.
  std::vector<float> row_grads(with_grad ? 3 * rows * n : 0);

#pragma omp parallel num_threads(at::get_num_threads())
  {
    RowBlur row_blur(window, taps, w);
    std::vector<float> column(5 * n), blurred(5 * n), maps(3 * n);
    // Each row: the vertical blur of x, y, x^2, y^2, x y (x = pred m, y = target m) from the rows it reads, the
    // horizontal blur, SSIM and the three gradient maps, and their horizontal transpose.
#pragma omp for schedule(static)
    for (int64_t row = 0; row < rows; ++row) {
      const int64_t b = row / h, i = row % h;
      std::fill(column.begin(), column.end(), 0.f);
      for (int t = down.start[i]; t < down.start[i + 1]; ++t) {
        const int64_t at_row = (b * h + down.source[t]) * n;
        const float wk = down.weight[t];
        const float *p = pred + at_row, *q = target + at_row;
        if (mask)
          add_moments(p, q, mask + at_row, wk, n, column.data());
        else
          add_moments(p, q, nullptr, wk, n, column.data());
      }
      for (int map = 0; map < 5; ++map) row_blur.forward(&column[map * n], &blurred[map * n]);
      const float *mu_x = blurred.data(), *mu_y = mu_x + n, *e_xx = mu_y + n, *e_yy = e_xx + n, *e_xy = e_yy + n;
      float *g_mu = maps.data(), *g_xx = g_mu + n, *g_xy = g_xx + n;
      const float* m = mask ? mask + row * n : nullptr;
      double sum = 0.0;
#pragma omp simd reduction(+ : sum)
      for (int e = 0; e < n; ++e) {
        const float weight = m ? m[e] : 1.f;
        const float mx = mu_x[e], my = mu_y[e];
        const float var_x_raw = e_xx[e] - mx * mx, var_y = std::max(e_yy[e] - my * my, 0.f);
        const float var_x = std::max(var_x_raw, 0.f), cov = e_xy[e] - mx * my;
        const float a1 = 2.f * mx * my + c1, a2 = 2.f * cov + c2;
        const float b1 = mx * mx + my * my + c1, b2 = var_x + var_y + c2;
        const float s = (a1 * a2) / (b1 * b2);
        sum += s * weight;
        // d s / d (a1, a2, b1, b2), times the value's share of the mean; var_x's clamp passes the gradient where
        // its input is >= 0 (torch's clamp_min).
        const float share = weight * scale, denom = b1 * b2;
        const float d_a1 = share * a2 / denom, d_a2 = share * a1 / denom;
        const float d_b1 = -share * s / b1, d_b2 = var_x_raw >= 0.f ? -share * s / b2 : 0.f;
        g_mu[e] = 2.f * my * (d_a1 - d_a2) + 2.f * mx * (d_b1 - d_b2);
        g_xx[e] = d_b2;
        g_xy[e] = 2.f * d_a2;
      }
      row_sums[row] = sum;
      if (!g_out) continue;
      for (int map = 0; map < 3; ++map) row_blur.transpose(&maps[map * n], &row_grads[(map * rows + row) * n]);
    }
    // Each row: the vertical blur's transpose of the three maps, then d / d x = blur^T(g_mu) + 2 x blur^T(g_xx)
    // + y blur^T(g_xy), through the mask (x = pred m).
    if (g_out) {
#pragma omp for schedule(static)
      for (int64_t row = 0; row < rows; ++row) {
        const int64_t b = row / h, i = row % h;
        float *t_mu = maps.data(), *t_xx = t_mu + n, *t_xy = t_xx + n;
        std::fill(maps.begin(), maps.end(), 0.f);
        for (int t = up.start[i]; t < up.start[i + 1]; ++t) {
          const int64_t source = b * h + up.source[t];
          const float wk = up.weight[t];
          const float *s_mu = &row_grads[source * n], *s_xx = &row_grads[(rows + source) * n];
          const float* s_xy = &row_grads[(2 * rows + source) * n];
#pragma omp simd
          for (int e = 0; e < n; ++e) {
            t_mu[e] += wk * s_mu[e];
            t_xx[e] += wk * s_xx[e];
            t_xy[e] += wk * s_xy[e];
          }
        }
        const float *p = pred + row * n, *q = target + row * n, *m = mask ? mask + row * n : nullptr;
        float* g = g_out + row * n;
#pragma omp simd
        for (int e = 0; e < n; ++e) {
          const float weight = m ? m[e] : 1.f;
          g[e] = weight * (t_mu[e] + 2.f * (p[e] * weight) * t_xx[e] + (q[e] * weight) * t_xy[e]);
        }
      }
    }
  }
  double sum = 0.0;
  for (double s : row_sums) sum += s;
  return {at::scalar_tensor(static_cast<float>(sum / total), images.pred.options()), grad};
}

}  // namespace gsrecon
