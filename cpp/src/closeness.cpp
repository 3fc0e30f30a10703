// cpp/src/closeness.cpp: honed::closeness, the figures of a check against eager (closeness.h).
#include "honed/closeness.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>

namespace honed {

FloatKind float_kind(const std::string& name) {
  if (name == "float64") return FloatKind::F64;
  if (name == "float32") return FloatKind::F32;
  if (name == "float16") return FloatKind::F16;
  if (name == "bfloat16") return FloatKind::BF16;
  throw std::invalid_argument("closeness: no comparison for dtype " + name +
                              " (float64, float32, float16 or bfloat16)");
}

namespace {

float from_bits(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

// IEEE half to float, subnormals, infinities and NaN included.
float half_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1fu;
  const uint32_t mantissa = h & 0x3ffu;
  if (exponent == 0x1f) return from_bits(sign | 0x7f800000u | (mantissa << 13));
  if (exponent != 0) return from_bits(sign | ((exponent + 112) << 23) | (mantissa << 13));
  const float magnitude = std::ldexp(static_cast<float>(mantissa), -24);
  return sign ? -magnitude : magnitude;
}

struct F64 {
  static double at(const void* p, size_t i) { return static_cast<const double*>(p)[i]; }
};
struct F32 {
  static double at(const void* p, size_t i) { return static_cast<const float*>(p)[i]; }
};
struct F16 {
  static double at(const void* p, size_t i) {
    return half_to_float(static_cast<const uint16_t*>(p)[i]);
  }
};
struct BF16 {
  static double at(const void* p, size_t i) {
    return from_bits(static_cast<uint32_t>(static_cast<const uint16_t*>(p)[i]) << 16);
  }
};

template <typename T>
Closeness compare(const void* ref, const void* out, size_t n, double atol, double rtol) {
  Closeness c;
  double ref_squares = 0, out_squares = 0, dot = 0;
  // First pass: what is compared, eager's scale and the cosine's sums.
  for (size_t i = 0; i < n; ++i) {
    const double r = T::at(ref, i), o = T::at(out, i);
    if (!std::isfinite(r)) continue;
    if (!std::isfinite(o)) {
      ++c.bad;
      c.bad_nan = c.bad_nan || std::isnan(o);
      continue;
    }
    ++c.compared;
    c.scale = std::max(c.scale, std::fabs(r));
    ref_squares += r * r;
    out_squares += o * o;
    dot += r * o;
  }
  if (c.bad || !c.compared) return c;
  // Second pass: the errors, against the scale.
  const double floor = std::max(c.scale * 1e-3, 1e-12);
  const double absolute = atol * std::max(1.0, c.scale);
  for (size_t i = 0; i < n; ++i) {
    const double r = T::at(ref, i), o = T::at(out, i);
    if (!std::isfinite(r) || !std::isfinite(o)) continue;
    const double diff = std::fabs(o - r);
    c.max_abs = std::max(c.max_abs, diff);
    c.max_rel = std::max(c.max_rel, diff / std::max(std::fabs(r), floor));
    c.within = c.within && diff <= absolute + rtol * std::fabs(r);
  }
  const double ref_norm = std::sqrt(ref_squares), out_norm = std::sqrt(out_squares);
  if (ref_norm == 0 && out_norm == 0) {
    c.cosine = 1;
  } else if (ref_norm == 0 || out_norm == 0) {
    c.cosine = 0;
  } else {
    c.cosine = dot / (ref_norm * out_norm);
  }
  return c;
}

}  // namespace

Closeness closeness(const void* ref, const void* out, size_t n, FloatKind kind, double atol,
                    double rtol) {
  switch (kind) {
    case FloatKind::F64:
      return compare<F64>(ref, out, n, atol, rtol);
    case FloatKind::F32:
      return compare<F32>(ref, out, n, atol, rtol);
    case FloatKind::F16:
      return compare<F16>(ref, out, n, atol, rtol);
    case FloatKind::BF16:
      return compare<BF16>(ref, out, n, atol, rtol);
  }
  throw std::invalid_argument("closeness: unknown element kind");
}

}  // namespace honed
