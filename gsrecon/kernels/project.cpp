// EWA projection of 3D Gaussians into pinhole cameras and their spherical-harmonics colours on the CPU, forward
// and backward, with the conventions of gsrecon's torch renderer (gsrecon/render/torch_renderer.py,
// project_gaussians and shade_gaussians). Backward is the forward's steps in reverse, one vector-Jacobian product
// (`*_vjp`) per step. Gaussians are handed to OpenMP threads; each Gaussian's gradient sums its cameras in order,
// so results do not depend on the thread count.

// ATen's headers, not <torch/extension.h>: that one (pybind11, the C++ frontend) makes this file's build 4x
// slower; only bindings.cpp needs it.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/zeros.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels.h"

namespace gsrecon {
namespace {

constexpr double kC0 = 0.28209479177387814;
constexpr double kC1 = 0.4886025119029199;
constexpr double kC2[5] = {1.0925484305920792, -1.0925484305920792, 0.31539156525252005, -1.0925484305920792,
                           0.5462742152960396};
constexpr double kC3[7] = {-0.5900435899266435, 2.890611442640554,  -0.4570457994644658, 0.3731763325901154,
                           -0.4570457994644658, 1.445305721320277, -0.5900435899266435};

// The first n (<= kMaxShCoeffs) SH basis functions at the unit direction (x, y, z), and with grad != nullptr their
// derivatives d basis_k / d (x, y, z) in grad[3 k .. 3 k + 2] (the polynomials of gsrecon.sh.sh_basis, derived
// term by term). Out of line: one compiled body for forward and backward (inlined or cloned where grad is null, its
// products contract into FMAs differently and the colours move by an ulp).
__attribute__((noinline, noclone)) void sh_basis(int n, float x, float y, float z, float* basis, float* grad) {
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

// One pinhole camera, read from its viewmat [4, 4] and K [3, 3].
struct Camera {
  float R[9], t[3], fx, fy, cx, cy, centre[3];
  float u_lo, u_hi, v_lo, v_hi;  // the clamp of x / z and y / z: the image's extent plus kClampMargin of its size
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
    const float margin_x = kClampMargin * width / fx, margin_y = kClampMargin * height / fy;
    u_lo = -(cx / fx + margin_x);
    u_hi = (width - cx) / fx + margin_x;
    v_lo = -(cy / fy + margin_y);
    v_hi = (height - cy) / fy + margin_y;
  }
};

std::vector<Camera> read_cameras(const PinholeCameras& cameras) {
  std::vector<Camera> out;
  const float *viewmats = cameras.viewmats.data_ptr<float>(), *Ks = cameras.Ks.data_ptr<float>();
  for (int64_t c = 0; c < cameras.viewmats.size(0); ++c)
    out.emplace_back(viewmats + 16 * c, Ks + 9 * c, cameras.width, cameras.height);
  return out;
}

// A Gaussian's covariance factor M = R(q) diag(s), Sigma = M M^T, and what its backward needs again.
struct Shape {
  float q_unit[4], q_norm;  // the quaternion normalised as F.normalize does, and its norm
  float R[9];               // R(q), row-major
  float scale[3];           // exp(log_scales)
  float M[9];               // R diag(scale), row-major
};

void shape_of(const float* quat, const float* log_scale, Shape& S) {
  S.q_norm = std::max(std::sqrt(quat[0] * quat[0] + quat[1] * quat[1] + quat[2] * quat[2] + quat[3] * quat[3]),
                      1e-12f);
  for (int i = 0; i < 4; ++i) S.q_unit[i] = quat[i] / S.q_norm;
  const float w = S.q_unit[0], x = S.q_unit[1], y = S.q_unit[2], z = S.q_unit[3];
  float* R = S.R;
  R[0] = 1.f - 2.f * (y * y + z * z);
  R[1] = 2.f * (x * y - w * z);
  R[2] = 2.f * (x * z + w * y);
  R[3] = 2.f * (x * y + w * z);
  R[4] = 1.f - 2.f * (x * x + z * z);
  R[5] = 2.f * (y * z - w * x);
  R[6] = 2.f * (x * z - w * y);
  R[7] = 2.f * (y * z + w * x);
  R[8] = 1.f - 2.f * (x * x + y * y);
  for (int k = 0; k < 3; ++k) S.scale[k] = std::exp(log_scale[k]);
  for (int j = 0; j < 3; ++j)
    for (int k = 0; k < 3; ++k) S.M[3 * j + k] = R[3 * j + k] * S.scale[k];
}

// What the projection of one Gaussian into one camera computes, and backward needs again.
struct Projected {
  float centre_cam[3];         // R mean + t
  float u, v;                  // x / z, y / z
  float u_clamped, v_clamped;  // clamped to the camera's u_lo..u_hi, v_lo..v_hi
  float jr_x[3], jr_y[3];      // rows of J R: d pixel / d world position
  float b_x[3], b_y[3];        // M^T jr_x, M^T jr_y: the 2D covariance is b b^T
  float raw_xx, raw_yy;        // its diagonal before the dilation
  float cov_xx, cov_xy, cov_yy;  // after: + eps2d on the diagonal
  float det, det_raw;          // determinants after and before the dilation
  bool valid;                  // in (near, far) and det > 0
};

void project_one(const Camera& cam, const float* mean, const float* M, float near, float far, float eps2d,
                 Projected& P) {
  for (int i = 0; i < 3; ++i)
    P.centre_cam[i] = cam.R[3 * i] * mean[0] + cam.R[3 * i + 1] * mean[1] + cam.R[3 * i + 2] * mean[2] + cam.t[i];
  const float z = P.centre_cam[2];
  P.valid = z > near && z < far;
  if (!P.valid) return;
  P.u = P.centre_cam[0] / z;
  P.v = P.centre_cam[1] / z;
  P.u_clamped = std::min(std::max(P.u, cam.u_lo), cam.u_hi);
  P.v_clamped = std::min(std::max(P.v, cam.v_lo), cam.v_hi);
  for (int j = 0; j < 3; ++j) {
    P.jr_x[j] = cam.fx / z * (cam.R[j] - P.u_clamped * cam.R[6 + j]);
    P.jr_y[j] = cam.fy / z * (cam.R[3 + j] - P.v_clamped * cam.R[6 + j]);
  }
  for (int k = 0; k < 3; ++k) {
    P.b_x[k] = P.jr_x[0] * M[k] + P.jr_x[1] * M[3 + k] + P.jr_x[2] * M[6 + k];
    P.b_y[k] = P.jr_y[0] * M[k] + P.jr_y[1] * M[3 + k] + P.jr_y[2] * M[6 + k];
  }
  P.raw_xx = P.b_x[0] * P.b_x[0] + P.b_x[1] * P.b_x[1] + P.b_x[2] * P.b_x[2];
  P.raw_yy = P.b_y[0] * P.b_y[0] + P.b_y[1] * P.b_y[1] + P.b_y[2] * P.b_y[2];
  P.cov_xy = P.b_x[0] * P.b_y[0] + P.b_x[1] * P.b_y[1] + P.b_x[2] * P.b_y[2];
  P.cov_xx = P.raw_xx + eps2d;
  P.cov_yy = P.raw_yy + eps2d;
  P.det = P.cov_xx * P.cov_yy - P.cov_xy * P.cov_xy;
  P.det_raw = P.raw_xx * P.raw_yy - P.cov_xy * P.cov_xy;
  P.valid = P.det > 0.f;
}

float log_sigmoid(float x) { return x >= 0.f ? -std::log1p(std::exp(-x)) : x - std::log1p(std::exp(x)); }

// Coefficient k of Gaussian g (its 3 channels), stored as sh0 [N, 1, 3] and the higher bands shN [N, S, 3].
struct ShCoeffs {
  float* sh0;
  float* shN;
  int64_t rest;  // S
  float* at(int64_t g, int64_t k) const { return k == 0 ? sh0 + 3 * g : shN + 3 * (g * rest + k - 1); }
};

// The unit direction from the camera centre to the mean, and its length.
float view_direction(const Camera& cam, const float* mean, float* dir) {
  const float d[3] = {mean[0] - cam.centre[0], mean[1] - cam.centre[1], mean[2] - cam.centre[2]};
  const float len = std::max(std::sqrt(d[0] * d[0] + d[1] * d[1] + d[2] * d[2]), 1e-12f);
  for (int j = 0; j < 3; ++j) dir[j] = d[j] / len;
  return len;
}

// ---- Backward: one vector-Jacobian product per forward step, in reverse order. ----

// SH colour max(sum_k basis_k(dir) c_k + 0.5, 0), dir = d / |d|, d = mean - camera centre: adds the coefficients'
// gradient to `v_coeffs` and returns d loss / d d in v_offset. Closed form: the basis' polynomial derivatives
// (sh_basis), then the normalisation's (I - dir dir^T) / |d|.
void sh_color_vjp(int n_coeffs, const ShCoeffs& coeffs, const ShCoeffs& v_coeffs, int64_t g, const float* dir,
                  float len, const float* v_color, float* v_offset) {
  float basis[kMaxShCoeffs], dbasis[3 * kMaxShCoeffs];
  sh_basis(n_coeffs, dir[0], dir[1], dir[2], basis, dbasis);
  float v_dir[3] = {0.f, 0.f, 0.f};
  for (int ch = 0; ch < 3; ++ch) {
    float value = 0.f;
    for (int k = 0; k < n_coeffs; ++k) value += basis[k] * coeffs.at(g, k)[ch];
    if (value + 0.5f < 0.f) continue;  // clamped at 0: no gradient
    for (int k = 0; k < n_coeffs; ++k) {
      v_coeffs.at(g, k)[ch] += basis[k] * v_color[ch];
      const float weight = coeffs.at(g, k)[ch] * v_color[ch];
      for (int j = 0; j < 3; ++j) v_dir[j] += weight * dbasis[3 * k + j];
    }
  }
  const float along = v_dir[0] * dir[0] + v_dir[1] * dir[1] + v_dir[2] * dir[2];
  for (int j = 0; j < 3; ++j) v_offset[j] = (v_dir[j] - dir[j] * along) / len;
}

// conic = (cov_yy, -cov_xy, cov_xx) / det and, antialiased, log opacity += (ln det_raw - ln det) / 2: the gradient of
// the dilated covariance's entries (xx, xy, yy; xy counted once). Closed form: d (A^-1) = -A^-1 dA A^-1, written
// through the adjugate and d det = cov_yy d cov_xx + cov_xx d cov_yy - 2 cov_xy d cov_xy.
void conic_vjp(const Projected& P, const float* v_conic, float v_log_opacity, bool antialiased, float* v_cov) {
  float v_det = 0.f, v_det_raw = 0.f;
  if (antialiased) {
    v_det = -0.5f * v_log_opacity / P.det;
    if (P.det_raw >= kTinyDeterminant) v_det_raw = 0.5f * v_log_opacity / P.det_raw;
  }
  const float va = v_conic[0], vb = v_conic[1], vc = v_conic[2];
  const float inv = 1.f / P.det;
  v_det += -(va * P.cov_yy - vb * P.cov_xy + vc * P.cov_xx) * inv * inv;
  v_cov[0] = vc * inv + v_det * P.cov_yy + v_det_raw * P.raw_yy;
  v_cov[1] = -vb * inv - 2.f * P.cov_xy * (v_det + v_det_raw);
  v_cov[2] = va * inv + v_det * P.cov_xx + v_det_raw * P.raw_xx;
}

// cov2d = B B^T with the rows b_x, b_y of B = (J R) M: adds M's gradient to v_M and returns those of the rows of J R.
// Closed form: d (B B^T) = dB B^T + B dB^T, then the product rule of B = (J R) M.
void covariance2d_vjp(const Projected& P, const float* M, const float* v_cov, float* v_M, float* v_jr_x,
                      float* v_jr_y) {
  float v_bx[3], v_by[3];
  for (int k = 0; k < 3; ++k) {
    v_bx[k] = 2.f * v_cov[0] * P.b_x[k] + v_cov[1] * P.b_y[k];
    v_by[k] = 2.f * v_cov[2] * P.b_y[k] + v_cov[1] * P.b_x[k];
  }
  for (int j = 0; j < 3; ++j) {
    v_jr_x[j] = v_bx[0] * M[3 * j] + v_bx[1] * M[3 * j + 1] + v_bx[2] * M[3 * j + 2];
    v_jr_y[j] = v_by[0] * M[3 * j] + v_by[1] * M[3 * j + 1] + v_by[2] * M[3 * j + 2];
    for (int k = 0; k < 3; ++k) v_M[3 * j + k] += P.jr_x[j] * v_bx[k] + P.jr_y[j] * v_by[k];
  }
}

// The rows of J R, (fx / z) (R_0 - u_c R_2) and (fy / z) (R_1 - v_c R_2), with u_c = clamp(x / z) and v_c likewise:
// adds the gradient of the camera-space centre (x, y, z) to v_centre (none through a clamped ratio).
void pinhole_jacobian_vjp(const Camera& cam, const Projected& P, const float* v_jr_x, const float* v_jr_y,
                          float* v_centre) {
  const float z = P.centre_cam[2];
  float v_u = 0.f, v_v = 0.f;
  for (int j = 0; j < 3; ++j) {
    v_centre[2] -= (v_jr_x[j] * P.jr_x[j] + v_jr_y[j] * P.jr_y[j]) / z;
    v_u -= cam.fx / z * v_jr_x[j] * cam.R[6 + j];
    v_v -= cam.fy / z * v_jr_y[j] * cam.R[6 + j];
  }
  if (P.u >= cam.u_lo && P.u <= cam.u_hi) {
    v_centre[0] += v_u / z;
    v_centre[2] -= v_u * P.u / z;
  }
  if (P.v >= cam.v_lo && P.v <= cam.v_hi) {
    v_centre[1] += v_v / z;
    v_centre[2] -= v_v * P.v / z;
  }
}

// means2d = (fx x / z + cx, fy y / z + cy): adds the gradient of the camera-space centre to v_centre.
void pinhole_centre_vjp(const Camera& cam, const Projected& P, const float* v_means2d, float* v_centre) {
  const float z = P.centre_cam[2];
  v_centre[0] += cam.fx * v_means2d[0] / z;
  v_centre[1] += cam.fy * v_means2d[1] / z;
  v_centre[2] -= (cam.fx * P.u * v_means2d[0] + cam.fy * P.v * v_means2d[1]) / z;
}

// The pose's share: the camera-space centre R mean + t, the rows of J R (which hold R), and the camera centre
// -R^T t of the colour's direction; adds d loss / d (R, t) to pose_row (R row-major in 0..8, t in 9..11).
void pose_vjp(const Camera& cam, const Projected& P, const float* mean, const float* v_centre, const float* v_jr_x,
              const float* v_jr_y, const float* v_offset, float* pose_row) {
  const float z = P.centre_cam[2];
  for (int j = 0; j < 3; ++j) {
    pose_row[j] += cam.fx / z * v_jr_x[j];
    pose_row[3 + j] += cam.fy / z * v_jr_y[j];
    pose_row[6 + j] -= cam.fx / z * P.u_clamped * v_jr_x[j] + cam.fy / z * P.v_clamped * v_jr_y[j];
    for (int i = 0; i < 3; ++i) {
      pose_row[3 * i + j] += v_offset[j] * cam.t[i];
      pose_row[9 + i] += cam.R[3 * i + j] * v_offset[j];
    }
  }
  for (int i = 0; i < 3; ++i) {
    for (int j = 0; j < 3; ++j) pose_row[3 * i + j] += v_centre[i] * mean[j];
    pose_row[9 + i] += v_centre[i];
  }
}

// M = R(q / |q|) diag(exp(log_scales)): the gradients of the log scales and of the quaternion. Closed form: the
// derivative of each entry of the rotation matrix of a unit quaternion (the matrix in shape_of, entry by entry),
// then the normalisation's (I - q q^T) / |q|.
void scale_rotation_vjp(const Shape& S, const float* v_M, float* v_log_scale, float* v_quat) {
  float v_R[9];
  for (int k = 0; k < 3; ++k) {
    float v_scale = 0.f;
    for (int j = 0; j < 3; ++j) {
      v_scale += v_M[3 * j + k] * S.R[3 * j + k];
      v_R[3 * j + k] = v_M[3 * j + k] * S.scale[k];
    }
    v_log_scale[k] = v_scale * S.scale[k];
  }
  const float w = S.q_unit[0], x = S.q_unit[1], y = S.q_unit[2], z = S.q_unit[3];
  const float* V = v_R;
  const float v_unit[4] = {
      2.f * (-z * V[1] + y * V[2] + z * V[3] - x * V[5] - y * V[6] + x * V[7]),
      2.f * (y * V[1] + z * V[2] + y * V[3] - 2.f * x * V[4] - w * V[5] + z * V[6] + w * V[7] - 2.f * x * V[8]),
      2.f * (-2.f * y * V[0] + x * V[1] + w * V[2] + x * V[3] + z * V[5] - w * V[6] + z * V[7] - 2.f * y * V[8]),
      2.f * (-2.f * z * V[0] - w * V[1] + x * V[2] + w * V[3] - 2.f * z * V[4] + y * V[5] + x * V[6] + y * V[7])};
  const float along = v_unit[0] * w + v_unit[1] * x + v_unit[2] * y + v_unit[3] * z;
  for (int i = 0; i < 4; ++i) v_quat[i] = (v_unit[i] - S.q_unit[i] * along) / S.q_norm;
}

void check_inputs(const Gaussians& gs, const PinholeCameras& cams, const ProjectSettings& settings) {
  const int64_t n = gs.means.size(0), c = cams.viewmats.size(0);
  check_tensor(gs.means, "means", at::kFloat, {-1, 3});
  check_tensor(gs.quats, "quats", at::kFloat, {n, 4});
  check_tensor(gs.log_scales, "log_scales", at::kFloat, {n, 3});
  check_tensor(gs.logits, "logits", at::kFloat, {n});
  check_tensor(gs.sh0, "sh0", at::kFloat, {n, 1, 3});
  check_tensor(gs.shN, "shN", at::kFloat, {n, -1, 3});
  check_tensor(cams.viewmats, "viewmats", at::kFloat, {-1, 4, 4});
  check_tensor(cams.Ks, "Ks", at::kFloat, {c, 3, 3});
  TORCH_CHECK_VALUE(cams.width > 0 && cams.height > 0, "kernel arguments width=", cams.width, ", height=",
                    cams.height, ": must be positive");
  const int64_t degree = settings.sh_degree;
  TORCH_CHECK_VALUE(degree >= 0 && degree <= kMaxShDegree, "kernel argument sh_degree=", degree, " is not in 0..",
                    kMaxShDegree);
  TORCH_CHECK_VALUE(gs.shN.size(1) >= (degree + 1) * (degree + 1) - 1, "kernel argument 'shN' holds ",
                    gs.shN.size(1), " higher coefficients per channel, fewer than SH degree ", degree, " needs");
}

}  // namespace

Projection project_forward(const Gaussians& gs, const PinholeCameras& cameras, const ProjectSettings& settings) {
  check_inputs(gs, cameras, settings);
  const int64_t n = gs.means.size(0), n_cams = cameras.viewmats.size(0);
  const int n_coeffs = static_cast<int>((settings.sh_degree + 1) * (settings.sh_degree + 1));
  const auto opts = gs.means.options();
  // Every entry is written below (zeros where a Gaussian is not visible): no serial zeroing pass first.
  Projection out{empty_large({n_cams, n, 2}, opts), empty_large({n_cams, n, 3}, opts),
                 empty_large({n_cams, n}, opts),      empty_large({n_cams, n, 2}, opts.dtype(at::kInt)),
                 empty_large({n_cams, n}, opts),      empty_large({n_cams, n, 3}, opts)};
  const float *means = gs.means.data_ptr<float>(), *quats = gs.quats.data_ptr<float>();
  const float *log_scales = gs.log_scales.data_ptr<float>(), *logits = gs.logits.data_ptr<float>();
  const ShCoeffs coeffs{gs.sh0.data_ptr<float>(), gs.shN.data_ptr<float>(), gs.shN.size(1)};
  const std::vector<Camera> cams = read_cameras(cameras);
  float *means2d = out.means2d.data_ptr<float>(), *conics = out.conics.data_ptr<float>();
  float *depths = out.depths.data_ptr<float>(), *log_ops = out.log_opacities.data_ptr<float>();
  float* colors = out.colors.data_ptr<float>();
  int32_t* radii = out.radii.data_ptr<int32_t>();
  const float near = static_cast<float>(settings.near_plane), far = static_cast<float>(settings.far_plane);
  const float eps2d = static_cast<float>(settings.eps2d);
  const float width = static_cast<float>(cameras.width), height = static_cast<float>(cameras.height);

  // Equal static shares: chunks handed out dynamically measured slower (both threads fault in the same huge pages of
  // the outputs; 66 against 56 ms at 1M Gaussians on two threads), though a culled Gaussian costs less.
#pragma omp parallel for schedule(static) num_threads(at::get_num_threads())
  for (int64_t g = 0; g < n; ++g) {
    Shape S;
    shape_of(quats + 4 * g, log_scales + 3 * g, S);
    const float log_op_model = log_sigmoid(logits[g]);
    const float* mean = means + 3 * g;
    for (int64_t c = 0; c < n_cams; ++c) {
      const Camera& cam = cams[c];
      const int64_t id = c * n + g;
      Projected P;
      project_one(cam, mean, S.M, near, far, eps2d, P);
      depths[id] = P.centre_cam[2];
      auto hide = [&] {
        std::fill(means2d + 2 * id, means2d + 2 * id + 2, 0.f);
        std::fill(conics + 3 * id, conics + 3 * id + 3, 0.f);
        std::fill(radii + 2 * id, radii + 2 * id + 2, 0);
        log_ops[id] = 0.f;
        std::fill(colors + 3 * id, colors + 3 * id + 3, 0.f);
      };
      if (!P.valid) {
        hide();
        continue;
      }
      float log_op = log_op_model;
      if (settings.antialiased)
        log_op += 0.5f * (std::log(std::max(P.det_raw, kTinyDeterminant)) - std::log(P.det));
      const float opacity = std::exp(log_op);
      // Opacity-aware extent (gsplat 1.5): the box holds every pixel where alpha reaches 1/255. It needs no gradient
      // of its own in the opacity: a pixel outside it fails the compositing's alpha >= 1/255 test, the same test.
      const float extent = std::min(kBboxSigmas, std::sqrt(2.f * std::max(std::log(opacity * 255.f), 0.f)));
      const float rx = std::ceil(extent * std::sqrt(P.cov_xx)), ry = std::ceil(extent * std::sqrt(P.cov_yy));
      const float px = cam.fx * P.u + cam.cx, py = cam.fy * P.v + cam.cy;
      const bool inside = px + rx > 0.f && px - rx < width && py + ry > 0.f && py - ry < height;
      if (!(inside && opacity >= kAlphaMin && (rx > 0.f || ry > 0.f))) {
        hide();
        continue;
      }
      means2d[2 * id] = px;
      means2d[2 * id + 1] = py;
      conics[3 * id] = P.cov_yy / P.det;
      conics[3 * id + 1] = -P.cov_xy / P.det;
      conics[3 * id + 2] = P.cov_xx / P.det;
      radii[2 * id] = static_cast<int32_t>(rx);
      radii[2 * id + 1] = static_cast<int32_t>(ry);
      log_ops[id] = log_op;
      float dir[3], basis[kMaxShCoeffs];
      view_direction(cam, mean, dir);
      sh_basis(n_coeffs, dir[0], dir[1], dir[2], basis, nullptr);
      for (int ch = 0; ch < 3; ++ch) {
        float value = 0.f;
        for (int k = 0; k < n_coeffs; ++k) value += basis[k] * coeffs.at(g, k)[ch];
        colors[3 * id + ch] = std::max(value + 0.5f, 0.f);
      }
    }
  }
  return out;
}

GaussianGrads project_backward(const Gaussians& gs, const PinholeCameras& cameras, const ProjectSettings& settings,
                               const at::Tensor& radii_t, const Projection& grads, bool pose_grad) {
  check_inputs(gs, cameras, settings);
  const int64_t n = gs.means.size(0), n_cams = cameras.viewmats.size(0);
  check_tensor(radii_t, "radii", at::kInt, {n_cams, n, 2});
  check_tensor(grads.means2d, "v_means2d", at::kFloat, {n_cams, n, 2});
  check_tensor(grads.conics, "v_conics", at::kFloat, {n_cams, n, 3});
  check_tensor(grads.depths, "v_depths", at::kFloat, {n_cams, n});
  check_tensor(grads.log_opacities, "v_log_opacities", at::kFloat, {n_cams, n});
  check_tensor(grads.colors, "v_colors", at::kFloat, {n_cams, n, 3});
  const int n_coeffs = static_cast<int>((settings.sh_degree + 1) * (settings.sh_degree + 1));
  // With pose_grad, each (Gaussian, camera)'s gradient of the camera's R (9) and t (3) in its own row, summed in
  // Gaussian order at the end.
  std::vector<float> pose_rows(pose_grad ? n * n_cams * 12 : 0, 0.f);
  // Every row is written below (zeros where a Gaussian is seen by no camera): no zeroing pass first.
  auto like = [](const at::Tensor& t) { return empty_large(t.sizes(), t.options()); };
  GaussianGrads out{like(gs.means),  like(gs.quats), like(gs.log_scales),
                    like(gs.logits), like(gs.sh0),   like(gs.shN),
                    at::zeros({pose_grad ? n_cams : 0, 4, 4}, gs.means.options())};
  const float *means = gs.means.data_ptr<float>(), *quats = gs.quats.data_ptr<float>();
  const float *log_scales = gs.log_scales.data_ptr<float>(), *logits = gs.logits.data_ptr<float>();
  const ShCoeffs coeffs{gs.sh0.data_ptr<float>(), gs.shN.data_ptr<float>(), gs.shN.size(1)};
  const ShCoeffs v_coeffs{out.sh0.data_ptr<float>(), out.shN.data_ptr<float>(), gs.shN.size(1)};
  const int32_t* radii = radii_t.data_ptr<int32_t>();
  const float *v_means2d = grads.means2d.data_ptr<float>(), *v_conics = grads.conics.data_ptr<float>();
  const float *v_depths = grads.depths.data_ptr<float>(), *v_log_ops = grads.log_opacities.data_ptr<float>();
  const float* v_colors = grads.colors.data_ptr<float>();
  float *v_means = out.means.data_ptr<float>(), *v_quats = out.quats.data_ptr<float>();
  float *v_log_scales = out.log_scales.data_ptr<float>(), *v_logits = out.logits.data_ptr<float>();
  const std::vector<Camera> cams = read_cameras(cameras);
  const float near = static_cast<float>(settings.near_plane), far = static_cast<float>(settings.far_plane);
  const float eps2d = static_cast<float>(settings.eps2d);

#pragma omp parallel for schedule(static) num_threads(at::get_num_threads())
  for (int64_t g = 0; g < n; ++g) {
    Shape S;
    float v_M[9] = {0.f}, v_mean[3] = {0.f}, v_log_op = 0.f;
    bool seen = false;
    const float* mean = means + 3 * g;
    std::fill(v_coeffs.at(g, 0), v_coeffs.at(g, 0) + 3, 0.f);  // sh_color_vjp adds into them
    std::fill(v_coeffs.shN + 3 * g * v_coeffs.rest, v_coeffs.shN + 3 * (g + 1) * v_coeffs.rest, 0.f);
    for (int64_t c = 0; c < n_cams; ++c) {
      const int64_t id = c * n + g;
      if (radii[2 * id] == 0 && radii[2 * id + 1] == 0) continue;
      if (!seen) {
        shape_of(quats + 4 * g, log_scales + 3 * g, S);
        seen = true;
      }
      const Camera& cam = cams[c];
      Projected P;
      project_one(cam, mean, S.M, near, far, eps2d, P);
      float dir[3], v_offset[3];
      const float len = view_direction(cam, mean, dir);
      sh_color_vjp(n_coeffs, coeffs, v_coeffs, g, dir, len, v_colors + 3 * id, v_offset);
      v_log_op += v_log_ops[id];
      float v_cov[3], v_jr_x[3], v_jr_y[3];
      conic_vjp(P, v_conics + 3 * id, v_log_ops[id], settings.antialiased, v_cov);
      covariance2d_vjp(P, S.M, v_cov, v_M, v_jr_x, v_jr_y);
      float v_centre[3] = {0.f, 0.f, v_depths[id]};  // d loss / d camera-space centre
      pinhole_jacobian_vjp(cam, P, v_jr_x, v_jr_y, v_centre);
      pinhole_centre_vjp(cam, P, v_means2d + 2 * id, v_centre);
      for (int j = 0; j < 3; ++j)
        v_mean[j] += v_offset[j] + cam.R[j] * v_centre[0] + cam.R[3 + j] * v_centre[1] + cam.R[6 + j] * v_centre[2];
      if (pose_grad)
        pose_vjp(cam, P, mean, v_centre, v_jr_x, v_jr_y, v_offset, pose_rows.data() + (g * n_cams + c) * 12);
    }
    if (!seen) {
      std::fill(v_means + 3 * g, v_means + 3 * g + 3, 0.f);
      std::fill(v_quats + 4 * g, v_quats + 4 * g + 4, 0.f);
      std::fill(v_log_scales + 3 * g, v_log_scales + 3 * g + 3, 0.f);
      v_logits[g] = 0.f;
      continue;
    }
    for (int j = 0; j < 3; ++j) v_means[3 * g + j] = v_mean[j];
    v_logits[g] = v_log_op / (1.f + std::exp(logits[g]));  // d logsigmoid(x) / dx = sigmoid(-x)
    scale_rotation_vjp(S, v_M, v_log_scales + 3 * g, v_quats + 4 * g);
  }
  if (pose_grad) {
    float* v_viewmats = out.viewmats.data_ptr<float>();
#pragma omp parallel for schedule(static) num_threads(at::get_num_threads())
    for (int64_t c = 0; c < n_cams; ++c) {
      float sum[12] = {0.f};
      for (int64_t g = 0; g < n; ++g) {
        const float* row = pose_rows.data() + (g * n_cams + c) * 12;
        for (int e = 0; e < 12; ++e) sum[e] += row[e];
      }
      for (int i = 0; i < 3; ++i) {
        for (int j = 0; j < 3; ++j) v_viewmats[16 * c + 4 * i + j] = sum[3 * i + j];
        v_viewmats[16 * c + 4 * i + 3] = sum[9 + i];
      }
    }
  }
  return out;
}

}  // namespace gsrecon
