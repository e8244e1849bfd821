// Tile binning, depth sorting and front-to-back alpha compositing of projected Gaussians on the CPU,
// forward and backward, with the conventions of gsrecon's torch renderer (gsrecon/render/torch_renderer.py).
//
// Tiles are handed to OpenMP threads. Backward writes each (tile, Gaussian) pair's gradient into its own row and
// sums the rows of a Gaussian in pair order, so gradients are bit-identical whatever the thread count.

#include <torch/extension.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

namespace {

constexpr float kAlphaMin = 1.0f / 255.0f;     // alpha below this is skipped at a pixel
constexpr float kTransmittanceMin = 1e-4f;     // a pixel stops before the Gaussian taking T to or below this
constexpr float kMedianTransmittance = 0.5f;   // the median depth is where T crosses this
constexpr int kOut = 5;                        // composited channels: r, g, b, depth, alpha
// A pair's gradient row: d means2d (x, y), d conic (a, b, c), d log opacity, d colour (r, g, b), d depth.
constexpr int kPairGrad = 10;

struct Binning {
  std::vector<int64_t> offsets;  // [C * tiles + 1] first pair of each tile
  std::vector<int32_t> ids;      // [P] Gaussian index (within its camera) of each pair, sorted front to back per tile
};

// Minimum over the rectangle [x0, x1] x [y0, y1] (pixel centres relative to the centre) of
// sigma = (a dx^2 + 2 b dx dy + c dy^2) / 2: the Gaussian's largest alpha in a tile is opacity * exp(-min sigma).
inline float min_sigma(float x0, float y0, float x1, float y1, float a, float b, float c) {
  if (x0 <= 0.f && x1 >= 0.f && y0 <= 0.f && y1 >= 0.f) return 0.f;
  float best = INFINITY;
  for (float x : {x0, x1}) {
    float dy = std::min(std::max(b * x / -c, y0), y1);
    best = std::min(best, (a * x * x + c * dy * dy) * 0.5f + b * x * dy);
  }
  for (float y : {y0, y1}) {
    float dx = std::min(std::max(b * y / -a, x0), x1);
    best = std::min(best, (a * dx * dx + c * y * y) * 0.5f + b * dx * y);
  }
  return best;
}

// For every tile of every camera, the visible Gaussians whose alpha reaches 1/255 in it, sorted by depth
// (ties by index).
Binning bin_gaussians(const float* means2d, const float* conics, const float* log_ops, const float* depths,
                      const int32_t* radii, int64_t n_cams, int64_t n, int tiles_x, int tiles_y, int tile_size) {
  const int64_t tiles = static_cast<int64_t>(tiles_x) * tiles_y;
  const int64_t total = n_cams * n;
  const float log_alpha_min = std::log(kAlphaMin) - 1e-4f;
  std::vector<int64_t> counts(total + 1, 0);
  auto rect = [&](int64_t g, int& x0, int& y0, int& x1, int& y1) {
    const float cx = means2d[2 * g], cy = means2d[2 * g + 1];
    const float rx = static_cast<float>(radii[2 * g]), ry = static_cast<float>(radii[2 * g + 1]);
    x0 = static_cast<int>(std::min<float>(std::max<float>(std::floor((cx - rx) / tile_size), 0.f), tiles_x));
    y0 = static_cast<int>(std::min<float>(std::max<float>(std::floor((cy - ry) / tile_size), 0.f), tiles_y));
    x1 = static_cast<int>(std::min<float>(std::max<float>(std::ceil((cx + rx) / tile_size), 0.f), tiles_x));
    y1 = static_cast<int>(std::min<float>(std::max<float>(std::ceil((cy + ry) / tile_size), 0.f), tiles_y));
  };
  auto reaches = [&](int64_t g, int tx, int ty) {
    const float cx = means2d[2 * g], cy = means2d[2 * g + 1];
    const float x0 = tx * tile_size + 0.5f - cx, y0 = ty * tile_size + 0.5f - cy;
    const float s = min_sigma(x0, y0, x0 + (tile_size - 1), y0 + (tile_size - 1), conics[3 * g], conics[3 * g + 1],
                              conics[3 * g + 2]);
    return log_ops[g] - s >= log_alpha_min;
  };
  // Two passes over the Gaussians (count, then fill), each Gaussian's pairs in its own place: order-independent.
#pragma omp parallel for schedule(static) num_threads(at::get_num_threads())
  for (int64_t g = 0; g < total; ++g) {
    if (radii[2 * g] <= 0 && radii[2 * g + 1] <= 0) continue;
    int x0, y0, x1, y1;
    rect(g, x0, y0, x1, y1);
    int64_t k = 0;
    for (int ty = y0; ty < y1; ++ty)
      for (int tx = x0; tx < x1; ++tx) k += reaches(g, tx, ty);
    counts[g + 1] = k;
  }
  for (int64_t g = 0; g < total; ++g) counts[g + 1] += counts[g];
  const int64_t n_pairs = counts[total];
  std::vector<int64_t> pair_tile(n_pairs);
#pragma omp parallel for schedule(static) num_threads(at::get_num_threads())
  for (int64_t g = 0; g < total; ++g) {
    if (counts[g + 1] == counts[g]) continue;
    int x0, y0, x1, y1;
    rect(g, x0, y0, x1, y1);
    int64_t k = counts[g];
    const int64_t cam_tiles = (g / n) * tiles;
    for (int ty = y0; ty < y1; ++ty)
      for (int tx = x0; tx < x1; ++tx)
        if (reaches(g, tx, ty)) pair_tile[k++] = cam_tiles + static_cast<int64_t>(ty) * tiles_x + tx;
  }
  // Counting sort by tile, then each tile's list by (depth, index).
  Binning out;
  out.offsets.assign(n_cams * tiles + 1, 0);
  for (int64_t p = 0; p < n_pairs; ++p) ++out.offsets[pair_tile[p] + 1];
  for (int64_t t = 0; t < n_cams * tiles; ++t) out.offsets[t + 1] += out.offsets[t];
  std::vector<uint64_t> keys(n_pairs);
  {
    std::vector<int64_t> fill(out.offsets.begin(), out.offsets.end() - 1);
    for (int64_t g = 0; g < total; ++g) {
      const float d = depths[g];
      uint32_t bits;
      std::memcpy(&bits, &d, sizeof bits);
      for (int64_t p = counts[g]; p < counts[g + 1]; ++p)
        keys[fill[pair_tile[p]]++] = (static_cast<uint64_t>(bits) << 32) | static_cast<uint64_t>(g % n);
    }
  }
  out.ids.resize(n_pairs);
#pragma omp parallel for schedule(dynamic, 4) num_threads(at::get_num_threads())
  for (int64_t t = 0; t < n_cams * tiles; ++t) {
    std::sort(keys.begin() + out.offsets[t], keys.begin() + out.offsets[t + 1]);
    for (int64_t p = out.offsets[t]; p < out.offsets[t + 1]; ++p) out.ids[p] = static_cast<int32_t>(keys[p]);
  }
  return out;
}

// A tile's Gaussians, gathered front to back into contiguous columns.
struct TileGaussians {
  std::vector<float> mx, my, a, b, c, lo, r, g, bl, z;
  std::vector<int32_t> x0, x1, y0, y1;  // the pixels of the tile inside the Gaussian's box: [x0, x1) x [y0, y1)
  void load(const Binning& bins, int64_t t, int64_t cam_offset, const float* means2d, const float* conics,
            const float* log_ops, const float* colors, const float* depths, const int32_t* radii, int tx, int ty,
            int ts) {
    const int64_t first = bins.offsets[t], k = bins.offsets[t + 1] - first;
    for (auto* v : {&mx, &my, &a, &b, &c, &lo, &r, &g, &bl, &z}) v->resize(k);
    for (auto* v : {&x0, &x1, &y0, &y1}) v->resize(k);
    for (int64_t i = 0; i < k; ++i) {
      const int64_t id = cam_offset + bins.ids[first + i];
      mx[i] = means2d[2 * id];
      my[i] = means2d[2 * id + 1];
      a[i] = conics[3 * id];
      b[i] = conics[3 * id + 1];
      c[i] = conics[3 * id + 2];
      lo[i] = log_ops[id];
      r[i] = colors[3 * id];
      g[i] = colors[3 * id + 1];
      bl[i] = colors[3 * id + 2];
      z[i] = depths[id];
      // Pixel centres x + 0.5 within [mx - rx, mx + rx]
      const float rx = static_cast<float>(radii[2 * id]), ry = static_cast<float>(radii[2 * id + 1]);
      x0[i] = std::max(0, static_cast<int>(std::ceil(mx[i] - rx - 0.5f)) - tx * ts);
      x1[i] = std::min(ts, static_cast<int>(std::floor(mx[i] + rx - 0.5f)) + 1 - tx * ts);
      y0[i] = std::max(0, static_cast<int>(std::ceil(my[i] - ry - 0.5f)) - ty * ts);
      y1[i] = std::min(ts, static_cast<int>(std::floor(my[i] + ry - 0.5f)) + 1 - ty * ts);
    }
  }
};

}  // namespace

// Forward: returns out [C, H, W, 5] (premultiplied rgb, sum w z, alpha), median [C, H, W] (0 unless asked),
// and for backward the binning (offsets [C * tiles + 1] int64, ids [P] int32), last [C, H, W] int32 (slots each
// pixel composited) and the final transmittance [C, H, W].
std::vector<torch::Tensor> rasterize_forward(torch::Tensor means2d, torch::Tensor conics, torch::Tensor log_ops,
                                             torch::Tensor colors, torch::Tensor depths, torch::Tensor radii,
                                             int64_t width, int64_t height, int64_t tile_size, double alpha_max_d,
                                             bool median_depth) {
  const int64_t n_cams = means2d.size(0), n = means2d.size(1);
  const int tiles_x = static_cast<int>((width + tile_size - 1) / tile_size);
  const int tiles_y = static_cast<int>((height + tile_size - 1) / tile_size);
  const int64_t tiles = static_cast<int64_t>(tiles_x) * tiles_y;
  const float* m2 = means2d.data_ptr<float>();
  const float* co = conics.data_ptr<float>();
  const float* lo = log_ops.data_ptr<float>();
  const float* cl = colors.data_ptr<float>();
  const float* dp = depths.data_ptr<float>();
  const int32_t* ra = radii.data_ptr<int32_t>();
  Binning bins = bin_gaussians(m2, co, lo, dp, ra, n_cams, n, tiles_x, tiles_y,
                               static_cast<int>(tile_size));
  auto opts = means2d.options();
  auto out = torch::zeros({n_cams, height, width, kOut}, opts);
  auto median = torch::zeros({n_cams, height, width}, opts);
  auto last = torch::zeros({n_cams, height, width}, opts.dtype(torch::kInt32));
  auto trans_final = torch::ones({n_cams, height, width}, opts);
  float* o = out.data_ptr<float>();
  float* med = median.data_ptr<float>();
  int32_t* la = last.data_ptr<int32_t>();
  float* tf = trans_final.data_ptr<float>();
  const float alpha_max = static_cast<float>(alpha_max_d);
  const int ts = static_cast<int>(tile_size);
  const int n_px = ts * ts;

#pragma omp parallel num_threads(at::get_num_threads())
  {
    TileGaussians tg;
    std::vector<float> T(n_px), acc(n_px * kOut), md(n_px), pxs(n_px), pys(n_px);
    std::vector<int32_t> lst(n_px);
    std::vector<uint8_t> active(n_px);
#pragma omp for schedule(dynamic, 1)
    for (int64_t t = 0; t < n_cams * tiles; ++t) {
      const int64_t k = bins.offsets[t + 1] - bins.offsets[t];
      if (k == 0) continue;
      const int64_t cam = t / tiles, local = t % tiles;
      const int tx = static_cast<int>(local % tiles_x), ty = static_cast<int>(local / tiles_x);
      tg.load(bins, t, cam * n, m2, co, lo, cl, dp, ra, tx, ty, ts);
      for (int p = 0; p < n_px; ++p) {
        pxs[p] = tx * ts + (p % ts) + 0.5f;
        pys[p] = ty * ts + (p / ts) + 0.5f;
        T[p] = 1.f;
        md[p] = 0.f;
        lst[p] = 0;
        active[p] = 1;
      }
      std::fill(acc.begin(), acc.end(), 0.f);
      int n_active = n_px;
      for (int64_t i = 0; i < k && n_active > 0; ++i) {
        const float mx = tg.mx[i], my = tg.my[i], a = tg.a[i], b = tg.b[i], c = tg.c[i], lop = tg.lo[i];
        const float sigma_max = lop - std::log(kAlphaMin);  // sigma above this: alpha below 1/255
        const float f[4] = {tg.r[i], tg.g[i], tg.bl[i], tg.z[i]};
        for (int row = tg.y0[i]; row < tg.y1[i]; ++row)
        for (int p = row * ts + tg.x0[i]; p < row * ts + tg.x1[i]; ++p) {
          if (!active[p]) continue;
          const float dx = pxs[p] - mx, dy = pys[p] - my;
          const float sigma = 0.5f * (a * dx * dx + c * dy * dy) + b * dx * dy;
          if (sigma > sigma_max) continue;
          const float alpha = std::min(alpha_max, std::exp(lop - sigma));
          if (alpha < kAlphaMin) continue;
          const float next = T[p] * (1.f - alpha);
          if (next <= kTransmittanceMin) {
            active[p] = 0;
            --n_active;
            continue;
          }
          const float w = alpha * T[p];
          float* ap = &acc[p * kOut];
          ap[0] += w * f[0];
          ap[1] += w * f[1];
          ap[2] += w * f[2];
          ap[3] += w * f[3];
          if (T[p] > kMedianTransmittance && next <= kMedianTransmittance) md[p] = f[3];
          T[p] = next;
          lst[p] = static_cast<int32_t>(i + 1);
        }
      }
      for (int p = 0; p < n_px; ++p) {
        const int x = tx * ts + p % ts, y = ty * ts + p / ts;
        if (x >= width || y >= height) continue;
        const int64_t pix = (cam * height + y) * width + x;
        float* op = o + pix * kOut;
        for (int ch = 0; ch < 4; ++ch) op[ch] = acc[p * kOut + ch];
        op[4] = 1.f - T[p];
        if (median_depth) med[pix] = md[p];
        la[pix] = lst[p];
        tf[pix] = T[p];
      }
    }
  }
  auto offsets = torch::from_blob(bins.offsets.data(), {static_cast<int64_t>(bins.offsets.size())}, torch::kInt64)
                     .clone();
  auto ids = torch::from_blob(bins.ids.data(), {static_cast<int64_t>(bins.ids.size())}, torch::kInt32).clone();
  return {out, median, offsets, ids, last, trans_final};
}

// Backward of the composited channels: from grad_out [C, H, W, 5] the gradients of means2d [C, N, 2],
// conics [C, N, 3], log_ops [C, N], colors [C, N, 3], depths [C, N], and the absolute 2D gradients [C, N, 2]
// (the sum over pixels of |d loss / d means2d|, AbsGS).
std::vector<torch::Tensor> rasterize_backward(torch::Tensor means2d, torch::Tensor conics, torch::Tensor log_ops,
                                              torch::Tensor colors, torch::Tensor depths, torch::Tensor radii,
                                              torch::Tensor offsets,
                                              torch::Tensor ids, torch::Tensor last, torch::Tensor trans_final,
                                              torch::Tensor grad_out, int64_t width, int64_t height,
                                              int64_t tile_size, double alpha_max_d) {
  const int64_t n_cams = means2d.size(0), n = means2d.size(1);
  const int tiles_x = static_cast<int>((width + tile_size - 1) / tile_size);
  const int tiles_y = static_cast<int>((height + tile_size - 1) / tile_size);
  const int64_t tiles = static_cast<int64_t>(tiles_x) * tiles_y;
  Binning bins;
  bins.offsets.assign(offsets.data_ptr<int64_t>(), offsets.data_ptr<int64_t>() + offsets.numel());
  bins.ids.assign(ids.data_ptr<int32_t>(), ids.data_ptr<int32_t>() + ids.numel());
  const int64_t n_pairs = ids.numel();
  const float* m2 = means2d.data_ptr<float>();
  const float* co = conics.data_ptr<float>();
  const float* lo = log_ops.data_ptr<float>();
  const float* cl = colors.data_ptr<float>();
  const float* dp = depths.data_ptr<float>();
  const int32_t* ra = radii.data_ptr<int32_t>();
  const int32_t* la = last.data_ptr<int32_t>();
  const float* tf = trans_final.data_ptr<float>();
  const float* go = grad_out.data_ptr<float>();
  std::vector<float> pair_grad(n_pairs * kPairGrad, 0.f);
  std::vector<float> pair_abs(n_pairs * 2, 0.f);
  const float alpha_max = static_cast<float>(alpha_max_d);
  const int ts = static_cast<int>(tile_size);
  const int n_px = ts * ts;

#pragma omp parallel num_threads(at::get_num_threads())
  {
    TileGaussians tg;
    std::vector<float> T(n_px), S(n_px), pxs(n_px), pys(n_px), gp(n_px * kOut);
    std::vector<int32_t> lst(n_px);
#pragma omp for schedule(dynamic, 1)
    for (int64_t t = 0; t < n_cams * tiles; ++t) {
      const int64_t k = bins.offsets[t + 1] - bins.offsets[t];
      if (k == 0) continue;
      const int64_t cam = t / tiles, local = t % tiles;
      const int tx = static_cast<int>(local % tiles_x), ty = static_cast<int>(local / tiles_x);
      tg.load(bins, t, cam * n, m2, co, lo, cl, dp, ra, tx, ty, ts);
      int32_t max_last = 0;
      for (int p = 0; p < n_px; ++p) {
        const int x = tx * ts + p % ts, y = ty * ts + p / ts;
        pxs[p] = x + 0.5f;
        pys[p] = y + 0.5f;
        S[p] = 0.f;
        if (x >= width || y >= height) {
          lst[p] = 0;
          T[p] = 1.f;
          continue;
        }
        const int64_t pix = (cam * height + y) * width + x;
        lst[p] = la[pix];
        T[p] = tf[pix];
        for (int ch = 0; ch < kOut; ++ch) gp[p * kOut + ch] = go[pix * kOut + ch];
        max_last = std::max(max_last, lst[p]);
      }
      float* rows = pair_grad.data() + bins.offsets[t] * kPairGrad;
      float* abs_rows = pair_abs.data() + bins.offsets[t] * 2;
      for (int64_t i = max_last - 1; i >= 0; --i) {
        const float mx = tg.mx[i], my = tg.my[i], a = tg.a[i], b = tg.b[i], c = tg.c[i], lop = tg.lo[i];
        const float sigma_max = lop - std::log(kAlphaMin);
        const float f[4] = {tg.r[i], tg.g[i], tg.bl[i], tg.z[i]};
        float g_mx = 0.f, g_my = 0.f, g_a = 0.f, g_b = 0.f, g_c = 0.f, g_lo = 0.f;
        float g_f[4] = {0.f, 0.f, 0.f, 0.f};
        float abs_x = 0.f, abs_y = 0.f;
        for (int row = tg.y0[i]; row < tg.y1[i]; ++row)
        for (int p = row * ts + tg.x0[i]; p < row * ts + tg.x1[i]; ++p) {
          if (i >= lst[p]) continue;
          const float dx = pxs[p] - mx, dy = pys[p] - my;
          const float sigma = 0.5f * (a * dx * dx + c * dy * dy) + b * dx * dy;
          if (sigma > sigma_max) continue;
          const float raw = std::exp(lop - sigma);
          const float alpha = std::min(alpha_max, raw);
          if (alpha < kAlphaMin) continue;
          const float one_minus = 1.f - alpha;
          const float Ti = T[p] / one_minus;  // transmittance in front of this slot
          T[p] = Ti;
          const float w = alpha * Ti;
          const float* g = &gp[p * kOut];
          // The alpha channel composites the feature 1.
          const float G = f[0] * g[0] + f[1] * g[1] + f[2] * g[2] + f[3] * g[3] + g[4];
          g_f[0] += w * g[0];
          g_f[1] += w * g[1];
          g_f[2] += w * g[2];
          g_f[3] += w * g[3];
          // d out / d ln(alpha) = w G - alpha / (1 - alpha) * (sum over the slots behind of w_j G_j)
          const float gla = raw < alpha_max ? w * G - alpha / one_minus * S[p] : 0.f;
          S[p] += w * G;
          // ln(alpha) = log_op - sigma
          g_lo += gla;
          const float gx = gla * (a * dx + b * dy), gy = gla * (b * dx + c * dy);
          g_mx += gx;
          g_my += gy;
          abs_x += std::abs(gx);
          abs_y += std::abs(gy);
          g_a -= gla * 0.5f * dx * dx;
          g_b -= gla * dx * dy;
          g_c -= gla * 0.5f * dy * dy;
        }
        float* row = rows + i * kPairGrad;
        row[0] = g_mx;
        row[1] = g_my;
        row[2] = g_a;
        row[3] = g_b;
        row[4] = g_c;
        row[5] = g_lo;
        row[6] = g_f[0];
        row[7] = g_f[1];
        row[8] = g_f[2];
        row[9] = g_f[3];
        abs_rows[2 * i] = abs_x;
        abs_rows[2 * i + 1] = abs_y;
      }
    }
  }
  auto opts = means2d.options();
  auto g_means2d = torch::zeros({n_cams, n, 2}, opts);
  auto g_conics = torch::zeros({n_cams, n, 3}, opts);
  auto g_log_ops = torch::zeros({n_cams, n}, opts);
  auto g_colors = torch::zeros({n_cams, n, 3}, opts);
  auto g_depths = torch::zeros({n_cams, n}, opts);
  auto g_abs = torch::zeros({n_cams, n, 2}, opts);
  float* gm = g_means2d.data_ptr<float>();
  float* gc = g_conics.data_ptr<float>();
  float* gl = g_log_ops.data_ptr<float>();
  float* gcol = g_colors.data_ptr<float>();
  float* gd = g_depths.data_ptr<float>();
  float* ga = g_abs.data_ptr<float>();
  // Sum the pairs of each Gaussian in pair order (cameras are independent: one thread each).
#pragma omp parallel for schedule(static) num_threads(at::get_num_threads())
  for (int64_t cam = 0; cam < n_cams; ++cam) {
    for (int64_t p = bins.offsets[cam * tiles]; p < bins.offsets[(cam + 1) * tiles]; ++p) {
      const int64_t id = cam * n + bins.ids[p];
      const float* row = pair_grad.data() + p * kPairGrad;
      gm[2 * id] += row[0];
      gm[2 * id + 1] += row[1];
      gc[3 * id] += row[2];
      gc[3 * id + 1] += row[3];
      gc[3 * id + 2] += row[4];
      gl[id] += row[5];
      gcol[3 * id] += row[6];
      gcol[3 * id + 1] += row[7];
      gcol[3 * id + 2] += row[8];
      gd[id] += row[9];
      ga[2 * id] += pair_abs[2 * p];
      ga[2 * id + 1] += pair_abs[2 * p + 1];
    }
  }
  return {g_means2d, g_conics, g_log_ops, g_colors, g_depths, g_abs};
}
