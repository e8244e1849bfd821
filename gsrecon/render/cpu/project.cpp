// EWA projection of 3D Gaussians into pinhole cameras and their spherical-harmonics colours on the CPU, forward
// and backward, with the conventions of gsrecon's torch renderer (gsrecon/render/torch_renderer.py,
// project_gaussians and shade_gaussians). Gaussians are handed to OpenMP threads; each Gaussian's gradient sums
// its cameras in order, so results do not depend on the thread count.

// ATen's headers, not <torch/extension.h>: that one (pybind11, the C++ frontend) makes this file's build 4x
// slower; only bindings.cpp needs it.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/zeros.h>
#include <ATen/ops/zeros_like.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace {

constexpr float kAlphaMin = 1.0f / 255.0f;  // a Gaussian whose opacity is below this is culled
constexpr float kBboxSigmas = 3.33f;        // bounding boxes never extend past this many standard deviations
constexpr float kTiny = 1e-30f;             // floor of the undilated determinant (antialiased mode)

constexpr double kC0 = 0.28209479177387814;
constexpr double kC1 = 0.4886025119029199;
constexpr double kC2[5] = {1.0925484305920792, -1.0925484305920792, 0.31539156525252005, -1.0925484305920792,
                           0.5462742152960396};
constexpr double kC3[7] = {-0.5900435899266435, 2.890611442640554,  -0.4570457994644658, 0.3731763325901154,
                           -0.4570457994644658, 1.445305721320277, -0.5900435899266435};

// The first n SH basis functions at the unit direction (x, y, z), and with grad != nullptr their derivatives
// d basis_k / d (x, y, z) in grad[3 k .. 3 k + 2].
void sh_basis(int n, float x, float y, float z, float* basis, float* grad) {
  basis[0] = static_cast<float>(kC0);
  if (grad) grad[0] = grad[1] = grad[2] = 0.f;
  if (n <= 1) return;
  const float c1 = static_cast<float>(kC1);
  basis[1] = -c1 * y;
  basis[2] = c1 * z;
  basis[3] = -c1 * x;
  if (grad) {
    const float g[9] = {0.f, -c1, 0.f, 0.f, 0.f, c1, -c1, 0.f, 0.f};
    std::copy(g, g + 9, grad + 3);
  }
  if (n <= 4) return;
  const float xx = x * x, yy = y * y, zz = z * z, xy = x * y, yz = y * z, xz = x * z;
  float c2[5];
  for (int i = 0; i < 5; ++i) c2[i] = static_cast<float>(kC2[i]);
  basis[4] = c2[0] * xy;
  basis[5] = c2[1] * yz;
  basis[6] = c2[2] * (2.f * zz - xx - yy);
  basis[7] = c2[3] * xz;
  basis[8] = c2[4] * (xx - yy);
  if (grad) {
    const float g[15] = {c2[0] * y,        c2[0] * x,        0.f,           0.f,        c2[1] * z,
                         c2[1] * y,        -2.f * c2[2] * x, -2.f * c2[2] * y, 4.f * c2[2] * z, c2[3] * z,
                         0.f,              c2[3] * x,        2.f * c2[4] * x, -2.f * c2[4] * y, 0.f};
    std::copy(g, g + 15, grad + 12);
  }
  if (n <= 9) return;
  float c3[7];
  for (int i = 0; i < 7; ++i) c3[i] = static_cast<float>(kC3[i]);
  basis[9] = c3[0] * y * (3.f * xx - yy);
  basis[10] = c3[1] * xy * z;
  basis[11] = c3[2] * y * (4.f * zz - xx - yy);
  basis[12] = c3[3] * z * (2.f * zz - 3.f * xx - 3.f * yy);
  basis[13] = c3[4] * x * (4.f * zz - xx - yy);
  basis[14] = c3[5] * z * (xx - yy);
  basis[15] = c3[6] * x * (xx - 3.f * yy);
  if (grad) {
    const float g[21] = {
        c3[0] * 6.f * xy,   c3[0] * (3.f * xx - 3.f * yy),  0.f,
        c3[1] * yz,         c3[1] * xz,                     c3[1] * xy,
        c3[2] * -2.f * xy,  c3[2] * (4.f * zz - xx - 3.f * yy), c3[2] * 8.f * yz,
        c3[3] * -6.f * xz,  c3[3] * -6.f * yz,              c3[3] * (6.f * zz - 3.f * xx - 3.f * yy),
        c3[4] * (4.f * zz - 3.f * xx - yy), c3[4] * -2.f * xy, c3[4] * 8.f * xz,
        c3[5] * 2.f * xz,   c3[5] * -2.f * yz,              c3[5] * (xx - yy),
        c3[6] * (3.f * xx - 3.f * yy), c3[6] * -6.f * xy,  0.f};
    std::copy(g, g + 21, grad + 27);
  }
}

// Rotation matrix (row-major) of the quaternion (w, x, y, z) normalised as F.normalize does; returns its norm.
float quat_to_rotmat(const float* q, float* R, float* qn) {
  const float norm = std::max(std::sqrt(q[0] * q[0] + q[1] * q[1] + q[2] * q[2] + q[3] * q[3]), 1e-12f);
  for (int i = 0; i < 4; ++i) qn[i] = q[i] / norm;
  const float w = qn[0], x = qn[1], y = qn[2], z = qn[3];
  R[0] = 1.f - 2.f * (y * y + z * z);
  R[1] = 2.f * (x * y - w * z);
  R[2] = 2.f * (x * z + w * y);
  R[3] = 2.f * (x * y + w * z);
  R[4] = 1.f - 2.f * (x * x + z * z);
  R[5] = 2.f * (y * z - w * x);
  R[6] = 2.f * (x * z - w * y);
  R[7] = 2.f * (y * z + w * x);
  R[8] = 1.f - 2.f * (x * x + y * y);
  return norm;
}

struct Camera {
  float R[9], t[3], fx, fy, cx, cy, centre[3];
  float u_lo, u_hi, v_lo, v_hi;  // the clamp of x / z and y / z: 1.3x the half field of view
  Camera(const float* viewmat, const float* K, int64_t width, int64_t height) {
    for (int i = 0; i < 3; ++i) {
      for (int j = 0; j < 3; ++j) R[3 * i + j] = viewmat[4 * i + j];
      t[i] = viewmat[4 * i + 3];
    }
    fx = K[0];
    fy = K[4];
    cx = K[2];
    cy = K[5];
    for (int j = 0; j < 3; ++j) centre[j] = -(R[j] * t[0] + R[3 + j] * t[1] + R[6 + j] * t[2]);
    const float margin_x = 0.15f * width / fx, margin_y = 0.15f * height / fy;
    u_lo = -(cx / fx + margin_x);
    u_hi = (width - cx) / fx + margin_x;
    v_lo = -(cy / fy + margin_y);
    v_hi = (height - cy) / fy + margin_y;
  }
};

// What forward computes for one Gaussian in one camera, and backward needs again.
struct Projected {
  float pc[3];       // camera-space centre
  float u, v;        // x / z, y / z
  float uc, vc;      // clamped
  float jx[3], jy[3];  // rows of J R (world space)
  float M[9];        // covariance factor R(q) diag(s)
  float bx[3], by[3];  // M^T jx, M^T jy
  float raw_xx, raw_yy, cov_xy, cov_xx, cov_yy, det, det_orig;
  bool valid;
};

void project_one(const Camera& cam, const float* mean, const float* M, float near, float far, float eps2d,
                 Projected& P) {
  for (int i = 0; i < 3; ++i)
    P.pc[i] = cam.R[3 * i] * mean[0] + cam.R[3 * i + 1] * mean[1] + cam.R[3 * i + 2] * mean[2] + cam.t[i];
  const float z = P.pc[2];
  P.valid = z > near && z < far;
  if (!P.valid) return;
  P.u = P.pc[0] / z;
  P.v = P.pc[1] / z;
  P.uc = std::min(std::max(P.u, cam.u_lo), cam.u_hi);
  P.vc = std::min(std::max(P.v, cam.v_lo), cam.v_hi);
  for (int j = 0; j < 3; ++j) {
    P.jx[j] = cam.fx / z * (cam.R[j] - P.uc * cam.R[6 + j]);
    P.jy[j] = cam.fy / z * (cam.R[3 + j] - P.vc * cam.R[6 + j]);
  }
  for (int k = 0; k < 3; ++k) {
    P.bx[k] = P.jx[0] * M[k] + P.jx[1] * M[3 + k] + P.jx[2] * M[6 + k];
    P.by[k] = P.jy[0] * M[k] + P.jy[1] * M[3 + k] + P.jy[2] * M[6 + k];
  }
  P.raw_xx = P.bx[0] * P.bx[0] + P.bx[1] * P.bx[1] + P.bx[2] * P.bx[2];
  P.raw_yy = P.by[0] * P.by[0] + P.by[1] * P.by[1] + P.by[2] * P.by[2];
  P.cov_xy = P.bx[0] * P.by[0] + P.bx[1] * P.by[1] + P.bx[2] * P.by[2];
  P.cov_xx = P.raw_xx + eps2d;
  P.cov_yy = P.raw_yy + eps2d;
  P.det = P.cov_xx * P.cov_yy - P.cov_xy * P.cov_xy;
  P.det_orig = P.raw_xx * P.raw_yy - P.cov_xy * P.cov_xy;
  P.valid = P.det > 0.f;
}

float log_sigmoid(float x) { return x >= 0.f ? -std::log1p(std::exp(-x)) : x - std::log1p(std::exp(x)); }

void covariance_factor(const float* quat, const float* log_scale, float* M, float* R, float* qn, float* s,
                       float* qnorm) {
  *qnorm = quat_to_rotmat(quat, R, qn);
  for (int k = 0; k < 3; ++k) s[k] = std::exp(log_scale[k]);
  for (int j = 0; j < 3; ++j)
    for (int k = 0; k < 3; ++k) M[3 * j + k] = R[3 * j + k] * s[k];
}

// The SH coefficients are stored as sh0 [N, 1, 3] and the higher bands shN [N, S, 3] (the model's tensors, so that
// no [N, K, 3] copy is made each step): coefficient k of Gaussian g, its 3 channels.
struct ShCoeffs {
  float* sh0;
  float* shN;
  int64_t rest;  // S, the higher bands stored
  float* at(int64_t g, int64_t k) const { return k == 0 ? sh0 + 3 * g : shN + 3 * (g * rest + k - 1); }
};

}  // namespace

// Forward for C pinhole cameras: means2d [C, N, 2], conics [C, N, 3], depths [C, N], radii [C, N, 2] int32,
// log opacities [C, N] (with the antialiased compensation) and colours [C, N, 3].
std::vector<at::Tensor> project_forward(at::Tensor means, at::Tensor quats, at::Tensor log_scales,
                                        at::Tensor logits, at::Tensor sh0, at::Tensor shN,
                                        int64_t n_coeffs, at::Tensor viewmats, at::Tensor Ks,
                                        int64_t width, int64_t height, double near_plane, double far_plane,
                                        double eps2d_d, bool antialiased) {
  const int64_t n = means.size(0), n_cams = viewmats.size(0);
  auto opts = means.options();
  auto means2d = at::zeros({n_cams, n, 2}, opts);
  auto conics = at::zeros({n_cams, n, 3}, opts);
  auto depths = at::zeros({n_cams, n}, opts);
  auto radii = at::zeros({n_cams, n, 2}, opts.dtype(at::kInt));
  auto log_ops = at::zeros({n_cams, n}, opts);
  auto colors = at::zeros({n_cams, n, 3}, opts);
  const float *me = means.data_ptr<float>(), *qu = quats.data_ptr<float>(), *ls = log_scales.data_ptr<float>();
  const float* lg = logits.data_ptr<float>();
  const ShCoeffs sh{sh0.data_ptr<float>(), shN.data_ptr<float>(), shN.size(1)};
  std::vector<Camera> cams;
  for (int64_t c = 0; c < n_cams; ++c)
    cams.emplace_back(viewmats.data_ptr<float>() + 16 * c, Ks.data_ptr<float>() + 9 * c, width, height);
  float *m2 = means2d.data_ptr<float>(), *co = conics.data_ptr<float>(), *dp = depths.data_ptr<float>();
  float *lo = log_ops.data_ptr<float>(), *cl = colors.data_ptr<float>();
  int32_t* ra = radii.data_ptr<int32_t>();
  const float near = static_cast<float>(near_plane), far = static_cast<float>(far_plane);
  const float eps2d = static_cast<float>(eps2d_d);

#pragma omp parallel for schedule(static) num_threads(at::get_num_threads())
  for (int64_t g = 0; g < n; ++g) {
    float M[9], R[9], qn[4], s[3], qnorm, basis[16];
    covariance_factor(qu + 4 * g, ls + 3 * g, M, R, qn, s, &qnorm);
    const float log_op = log_sigmoid(lg[g]);
    for (int64_t c = 0; c < n_cams; ++c) {
      const Camera& cam = cams[c];
      const int64_t id = c * n + g;
      Projected P;
      project_one(cam, me + 3 * g, M, near, far, eps2d, P);
      dp[id] = P.pc[2];
      if (!P.valid) continue;
      float lop = log_op;
      if (antialiased) lop += 0.5f * (std::log(std::max(P.det_orig, kTiny)) - std::log(P.det));
      const float op = std::exp(lop);
      const float extent = std::min(kBboxSigmas, std::sqrt(2.f * std::max(std::log(op * 255.f), 0.f)));
      const float rx = std::ceil(extent * std::sqrt(P.cov_xx)), ry = std::ceil(extent * std::sqrt(P.cov_yy));
      const float px = cam.fx * P.u + cam.cx, py = cam.fy * P.v + cam.cy;
      const bool inside = px + rx > 0.f && px - rx < width && py + ry > 0.f && py - ry < height;
      if (!(inside && op >= kAlphaMin && (rx > 0.f || ry > 0.f))) continue;
      m2[2 * id] = px;
      m2[2 * id + 1] = py;
      co[3 * id] = P.cov_yy / P.det;
      co[3 * id + 1] = -P.cov_xy / P.det;
      co[3 * id + 2] = P.cov_xx / P.det;
      ra[2 * id] = static_cast<int32_t>(rx);
      ra[2 * id + 1] = static_cast<int32_t>(ry);
      lo[id] = lop;
      float d[3] = {me[3 * g] - cam.centre[0], me[3 * g + 1] - cam.centre[1], me[3 * g + 2] - cam.centre[2]};
      const float len = std::max(std::sqrt(d[0] * d[0] + d[1] * d[1] + d[2] * d[2]), 1e-12f);
      sh_basis(static_cast<int>(n_coeffs), d[0] / len, d[1] / len, d[2] / len, basis, nullptr);
      for (int ch = 0; ch < 3; ++ch) {
        float v = 0.f;
        for (int64_t k = 0; k < n_coeffs; ++k) v += basis[k] * sh.at(g, k)[ch];
        cl[3 * id + ch] = std::max(v + 0.5f, 0.f);
      }
    }
  }
  return {means2d, conics, depths, radii, log_ops, colors};
}

// Backward: from the gradients of means2d, conics, depths, log opacities and colours, those of means [N, 3],
// quats [N, 4], log scales [N, 3], opacity logits [N], sh0 [N, 1, 3], shN [N, S, 3] (zero beyond the first
// n_coeffs - 1 bands) and, with pose_grad, of the
// viewmats [C, 4, 4] (else [0, 4, 4]). Gaussians not visible in a camera (radii 0) take nothing from it.
std::vector<at::Tensor> project_backward(at::Tensor means, at::Tensor quats, at::Tensor log_scales,
                                         at::Tensor logits, at::Tensor sh0, at::Tensor shN,
                                         int64_t n_coeffs, at::Tensor viewmats, at::Tensor Ks,
                                         int64_t width, int64_t height, double near_plane, double far_plane,
                                         double eps2d_d, bool antialiased, at::Tensor radii, at::Tensor v_means2d,
                                         at::Tensor v_conics, at::Tensor v_depths, at::Tensor v_log_ops,
                                         at::Tensor v_colors, bool pose_grad) {
  const int64_t n = means.size(0), n_cams = viewmats.size(0);
  // With pose_grad, each (Gaussian, camera)'s gradient of the camera's R (9) and t (3) in its own row, summed in
  // Gaussian order at the end.
  std::vector<float> pose_rows(pose_grad ? n * n_cams * 12 : 0, 0.f);
  auto g_means = at::zeros_like(means);
  auto g_quats = at::zeros_like(quats);
  auto g_scales = at::zeros_like(log_scales);
  auto g_logits = at::zeros_like(logits);
  auto g_sh0 = at::zeros_like(sh0);
  auto g_shN = at::zeros_like(shN);
  const float *me = means.data_ptr<float>(), *qu = quats.data_ptr<float>(), *ls = log_scales.data_ptr<float>();
  const float* lg = logits.data_ptr<float>();
  const ShCoeffs sh{sh0.data_ptr<float>(), shN.data_ptr<float>(), shN.size(1)};
  const ShCoeffs gsh{g_sh0.data_ptr<float>(), g_shN.data_ptr<float>(), shN.size(1)};
  const int32_t* ra = radii.data_ptr<int32_t>();
  const float *vm2 = v_means2d.data_ptr<float>(), *vco = v_conics.data_ptr<float>();
  const float *vdp = v_depths.data_ptr<float>(), *vlo = v_log_ops.data_ptr<float>();
  const float* vcl = v_colors.data_ptr<float>();
  float *gm = g_means.data_ptr<float>(), *gq = g_quats.data_ptr<float>(), *gs = g_scales.data_ptr<float>();
  float* gl = g_logits.data_ptr<float>();
  std::vector<Camera> cams;
  for (int64_t c = 0; c < n_cams; ++c)
    cams.emplace_back(viewmats.data_ptr<float>() + 16 * c, Ks.data_ptr<float>() + 9 * c, width, height);
  const float near = static_cast<float>(near_plane), far = static_cast<float>(far_plane);
  const float eps2d = static_cast<float>(eps2d_d);

#pragma omp parallel for schedule(static) num_threads(at::get_num_threads())
  for (int64_t g = 0; g < n; ++g) {
    float M[9], R[9], qn[4], s[3], qnorm, basis[16], dbasis[48];
    float vM[9] = {0.f}, vmean[3] = {0.f}, vlogop = 0.f;
    bool seen = false;
    const float* mean = me + 3 * g;
    for (int64_t c = 0; c < n_cams; ++c) {
      const int64_t id = c * n + g;
      if (ra[2 * id] == 0 && ra[2 * id + 1] == 0) continue;
      if (!seen) {
        covariance_factor(qu + 4 * g, ls + 3 * g, M, R, qn, s, &qnorm);
        seen = true;
      }
      const Camera& cam = cams[c];
      Projected P;
      project_one(cam, mean, M, near, far, eps2d, P);
      const float z = P.pc[2];
      float vpc[3] = {0.f, 0.f, vdp[id]};  // d loss / d camera-space centre
      // Colour: max(SH . coeffs + 0.5, 0) along the unit direction from the camera centre.
      float d[3] = {mean[0] - cam.centre[0], mean[1] - cam.centre[1], mean[2] - cam.centre[2]};
      const float len = std::max(std::sqrt(d[0] * d[0] + d[1] * d[1] + d[2] * d[2]), 1e-12f);
      const float dir[3] = {d[0] / len, d[1] / len, d[2] / len};
      sh_basis(static_cast<int>(n_coeffs), dir[0], dir[1], dir[2], basis, dbasis);
      float vdir[3] = {0.f, 0.f, 0.f};
      for (int ch = 0; ch < 3; ++ch) {
        float v = 0.f;
        for (int64_t k = 0; k < n_coeffs; ++k) v += basis[k] * sh.at(g, k)[ch];
        if (v + 0.5f < 0.f) continue;
        const float vc = vcl[3 * id + ch];
        for (int64_t k = 0; k < n_coeffs; ++k) {
          gsh.at(g, k)[ch] += basis[k] * vc;
          const float coef = sh.at(g, k)[ch] * vc;
          for (int j = 0; j < 3; ++j) vdir[j] += coef * dbasis[3 * k + j];
        }
      }
      const float dot = vdir[0] * dir[0] + vdir[1] * dir[1] + vdir[2] * dir[2];
      float vd[3];  // d loss / d (mean - camera centre)
      for (int j = 0; j < 3; ++j) {
        vd[j] = (vdir[j] - dir[j] * dot) / len;
        vmean[j] += vd[j];
      }
      // Opacity (and the antialiased compensation's determinants).
      const float vlop = vlo[id];
      vlogop += vlop;
      float v_det = 0.f, v_det_orig = 0.f;
      if (antialiased) {
        v_det = -0.5f * vlop / P.det;
        if (P.det_orig >= kTiny) v_det_orig = 0.5f * vlop / P.det_orig;
      }
      // Conic (cov_yy, -cov_xy, cov_xx) / det.
      const float va = vco[3 * id], vb = vco[3 * id + 1], vc = vco[3 * id + 2];
      const float inv = 1.f / P.det;
      v_det += -(va * P.cov_yy - vb * P.cov_xy + vc * P.cov_xx) * inv * inv;
      const float v_xx = vc * inv + v_det * P.cov_yy + v_det_orig * P.raw_yy;
      const float v_yy = va * inv + v_det * P.cov_xx + v_det_orig * P.raw_xx;
      const float v_xy = -vb * inv - 2.f * P.cov_xy * (v_det + v_det_orig);
      float vbx[3], vby[3];
      for (int k = 0; k < 3; ++k) {
        vbx[k] = 2.f * v_xx * P.bx[k] + v_xy * P.by[k];
        vby[k] = 2.f * v_yy * P.by[k] + v_xy * P.bx[k];
      }
      float vjx[3], vjy[3];
      for (int j = 0; j < 3; ++j) {
        vjx[j] = vbx[0] * M[3 * j] + vbx[1] * M[3 * j + 1] + vbx[2] * M[3 * j + 2];
        vjy[j] = vby[0] * M[3 * j] + vby[1] * M[3 * j + 1] + vby[2] * M[3 * j + 2];
        for (int k = 0; k < 3; ++k) vM[3 * j + k] += P.jx[j] * vbx[k] + P.jy[j] * vby[k];
      }
      if (pose_grad) {
        // The rows of J R hold R itself; the camera centre is -R^T t.
        float* row = pose_rows.data() + (g * n_cams + c) * 12;
        for (int j = 0; j < 3; ++j) {
          row[j] += cam.fx / z * vjx[j];
          row[3 + j] += cam.fy / z * vjy[j];
          row[6 + j] -= cam.fx / z * P.uc * vjx[j] + cam.fy / z * P.vc * vjy[j];
          for (int i = 0; i < 3; ++i) {
            row[3 * i + j] += vd[j] * cam.t[i];
            row[9 + i] += cam.R[3 * i + j] * vd[j];
          }
        }
      }
      // J R rows: (f / z) (R_row - clamped ratio R_2).
      float vuc = 0.f, vvc = 0.f;
      for (int j = 0; j < 3; ++j) {
        vpc[2] -= (vjx[j] * P.jx[j] + vjy[j] * P.jy[j]) / z;
        vuc -= cam.fx / z * vjx[j] * cam.R[6 + j];
        vvc -= cam.fy / z * vjy[j] * cam.R[6 + j];
      }
      if (P.u >= cam.u_lo && P.u <= cam.u_hi) {
        vpc[0] += vuc / z;
        vpc[2] -= vuc * P.u / z;
      }
      if (P.v >= cam.v_lo && P.v <= cam.v_hi) {
        vpc[1] += vvc / z;
        vpc[2] -= vvc * P.v / z;
      }
      // Centre: (fx x / z + cx, fy y / z + cy).
      const float vpx = vm2[2 * id], vpy = vm2[2 * id + 1];
      vpc[0] += cam.fx * vpx / z;
      vpc[1] += cam.fy * vpy / z;
      vpc[2] -= (cam.fx * P.u * vpx + cam.fy * P.v * vpy) / z;
      for (int j = 0; j < 3; ++j) vmean[j] += cam.R[j] * vpc[0] + cam.R[3 + j] * vpc[1] + cam.R[6 + j] * vpc[2];
      if (pose_grad) {  // camera-space centre R mean + t
        float* row = pose_rows.data() + (g * n_cams + c) * 12;
        for (int i = 0; i < 3; ++i) {
          for (int j = 0; j < 3; ++j) row[3 * i + j] += vpc[i] * mean[j];
          row[9 + i] += vpc[i];
        }
      }
    }
    if (!seen) continue;
    for (int j = 0; j < 3; ++j) gm[3 * g + j] = vmean[j];
    gl[g] = vlogop / (1.f + std::exp(lg[g]));  // d logsigmoid(x) / dx = sigmoid(-x)
    // M = R(q) diag(s)
    float V[9];
    for (int k = 0; k < 3; ++k) {
      float vs = 0.f;
      for (int j = 0; j < 3; ++j) {
        vs += vM[3 * j + k] * R[3 * j + k];
        V[3 * j + k] = vM[3 * j + k] * s[k];
      }
      gs[3 * g + k] = vs * s[k];
    }
    const float w = qn[0], x = qn[1], y = qn[2], zq = qn[3];
    const float vqn[4] = {
        2.f * (-zq * V[1] + y * V[2] + zq * V[3] - x * V[5] - y * V[6] + x * V[7]),
        2.f * (y * V[1] + zq * V[2] + y * V[3] - 2.f * x * V[4] - w * V[5] + zq * V[6] + w * V[7] - 2.f * x * V[8]),
        2.f * (-2.f * y * V[0] + x * V[1] + w * V[2] + x * V[3] + zq * V[5] - w * V[6] + zq * V[7] - 2.f * y * V[8]),
        2.f * (-2.f * zq * V[0] - w * V[1] + x * V[2] + w * V[3] - 2.f * zq * V[4] + y * V[5] + x * V[6] + y * V[7])};
    const float qdot = vqn[0] * qn[0] + vqn[1] * qn[1] + vqn[2] * qn[2] + vqn[3] * qn[3];
    for (int i = 0; i < 4; ++i) gq[4 * g + i] = (vqn[i] - qn[i] * qdot) / qnorm;
  }
  auto g_viewmats = at::zeros({pose_grad ? n_cams : 0, 4, 4}, means.options());
  if (pose_grad) {
    float* gv = g_viewmats.data_ptr<float>();
#pragma omp parallel for schedule(static) num_threads(at::get_num_threads())
    for (int64_t c = 0; c < n_cams; ++c) {
      float sum[12] = {0.f};
      for (int64_t g = 0; g < n; ++g) {
        const float* row = pose_rows.data() + (g * n_cams + c) * 12;
        for (int e = 0; e < 12; ++e) sum[e] += row[e];
      }
      for (int i = 0; i < 3; ++i) {
        for (int j = 0; j < 3; ++j) gv[16 * c + 4 * i + j] = sum[3 * i + j];
        gv[16 * c + 4 * i + 3] = sum[9 + i];
      }
    }
  }
  return {g_means, g_quats, g_scales, g_logits, g_sh0, g_shN, g_viewmats};
}
