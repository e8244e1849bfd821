// Tile binning, depth sorting and front-to-back alpha compositing of projected Gaussians on the CPU (any tile size),
// forward and backward, with the conventions of gsrecon's torch renderer (gsrecon/render/torch_renderer.py).
//
// Tiles are handed to OpenMP threads. Backward sums each Gaussian's (tile, Gaussian) pair gradients in pair order
// (one thread as it goes, tile after tile; more through a row per pair), so gradients are bit-identical whatever the
// thread count.

// ATen's headers, not <torch/extension.h>: that one (pybind11, the C++ frontend) makes this file's build 4x
// slower; only bindings.cpp needs it.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "kernels.h"

namespace gsrecon {
namespace {

// A pair's gradient row: d means2d (x, y), d conic (a, b, c), d log opacity, d colour (r, g, b), d depth, and
// |d means2d| (x, y) summed over its pixels.
constexpr int kPairGrad = 12;

constexpr int64_t kAhead = 8;  // how far ahead the gathers from scattered places prefetch (Gaussians, pairs)

// Binning's sorts split their work into a part per thread from this many items on. Below it (the statuette's 22k
// Gaussians, 63k pairs) a sort takes a fraction of a millisecond, most of which a part's barriers would eat; the
// threshold itself was not tuned.
constexpr int64_t kPartsFrom = 1 << 16;

// The bits of a float as an integer and back (std::bit_cast is C++20).
inline uint32_t float_bits(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof bits);
  return bits;
}

inline float bits_float(int32_t bits) {
  float x;
  std::memcpy(&x, &bits, sizeof x);
  return x;
}

// e^x to about 1 ulp for x <= 0 (Cody-Waite reduction by ln 2, cephes' degree-6 polynomial, the power of two built
// from its bits): given up std::exp's last ulp for speed, as glibc's vector expf needs -ffast-math, and that would
// break the INFINITY comparisons.
inline float exp_neg(float x) {
  x = std::min(std::max(x, -87.f), 0.f);
  const float n = (x * 1.44269504f + 12582912.f) - 12582912.f;  // round to nearest: 1.5 * 2^23
  float r = x - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * (r * r) + r + 1.f;
  return p * bits_float((static_cast<int32_t>(n) + 127) << 23);
}

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

// The Gaussians that have tile pairs (counts[g + 1] > counts[g]), ordered by depth, ties by index: a stable radix
// sort of the depths' bits (which order positive floats as their values), instead of a comparison sort per tile.
// Each thread takes a contiguous part of the Gaussians in every pass and places its part's after the earlier parts'
// of the same digit: the order is the one stable order, whatever the number of parts.
std::vector<int64_t> depth_order(const float* depths, const int64_t* counts, int64_t total) {
  constexpr int kBits = 11, kBuckets = 1 << kBits;
  const int max_parts = total < kPartsFrom ? 1 : at::get_num_threads();
  std::vector<int64_t> start(static_cast<size_t>(max_parts) * kBuckets);  // [part][bucket]
  std::vector<int64_t> order, next;
  std::vector<uint32_t> keys, next_keys;
#pragma omp parallel num_threads(max_parts)
  {
    const int parts = omp_get_num_threads(), part = omp_get_thread_num();
    int64_t* mine = &start[static_cast<size_t>(part) * kBuckets];
    // The Gaussians with pairs, in index order: each part counts its own, then copies them after the earlier parts'.
    const int64_t g0 = total * part / parts, g1 = total * (part + 1) / parts;
    int64_t kept = 0;
    for (int64_t g = g0; g < g1; ++g) kept += counts[g + 1] > counts[g];
    mine[0] = kept;
#pragma omp barrier
#pragma omp single
    {
      int64_t place = 0;
      for (int r = 0; r < parts; ++r) {
        const int64_t c = start[static_cast<size_t>(r) * kBuckets];
        start[static_cast<size_t>(r) * kBuckets] = place;
        place += c;
      }
      order.resize(place);
      keys.resize(place);
      next.resize(place);
      next_keys.resize(place);
    }
    for (int64_t g = g0, to = mine[0]; g < g1; ++g) {
      if (counts[g + 1] == counts[g]) continue;
      order[to] = g;
      keys[to++] = float_bits(depths[g]);
    }
    const int64_t m = static_cast<int64_t>(order.size());
    const int64_t q0 = m * part / parts, q1 = m * (part + 1) / parts;
    for (int shift = 0; shift < 32; shift += kBits) {
#pragma omp barrier
      std::fill(mine, mine + kBuckets, 0);
      for (int64_t q = q0; q < q1; ++q) ++mine[(keys[q] >> shift) & (kBuckets - 1)];
#pragma omp barrier
#pragma omp single
      {
        int64_t place = 0;
        for (int d = 0; d < kBuckets; ++d)
          for (int r = 0; r < parts; ++r) {
            const int64_t c = start[static_cast<size_t>(r) * kBuckets + d];
            start[static_cast<size_t>(r) * kBuckets + d] = place;
            place += c;
          }
      }
      for (int64_t q = q0; q < q1; ++q) {
        const int64_t to = mine[(keys[q] >> shift) & (kBuckets - 1)]++;
        next[to] = order[q];
        next_keys[to] = keys[q];
      }
#pragma omp barrier
#pragma omp single
      {
        order.swap(next);
        keys.swap(next_keys);
      }
    }
  }
  return order;
}

// For every tile of every camera, the visible Gaussians whose alpha reaches 1/255 in it, sorted by depth
// (ties by index).
Binning bin_gaussians(const float* means2d, const float* conics, const float* log_ops, const float* depths,
                      const int32_t* radii, int64_t n_cams, int64_t n, int tiles_x, int tiles_y, int tile_size) {
  const int64_t tiles = static_cast<int64_t>(tiles_x) * tiles_y;
  const int64_t total = n_cams * n;
  const float log_alpha_min = std::log(kAlphaMin) - 1e-4f;
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
  // Each Gaussian's box of tiles holds its candidate pairs; those it reaches are kept, in its own place:
  // order-independent. Buffers every entry of which is written before it is read are left unzeroed (a serial fill
  // of tens of MB at 1M Gaussians).
  LargeArray<int64_t> boxes = large_array<int64_t>(total + 1);
  boxes[0] = 0;
#pragma omp parallel for schedule(static) num_threads(at::get_num_threads())
  for (int64_t g = 0; g < total; ++g) {
    boxes[g + 1] = 0;
    if (radii[2 * g] <= 0 && radii[2 * g + 1] <= 0) continue;
    int x0, y0, x1, y1;
    rect(g, x0, y0, x1, y1);
    boxes[g + 1] = static_cast<int64_t>(x1 - x0) * (y1 - y0);
  }
  for (int64_t g = 0; g < total; ++g) boxes[g + 1] += boxes[g];
  LargeArray<int64_t> box_tile = large_array<int64_t>(boxes[total]);
  Binning out;
  out.first = empty_large({total + 1}, at::kLong);
  int64_t* first = out.first.data_ptr<int64_t>();
  first[0] = 0;
#pragma omp parallel for schedule(static) num_threads(at::get_num_threads())
  for (int64_t g = 0; g < total; ++g) {
    first[g + 1] = 0;
    if (boxes[g + 1] == boxes[g]) continue;
    int x0, y0, x1, y1;
    rect(g, x0, y0, x1, y1);
    int64_t k = boxes[g];
    const int64_t cam_tiles = (g / n) * tiles;
    for (int ty = y0; ty < y1; ++ty)
      for (int tx = x0; tx < x1; ++tx)
        if (reaches(g, tx, ty)) box_tile[k++] = cam_tiles + static_cast<int64_t>(ty) * tiles_x + tx;
    first[g + 1] = k - boxes[g];
  }
  for (int64_t g = 0; g < total; ++g) first[g + 1] += first[g];
  const int64_t n_pairs = first[total];
  LargeArray<int64_t> pair_tile = large_array<int64_t>(n_pairs);
#pragma omp parallel for schedule(static) num_threads(at::get_num_threads())
  for (int64_t g = 0; g < total; ++g)
    std::copy(&box_tile[boxes[g]], &box_tile[boxes[g]] + (first[g + 1] - first[g]), &pair_tile[first[g]]);
  // Counting sort by tile of the pairs, taken in depth order: each tile's list comes out sorted by (depth, index).
  // Each thread takes a contiguous part of the depth order: it counts its part's pairs per tile, and then places
  // them after those of the parts before it; the same places whatever the number of parts.
  const std::vector<int64_t> order = depth_order(depths, first, total);
  const int64_t n_tiles = n_cams * tiles;
  out.offsets = at::empty({n_tiles + 1}, at::kLong);
  out.ids = empty_large({n_pairs}, at::kInt);
  out.slots = empty_large({n_pairs}, at::kLong);
  int64_t* offsets = out.offsets.data_ptr<int64_t>();
  int32_t* ids = out.ids.data_ptr<int32_t>();
  int64_t* slots = out.slots.data_ptr<int64_t>();
  const int max_parts = n_pairs < kPartsFrom ? 1 : at::get_num_threads();
  std::vector<int64_t> fill(static_cast<size_t>(max_parts) * n_tiles);  // [part][tile]
  // In depth order the Gaussians' pairs lie far apart: their places are fetched a few Gaussians ahead.
  auto walk = [&](int64_t q0, int64_t q1, auto&& visit) {
    for (int64_t q = q0; q < q1; ++q) {
      if (q + 2 * kAhead < q1) __builtin_prefetch(first + order[q + 2 * kAhead]);
      if (q + kAhead < q1) {
        __builtin_prefetch(&pair_tile[first[order[q + kAhead]]]);
        __builtin_prefetch(slots + first[order[q + kAhead]], 1);
      }
      const int64_t g = order[q];
      for (int64_t p = first[g]; p < first[g + 1]; ++p) visit(g, p);
    }
  };
  const int64_t m = static_cast<int64_t>(order.size());
#pragma omp parallel num_threads(max_parts)
  {
    const int parts = omp_get_num_threads(), part = omp_get_thread_num();
    const int64_t q0 = m * part / parts, q1 = m * (part + 1) / parts;
    int64_t* count = &fill[static_cast<size_t>(part) * n_tiles];
    std::fill(count, count + n_tiles, 0);
    if (parts > 1) walk(q0, q1, [&](int64_t, int64_t p) { ++count[pair_tile[p]]; });
#pragma omp barrier
#pragma omp single
    {
      if (parts == 1) {  // one part: counted in pair order, a sequential pass
        for (int64_t p = 0; p < n_pairs; ++p) ++fill[pair_tile[p]];
      }
      offsets[0] = 0;
      for (int64_t t = 0; t < n_tiles; ++t) {
        int64_t place = offsets[t];
        for (int r = 0; r < parts; ++r) {
          const int64_t c = fill[static_cast<size_t>(r) * n_tiles + t];
          fill[static_cast<size_t>(r) * n_tiles + t] = place;
          place += c;
        }
        offsets[t + 1] = place;
      }
    }
    walk(q0, q1, [&](int64_t g, int64_t p) {
      slots[p] = count[pair_tile[p]]++;
      ids[slots[p]] = static_cast<int32_t>(g % n);
    });
  }
  return out;
}

// The data of a Splats' tensors, as both passes read them.
struct SplatData {
  const float *means2d, *conics, *log_ops, *colors, *depths;
  const int32_t* radii;
  explicit SplatData(const Splats& s)
      : means2d(s.means2d.data_ptr<float>()), conics(s.conics.data_ptr<float>()),
        log_ops(s.log_opacities.data_ptr<float>()), colors(s.colors.data_ptr<float>()),
        depths(s.depths.data_ptr<float>()), radii(s.radii.data_ptr<int32_t>()) {}
};

void check_splats(const Splats& s, const RasterSettings& settings) {
  const int64_t c = s.means2d.size(0), n = s.means2d.dim() == 3 ? s.means2d.size(1) : -1;
  check_tensor(s.means2d, "means2d", at::kFloat, {-1, -1, 2});
  check_tensor(s.conics, "conics", at::kFloat, {c, n, 3});
  check_tensor(s.log_opacities, "log_opacities", at::kFloat, {c, n});
  check_tensor(s.colors, "colors", at::kFloat, {c, n, 3});
  check_tensor(s.depths, "depths", at::kFloat, {c, n});
  check_tensor(s.radii, "radii", at::kInt, {c, n, 2});
  TORCH_CHECK_VALUE(settings.width > 0 && settings.height > 0 && settings.tile_size > 0, "kernel arguments width=",
                    settings.width, ", height=", settings.height, ", tile_size=", settings.tile_size,
                    ": must be positive");
  TORCH_CHECK_VALUE(settings.alpha_max > kAlphaMin && settings.alpha_max < 1.0, "kernel argument alpha_max=",
                    settings.alpha_max, " is not in (1/255, 1)");
}

// The tiles of C images of width x height: tile t is tile (tx, ty) of camera t / tiles.
struct TileGrid {
  int tiles_x, tiles_y;
  int64_t tiles;  // per camera
  TileGrid(int64_t width, int64_t height, int64_t tile_size)
      : tiles_x(static_cast<int>((width + tile_size - 1) / tile_size)),
        tiles_y(static_cast<int>((height + tile_size - 1) / tile_size)),
        tiles(static_cast<int64_t>(tiles_x) * tiles_y) {}
  void locate(int64_t t, int64_t& cam, int& tx, int& ty) const {
    cam = t / tiles;
    tx = static_cast<int>(t % tiles % tiles_x);
    ty = static_cast<int>(t % tiles / tiles_x);
  }
};

// A visible Gaussian as the compositing loops read it, in one record: a pair's gather reads one cache line instead
// of one per field.
struct alignas(64) PackedSplat {
  float mx, my, a, b, c, lo;
  float f[4];              // r, g, b, depth
  int32_t x0, x1, y0, y1;  // its box's pixels, [x0, x1) x [y0, y1): the centres x + 0.5 within [mx - rx, mx + rx]
};

// The Gaussians of `in` that have tile pairs (first[g + 1] > first[g]), packed; the others' records are left
// unwritten (never read).
LargeArray<PackedSplat> pack_splats(const SplatData& in, const int64_t* first, int64_t total) {
  LargeArray<PackedSplat> out = large_array<PackedSplat>(total);
#pragma omp parallel for schedule(static) num_threads(at::get_num_threads())
  for (int64_t g = 0; g < total; ++g) {
    if (first[g + 1] == first[g]) continue;
    PackedSplat& p = out[g];
    p.mx = in.means2d[2 * g];
    p.my = in.means2d[2 * g + 1];
    p.a = in.conics[3 * g];
    p.b = in.conics[3 * g + 1];
    p.c = in.conics[3 * g + 2];
    p.lo = in.log_ops[g];
    for (int ch = 0; ch < 3; ++ch) p.f[ch] = in.colors[3 * g + ch];
    p.f[3] = in.depths[g];
    const float rx = static_cast<float>(in.radii[2 * g]), ry = static_cast<float>(in.radii[2 * g + 1]);
    p.x0 = static_cast<int>(std::ceil(p.mx - rx - 0.5f));
    p.x1 = static_cast<int>(std::floor(p.mx + rx - 0.5f)) + 1;
    p.y0 = static_cast<int>(std::ceil(p.my - ry - 0.5f));
    p.y1 = static_cast<int>(std::floor(p.my + ry - 0.5f)) + 1;
  }
  return out;
}

// Gaussian i of a tile, as its rows of pixels see it.
struct Splat {
  float mx, my, a, b, c, lo, sigma_max, f[4];
  int x0, x1, row0, row1;  // the pixels of the tile inside its box: columns [x0, x1), rows [row0, row1)
  Splat(const PackedSplat& p, int tx, int ty, int ts)
      : mx(p.mx), my(p.my), a(p.a), b(p.b), c(p.c), lo(p.lo),
        sigma_max(p.lo - std::log(kAlphaMin)),  // sigma above this: alpha below 1/255
        f{p.f[0], p.f[1], p.f[2], p.f[3]}, x0(std::max(0, p.x0 - tx * ts)), x1(std::min(ts, p.x1 - tx * ts)),
        row0(std::max(0, p.y0 - ty * ts)), row1(std::min(ts, p.y1 - ty * ts)) {
    narrow_rows(tx * ts, ty * ts);
  }
  float sigma(float dx, float dy) const { return 0.5f * (a * dx * dx + c * dy * dy) + b * dx * dy; }
  // Whether the ellipse sigma <= sigma_max misses the pixel centres dx in [dx_lo, dx_hi] of the row at dy: its least
  // sigma there (at the clamped minimiser over dx) exceeds sigma_max by more than the rounding of its terms, so that
  // no pixel of the row can be live (the compositing loops' own test).
  bool misses_row(float dx_lo, float dx_hi, float dy) const {
    const float dx = std::min(std::max(-b * dy / a, dx_lo), dx_hi);
    const float size = 0.5f * (a * dx * dx + c * dy * dy) + std::abs(b * dx * dy);
    return sigma(dx, dy) > sigma_max + 1e-5f * size;
  }
  // Narrows the rows [row0, row1) of the tile at pixel (x_base, y_base) to those the ellipse reaches in columns
  // [x0, x1): an interval, as the ellipse is convex, so only the rows it misses and two more are tested. A sixth of
  // the rows of bench_render's scenes, for tilted or thin ellipses near a tile's corners.
  void narrow_rows(int x_base, int y_base) {
    const float dx_lo = static_cast<float>(x_base + x0) + 0.5f - mx;
    const float dx_hi = static_cast<float>(x_base + x1 - 1) + 0.5f - mx;
    auto misses = [&](int row) { return misses_row(dx_lo, dx_hi, static_cast<float>(y_base + row) + 0.5f - my); };
    while (row0 < row1 && misses(row0)) ++row0;
    while (row1 > row0 && misses(row1 - 1)) --row1;
  }
};

// The per-pixel state of one tile, one array per quantity (row-major, tile_size^2), so that a row's pixels are
// processed as vector lanes.
struct TilePixels {
  std::vector<float> T, r, g, b, z, md, S, gr, gg, gb, gz, ga;
  std::vector<int32_t> last, done, row_live;
  explicit TilePixels(int ts) {
    const size_t n = static_cast<size_t>(ts) * ts;
    for (auto* v : {&T, &r, &g, &b, &z, &md, &S, &gr, &gg, &gb, &gz, &ga}) v->assign(n, 0.f);
    for (auto* v : {&last, &done}) v->assign(n, 0);
    row_live.assign(ts, 0);
  }
};

// The "and" of the lane masks below. AVX-512 masks the loads behind a short-circuit &&, and GCC vectorises these
// loops best so; without those masks it vectorises only straight-line code, a plain & (with AVX2 alone: forward
// 22 ms against 8.5 at 20k Gaussians; with AVX-512 7.4 against 28).
#ifdef __AVX512F__
#define LANE_AND &&
#else
#define LANE_AND &
#endif

// Composites splat `slot` (0-based) over pixels [x0, x1) of the tile row starting at pixel p0 (image x of its first
// pixel bx, offset dy): branch-free over all W pixels of the row so that they vectorise. Returns how many pixels
// stopped here (the splat would take their transmittance to kTransmittanceMin or below).
template <int W>
int composite_row(TilePixels& px, const Splat& s, int p0, int ts, int bx, float dy, int x0, int x1, int32_t slot,
                  float alpha_max) {
  const int w = W > 0 ? W : ts;
  float *T = &px.T[p0], *r = &px.r[p0], *g = &px.g[p0], *b = &px.b[p0], *z = &px.z[p0], *md = &px.md[p0];
  int32_t *done = &px.done[p0], *last = &px.last[p0];
  int stops = 0;
#pragma omp simd reduction(+ : stops)
  for (int j = 0; j < w; ++j) {
    const float dx = static_cast<float>(bx + j) + 0.5f - s.mx;
    const float sigma = s.sigma(dx, dy);
    const float alpha = std::min(alpha_max, exp_neg(s.lo - sigma));
    const bool live =
        (j >= x0) LANE_AND(j < x1) LANE_AND(done[j] == 0) LANE_AND(sigma <= s.sigma_max) LANE_AND(alpha >= kAlphaMin);
    const float t = T[j], next = t * (1.f - alpha), wt = alpha * t;
    const bool stop = live LANE_AND(next <= kTransmittanceMin);
    const bool take = live LANE_AND !stop;
    r[j] = take ? r[j] + wt * s.f[0] : r[j];
    g[j] = take ? g[j] + wt * s.f[1] : g[j];
    b[j] = take ? b[j] + wt * s.f[2] : b[j];
    z[j] = take ? z[j] + wt * s.f[3] : z[j];
    md[j] = take LANE_AND(t > kMedianTransmittance) LANE_AND(next <= kMedianTransmittance) ? s.f[3] : md[j];
    T[j] = take ? next : t;
    last[j] = take ? slot + 1 : last[j];
    done[j] = stop ? 1 : done[j];
    stops += stop;
  }
  return stops;
}

// Undoes splat `slot` at pixels [x0, x1) of a tile row (as composite_row's lanes) and adds its gradients there to
// `lanes`: one array of ts lanes per entry of a pair's gradient row (summed over the lanes at the end of the splat,
// in lane order).
template <int W>
inline __attribute__((always_inline)) void backward_row(TilePixels& px, const Splat& s, int p0, int ts, int bx, float dy, int x0, int x1, int32_t slot,
                  float alpha_max, float* lanes) {
  const int w = W > 0 ? W : ts;
  float *T = &px.T[p0], *S = &px.S[p0];
  const float *gr = &px.gr[p0], *gg = &px.gg[p0], *gb = &px.gb[p0], *gz = &px.gz[p0], *ga = &px.ga[p0];
  const int32_t* last = &px.last[p0];
  float *l_mx = lanes, *l_my = l_mx + w, *l_a = l_my + w, *l_b = l_a + w, *l_c = l_b + w, *l_lo = l_c + w;
  float *l_r = l_lo + w, *l_g = l_r + w, *l_bl = l_g + w, *l_z = l_bl + w, *l_ax = l_z + w, *l_ay = l_ax + w;
#pragma omp simd
  for (int j = 0; j < w; ++j) {
    const float dx = static_cast<float>(bx + j) + 0.5f - s.mx;
    const float sigma = s.sigma(dx, dy);
    const float raw = exp_neg(s.lo - sigma);
    const float alpha = std::min(alpha_max, raw);
    const bool live =
        (j >= x0) LANE_AND(j < x1) LANE_AND(slot < last[j]) LANE_AND(sigma <= s.sigma_max) LANE_AND(alpha >= kAlphaMin);
    const float one_minus = 1.f - alpha;
    const float Ti = T[j] / one_minus;  // transmittance in front of this slot
    const float wt = live ? alpha * Ti : 0.f;
    // The alpha channel composites the feature 1.
    const float G = s.f[0] * gr[j] + s.f[1] * gg[j] + s.f[2] * gb[j] + s.f[3] * gz[j] + ga[j];
    // d out / d ln(alpha) = w G - alpha / (1 - alpha) * (sum over the slots behind of w_j G_j)
    const float gla = live LANE_AND(raw < alpha_max) ? wt * G - alpha / one_minus * S[j] : 0.f;
    T[j] = live ? Ti : T[j];
    S[j] += wt * G;
    l_r[j] += wt * gr[j];
    l_g[j] += wt * gg[j];
    l_bl[j] += wt * gb[j];
    l_z[j] += wt * gz[j];
    // ln(alpha) = log_op - sigma
    l_lo[j] += gla;
    const float gx = gla * (s.a * dx + s.b * dy), gy = gla * (s.b * dx + s.c * dy);
    l_mx[j] += gx;
    l_my[j] += gy;
    l_ax[j] += std::abs(gx);
    l_ay[j] += std::abs(gy);
    l_a[j] -= gla * 0.5f * dx * dx;
    l_b[j] -= gla * dx * dy;
    l_c[j] -= gla * 0.5f * dy * dy;
  }
}

// Each entry's sum over a pair's ts lanes (backward_row's `lanes`, [kPairGrad][ts], changed) into row: halving the
// lanes in a fixed order (vector adds, not one chain of scalar adds), the same sums on every thread.
template <int W>
void sum_lanes(float* lanes, int ts, float* row) {
  const int w = W > 0 ? W : ts;
  for (int width = w; width > 1;) {
    const int half = width / 2;
    for (int q = 0; q < kPairGrad; ++q) {
      float* lane = lanes + q * w;
#pragma omp simd
      for (int j = 0; j < half; ++j) lane[j] += lane[j + width - half];
    }
    width -= half;
  }
  for (int q = 0; q < kPairGrad; ++q) row[q] = lanes[q * w];
}

// Undoes splat `slot` on its rows of the tile that composited it (row_last[row] > slot) and sums its gradient row
// into `row`. With W = 16 the lanes are a local array, which the row loop keeps in vector registers instead of
// loading and storing its 12 accumulators every row; otherwise `lanes` ([kPairGrad][ts]) holds them.
template <int W>
void backward_pair(TilePixels& px, const Splat& s, const int32_t* row_last, int ts, int tx, int ty, int32_t slot,
                   float alpha_max, float* lanes, float* row) {
  float local[W > 0 ? kPairGrad * W : 1];
  float* acc = W > 0 ? local : lanes;
  std::fill(acc, acc + kPairGrad * (W > 0 ? W : ts), 0.f);
  for (int r = s.row0; r < s.row1; ++r) {
    if (row_last[r] <= slot) continue;
    const float dy = static_cast<float>(ty * ts + r) + 0.5f - s.my;
    backward_row<W>(px, s, r * ts, ts, tx * ts, dy, s.x0, s.x1, slot, alpha_max, acc);
  }
  sum_lanes<W>(acc, ts, row);
}

// The tiles 0..cost.size() - 1 by decreasing cost (ties by index): handed out so, the dynamic schedule ends on
// cheap tiles instead of one thread compositing the last heavy tile alone while the others wait.
std::vector<int64_t> heavy_first(const std::vector<int64_t>& cost) {
  std::vector<int64_t> order(cost.size());
  for (size_t t = 0; t < order.size(); ++t) order[t] = static_cast<int64_t>(t);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return cost[a] > cost[b]; });
  return order;
}

}  // namespace

Raster rasterize_forward(const Splats& splats, const RasterSettings& settings, bool median_depth) {
  check_splats(splats, settings);
  const int64_t n_cams = splats.means2d.size(0), n = splats.means2d.size(1);
  const int64_t width = settings.width, height = settings.height, tile_size = settings.tile_size;
  const TileGrid grid(width, height, tile_size);
  const SplatData in(splats);
  const Binning bins = bin_gaussians(in.means2d, in.conics, in.log_ops, in.depths, in.radii, n_cams, n, grid.tiles_x,
                                     grid.tiles_y, static_cast<int>(tile_size));
  const LargeArray<PackedSplat> packed = pack_splats(in, bins.first.data_ptr<int64_t>(), n_cams * n);
  const int64_t* offsets = bins.offsets.data_ptr<int64_t>();
  const int32_t* ids = bins.ids.data_ptr<int32_t>();
  auto opts = splats.means2d.options();
  // Every pixel is written by its tile below (an empty tile's too): no serial fill first.
  auto out = empty_large({n_cams, height, width, kComposited}, opts);
  auto median = empty_large({n_cams, height, width}, opts);
  auto last = empty_large({n_cams, height, width}, opts.dtype(at::kInt));
  auto trans_final = empty_large({n_cams, height, width}, opts);
  float* image_px = out.data_ptr<float>();
  float* median_px = median.data_ptr<float>();
  int32_t* last_px = last.data_ptr<int32_t>();
  float* trans_px = trans_final.data_ptr<float>();
  const float alpha_max = static_cast<float>(settings.alpha_max);
  const int ts = static_cast<int>(tile_size);
  const int n_px = ts * ts;

  std::vector<int64_t> pairs(n_cams * grid.tiles);  // a tile's cost
  for (int64_t t = 0; t < n_cams * grid.tiles; ++t) pairs[t] = offsets[t + 1] - offsets[t];
  const std::vector<int64_t> tiles = heavy_first(pairs);

#pragma omp parallel num_threads(at::get_num_threads())
  {
    TilePixels px(ts);
#pragma omp for schedule(dynamic, 1)
    for (int64_t j = 0; j < n_cams * grid.tiles; ++j) {
      const int64_t t = tiles[j], k = pairs[t];
      int64_t cam;
      int tx, ty;
      grid.locate(t, cam, tx, ty);
      const PackedSplat* cam_splats = packed.get() + cam * n;
      const int32_t* tile_ids = ids + offsets[t];
      std::fill(px.T.begin(), px.T.end(), 1.f);
      for (auto* v : {&px.r, &px.g, &px.b, &px.z, &px.md}) std::fill(v->begin(), v->end(), 0.f);
      std::fill(px.last.begin(), px.last.end(), 0);
      std::fill(px.done.begin(), px.done.end(), 0);
      std::fill(px.row_live.begin(), px.row_live.end(), ts);
      int n_active = n_px;
      for (int64_t i = 0; i < k && n_active > 0; ++i) {
        if (i + 1 < k) __builtin_prefetch(cam_splats + tile_ids[i + 1]);
        const Splat s(cam_splats[tile_ids[i]], tx, ty, ts);
        for (int row = s.row0; row < s.row1; ++row) {
          if (px.row_live[row] == 0) continue;
          const float dy = static_cast<float>(ty * ts + row) + 0.5f - s.my;
          const int stops =
              ts == 16 ? composite_row<16>(px, s, row * ts, ts, tx * ts, dy, s.x0, s.x1, i, alpha_max)
                       : composite_row<0>(px, s, row * ts, ts, tx * ts, dy, s.x0, s.x1, i, alpha_max);
          px.row_live[row] -= stops;
          n_active -= stops;
        }
      }
      for (int p = 0; p < n_px; ++p) {
        const int x = tx * ts + p % ts, y = ty * ts + p / ts;
        if (x >= width || y >= height) continue;
        const int64_t pix = (cam * height + y) * width + x;
        float* rgbza = image_px + pix * kComposited;
        rgbza[0] = px.r[p];
        rgbza[1] = px.g[p];
        rgbza[2] = px.b[p];
        rgbza[3] = px.z[p];
        rgbza[4] = 1.f - px.T[p];
        median_px[pix] = median_depth ? px.md[p] : 0.f;
        last_px[pix] = px.last[p];
        trans_px[pix] = px.T[p];
      }
    }
  }
  return {out, median, bins, last, trans_final};
}

SplatGrads rasterize_backward(const Splats& splats, const Raster& forward, const at::Tensor& grad_image,
                              const RasterSettings& settings) {
  check_splats(splats, settings);
  const int64_t n_cams = splats.means2d.size(0), n = splats.means2d.size(1);
  const int64_t width = settings.width, height = settings.height, tile_size = settings.tile_size;
  const TileGrid grid(width, height, tile_size);
  const int64_t n_tiles = n_cams * grid.tiles;
  const Binning& bins = forward.binning;
  check_tensor(bins.offsets, "offsets", at::kLong, {n_tiles + 1});
  check_tensor(bins.ids, "ids", at::kInt, {-1});
  check_tensor(bins.first, "first", at::kLong, {n_cams * n + 1});
  check_tensor(bins.slots, "slots", at::kLong, {bins.ids.numel()});
  check_tensor(forward.last, "last", at::kInt, {n_cams, height, width});
  check_tensor(forward.trans_final, "trans_final", at::kFloat, {n_cams, height, width});
  check_tensor(grad_image, "grad_image", at::kFloat, {n_cams, height, width, kComposited});
  const SplatData in(splats);
  const at::Tensor &offsets_t = bins.offsets, &ids_t = bins.ids, &first_t = bins.first, &slots_t = bins.slots;
  const at::Tensor &last = forward.last, &trans_final = forward.trans_final, &grad_out = grad_image;
  const int64_t* offsets = offsets_t.data_ptr<int64_t>();
  const int32_t* ids = ids_t.data_ptr<int32_t>();
  const int64_t* first = first_t.data_ptr<int64_t>();
  const int64_t* slots = slots_t.data_ptr<int64_t>();
  const int64_t n_pairs = ids_t.numel();
  TORCH_CHECK_VALUE(first[n_cams * n] == n_pairs, "kernel argument 'first' does not end at the pairs' count ", n_pairs);
  const LargeArray<PackedSplat> packed = pack_splats(in, first, n_cams * n);
  const int32_t* last_px = last.data_ptr<int32_t>();
  const float* trans_px = trans_final.data_ptr<float>();
  const float* grad_px = grad_out.data_ptr<float>();
  // One thread takes the tiles in pair order and adds each pair's row straight to its Gaussian's sum; more threads
  // keep the rows apart and then sum each Gaussian's in pair order: the same additions either way. Only the pairs
  // a tile's pixels reached (i < its max_last; `reached` says which) have a row: the others add nothing, and their
  // rows are neither zeroed nor touched (at 1M Gaussians most pairs lie behind saturated pixels); `has_rows` marks
  // the Gaussians with a reached pair, so that the sum skips the others without reading their pairs.
  const bool in_order = at::get_num_threads() == 1;
  // Not in huge pages: a tile's reached rows are a few KB at the start of its pairs, and a huge page would clear
  // all 2 MiB around them (at 1M Gaussians: 160 MB cleared a call, 20 % of the backward's time on two threads).
  const std::unique_ptr<float[]> pair_grad(in_order ? nullptr : new float[n_pairs * kPairGrad]);
  const LargeArray<uint8_t> reached = large_array<uint8_t>(in_order ? 0 : n_pairs);
  const LargeArray<uint8_t> has_rows = large_array<uint8_t>(in_order ? 0 : n_cams * n);
  std::fill(has_rows.get(), has_rows.get() + (in_order ? 0 : n_cams * n), uint8_t{0});
  const LargeArray<float> grad_sums = large_array<float>(in_order ? n_cams * n * kPairGrad : 0);
  std::fill(grad_sums.get(), grad_sums.get() + (in_order ? n_cams * n * kPairGrad : 0), 0.f);
  const float alpha_max = static_cast<float>(settings.alpha_max);
  const int ts = static_cast<int>(tile_size);
  const int n_px = ts * ts;

  // A tile's cost: the slots its pixels composited. One thread takes the tiles in order (see above).
  std::vector<int64_t> tiles(n_tiles);
  if (in_order) {
    for (int64_t t = 0; t < n_tiles; ++t) tiles[t] = t;
  } else {
    std::vector<int64_t> slots_done(n_tiles, 0);
    for (int64_t cam = 0; cam < n_cams; ++cam)
      for (int64_t y = 0; y < height; ++y)
        for (int64_t x = 0; x < width; ++x)
          slots_done[cam * grid.tiles + y / tile_size * grid.tiles_x + x / tile_size] +=
              last_px[(cam * height + y) * width + x];
    tiles = heavy_first(slots_done);
  }

#pragma omp parallel num_threads(at::get_num_threads())
  {
    TilePixels px(ts);
    std::vector<int32_t> row_last(ts);
    std::vector<float> lanes(kPairGrad * ts);
#pragma omp for schedule(dynamic, 1)
    for (int64_t j = 0; j < n_tiles; ++j) {
      const int64_t t = tiles[j], k = offsets[t + 1] - offsets[t];
      if (k == 0) continue;
      int64_t cam;
      int tx, ty;
      grid.locate(t, cam, tx, ty);
      const PackedSplat* cam_splats = packed.get() + cam * n;
      const int32_t* tile_ids = ids + offsets[t];
      float* cam_sums = grad_sums.get() + cam * n * kPairGrad;
      std::fill(row_last.begin(), row_last.end(), 0);
      for (int p = 0; p < n_px; ++p) {
        const int x = tx * ts + p % ts, y = ty * ts + p / ts;
        px.S[p] = 0.f;
        const bool inside = x < width && y < height;
        const int64_t pix = inside ? (cam * height + y) * width + x : 0;
        px.last[p] = inside ? last_px[pix] : 0;
        px.T[p] = inside ? trans_px[pix] : 1.f;
        float* grads[kComposited] = {&px.gr[p], &px.gg[p], &px.gb[p], &px.gz[p], &px.ga[p]};
        for (int ch = 0; ch < kComposited; ++ch) *grads[ch] = inside ? grad_px[pix * kComposited + ch] : 0.f;
        row_last[p / ts] = std::max(row_last[p / ts], px.last[p]);
      }
      const int32_t max_last = *std::max_element(row_last.begin(), row_last.end());
      if (!in_order) {
        std::fill(&reached[offsets[t]], &reached[offsets[t]] + max_last, uint8_t{1});
        std::fill(&reached[offsets[t]] + max_last, &reached[offsets[t + 1]], uint8_t{0});
      }
      for (int32_t i = max_last - 1; i >= 0; --i) {
        if (i > 0) {  // the next pair's record and, with one thread, its Gaussian's sums: gathers from far apart
          __builtin_prefetch(cam_splats + tile_ids[i - 1]);
          if (in_order) __builtin_prefetch(cam_sums + tile_ids[i - 1] * kPairGrad);
          if (in_order) __builtin_prefetch(cam_sums + tile_ids[i - 1] * kPairGrad + kPairGrad - 1);
        }
        const Splat s(cam_splats[tile_ids[i]], tx, ty, ts);
        float row[kPairGrad];
        if (ts == 16)
          backward_pair<16>(px, s, row_last.data(), ts, tx, ty, i, alpha_max, lanes.data(), row);
        else
          backward_pair<0>(px, s, row_last.data(), ts, tx, ty, i, alpha_max, lanes.data(), row);
        float* to = in_order ? cam_sums + tile_ids[i] * kPairGrad : &pair_grad[(offsets[t] + i) * kPairGrad];
        if (in_order)
          for (int q = 0; q < kPairGrad; ++q) to[q] += row[q];
        else {
          std::copy(row, row + kPairGrad, to);
          __atomic_store_n(&has_rows[cam * n + tile_ids[i]], uint8_t{1}, __ATOMIC_RELAXED);  // tiles race to set it
        }
      }
    }
  }
  auto opts = splats.means2d.options();
  auto g_means2d = empty_large({n_cams, n, 2}, opts);
  auto g_conics = empty_large({n_cams, n, 3}, opts);
  auto g_log_ops = empty_large({n_cams, n}, opts);
  auto g_colors = empty_large({n_cams, n, 3}, opts);
  auto g_depths = empty_large({n_cams, n}, opts);
  auto g_abs = empty_large({n_cams, n, 2}, opts);
  float* v_means2d = g_means2d.data_ptr<float>();
  float* v_conics = g_conics.data_ptr<float>();
  float* v_log_ops = g_log_ops.data_ptr<float>();
  float* v_colors = g_colors.data_ptr<float>();
  float* v_depths = g_depths.data_ptr<float>();
  float* v_abs = g_abs.data_ptr<float>();
  // Each Gaussian's reached pairs summed in pair order, whichever thread sums it.
#pragma omp parallel for schedule(static) num_threads(at::get_num_threads())
  for (int64_t g = 0; g < n_cams * n; ++g) {
    float local[kPairGrad] = {0.f};
    float* sum = in_order ? &grad_sums[g * kPairGrad] : local;
    for (int64_t q = first[g]; q < first[g + 1] && !in_order && has_rows[g]; ++q) {
      // The rows lie apart, in tile order: fetched a few pairs ahead.
      if (q + 2 * kAhead < n_pairs) __builtin_prefetch(&reached[slots[q + 2 * kAhead]]);
      if (q + kAhead < n_pairs) {
        const float* ahead = &pair_grad[slots[q + kAhead] * kPairGrad];
        __builtin_prefetch(ahead);
        __builtin_prefetch(ahead + kPairGrad - 1);
      }
      if (!reached[slots[q]]) continue;
      const float* row = &pair_grad[slots[q] * kPairGrad];
      for (int c = 0; c < kPairGrad; ++c) sum[c] += row[c];
    }
    std::copy(sum, sum + 2, v_means2d + 2 * g);
    std::copy(sum + 2, sum + 5, v_conics + 3 * g);
    v_log_ops[g] = sum[5];
    std::copy(sum + 6, sum + 9, v_colors + 3 * g);
    v_depths[g] = sum[9];
    std::copy(sum + 10, sum + 12, v_abs + 2 * g);
  }
  return {g_means2d, g_conics, g_log_ops, g_colors, g_depths, g_abs};
}

}  // namespace gsrecon
