// cpp/include/honed/closeness.h: how close a candidate's floating output is to eager's, in one
// pass over host memory (honed.pipeline.correctness decides and words the verdict).
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace honed {

// The element types an output is compared in (each widened to double).
enum class FloatKind { F64, F32, F16, BF16 };

// "float64", "float32", "float16", "bfloat16" -> the kind; throws std::invalid_argument.
FloatKind float_kind(const std::string& name);

struct Closeness {
  size_t bad = 0;        // elements not finite in the candidate where eager's are finite
  bool bad_nan = false;  // whether any of those is NaN (else all are infinite)
  size_t compared = 0;   // elements finite in both: the figures below are over these
  double max_abs = 0;    // max |out - ref|
  double scale = 0;      // max |ref|
  double max_rel = 0;    // max |out - ref| / max(|ref|, max(scale * 1e-3, 1e-12))
  double cosine = 1;     // of ref and out as vectors: 1 when both are zero, 0 when one is
  bool within = true;    // every |out - ref| <= atol * max(1, scale) + rtol * |ref|
};

// Compares n elements of `kind` at ref and out (host memory, contiguous). Makes no Python or
// torch call: a binding runs it with the GIL released, beside a JIT program's calls.
Closeness closeness(const void* ref, const void* out, size_t n, FloatKind kind, double atol,
                    double rtol);

}  // namespace honed
