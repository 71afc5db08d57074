#include "ShmReduce.h"

#include <c10/util/BFloat16.h>
#include <c10/util/Exception.h>
#include <c10/util/Float8_e4m3fn.h>
#include <c10/util/Float8_e4m3fnuz.h>
#include <c10/util/Float8_e5m2.h>
#include <c10/util/Float8_e5m2fnuz.h>
#include <c10/util/Half.h>
#include <c10/util/complex.h>

#include <algorithm>
#include <type_traits>

namespace c10d::vnpu {
namespace {

using Op = ReduceOp::RedOpType;
constexpr int64_t kBlock = 1024;  // elements reduced in a local buffer before they are written out

template <typename Acc>
bool isNan(const Acc& v) {
  if constexpr (std::is_floating_point_v<Acc>) return v != v;
  return false;
}

// Floating point and complex types: accumulate in Acc (float for 8/16-bit floats).
template <typename T, typename Acc>
void reduceFloat(T* const* dsts, int ndst, const T* const* srcs, int nsrc, int64_t count, Op op,
                 const double* factors) {
  Acc acc[kBlock];
  for (int64_t base = 0; base < count; base += kBlock) {
    const int64_t n = std::min(kBlock, count - base);
    for (int r = 0; r < nsrc; ++r) {
      const T* s = srcs[r] + base;
      if (op == Op::PREMUL_SUM) {
        using Real = std::conditional_t<std::is_same_v<Acc, double> || std::is_same_v<Acc, c10::complex<double>>,
                                        double, float>;
        const Real f = static_cast<Real>(factors[r]);
        if (r == 0) for (int64_t j = 0; j < n; ++j) acc[j] = static_cast<Acc>(s[j]) * f;
        else for (int64_t j = 0; j < n; ++j) acc[j] += static_cast<Acc>(s[j]) * f;
        continue;
      }
      if (r == 0) {
        for (int64_t j = 0; j < n; ++j) acc[j] = static_cast<Acc>(s[j]);
        continue;
      }
      switch (op) {
        case Op::SUM:
        case Op::AVG:
          for (int64_t j = 0; j < n; ++j) acc[j] += static_cast<Acc>(s[j]);
          break;
        case Op::PRODUCT:
          for (int64_t j = 0; j < n; ++j) acc[j] *= static_cast<Acc>(s[j]);
          break;
        case Op::MIN:
          if constexpr (std::is_floating_point_v<Acc>) {
            for (int64_t j = 0; j < n; ++j) {
              Acc x = static_cast<Acc>(s[j]);
              acc[j] = (x < acc[j] || isNan(x)) ? x : acc[j];
            }
          }
          break;
        case Op::MAX:
          if constexpr (std::is_floating_point_v<Acc>) {
            for (int64_t j = 0; j < n; ++j) {
              Acc x = static_cast<Acc>(s[j]);
              acc[j] = (x > acc[j] || isNan(x)) ? x : acc[j];
            }
          }
          break;
        default:
          TORCH_INTERNAL_ASSERT(false, "vccl: unexpected reduce op for a floating point dtype");
      }
    }
    if (op == Op::AVG) {
      for (int64_t j = 0; j < n; ++j) acc[j] /= static_cast<Acc>(nsrc);
    }
    for (int k = 0; k < ndst; ++k) {
      T* d = dsts[k] + base;
      for (int64_t j = 0; j < n; ++j) d[j] = static_cast<T>(acc[j]);
    }
  }
}

// Integers: wrap-around arithmetic (in uint64_t, so no signed overflow), AVG truncates.
template <typename T>
void reduceInt(T* const* dsts, int ndst, const T* const* srcs, int nsrc, int64_t count, Op op) {
  using U = uint64_t;
  T acc[kBlock];
  for (int64_t base = 0; base < count; base += kBlock) {
    const int64_t n = std::min(kBlock, count - base);
    std::copy(srcs[0] + base, srcs[0] + base + n, acc);
    for (int r = 1; r < nsrc; ++r) {
      const T* s = srcs[r] + base;
      switch (op) {
        case Op::SUM:
        case Op::AVG:
          for (int64_t j = 0; j < n; ++j) acc[j] = static_cast<T>(static_cast<U>(acc[j]) + static_cast<U>(s[j]));
          break;
        case Op::PRODUCT:
          for (int64_t j = 0; j < n; ++j) acc[j] = static_cast<T>(static_cast<U>(acc[j]) * static_cast<U>(s[j]));
          break;
        case Op::MIN:
          for (int64_t j = 0; j < n; ++j) acc[j] = std::min(acc[j], s[j]);
          break;
        case Op::MAX:
          for (int64_t j = 0; j < n; ++j) acc[j] = std::max(acc[j], s[j]);
          break;
        case Op::BAND:
          for (int64_t j = 0; j < n; ++j) acc[j] &= s[j];
          break;
        case Op::BOR:
          for (int64_t j = 0; j < n; ++j) acc[j] |= s[j];
          break;
        case Op::BXOR:
          for (int64_t j = 0; j < n; ++j) acc[j] ^= s[j];
          break;
        default:
          TORCH_INTERNAL_ASSERT(false, "vccl: unexpected reduce op for an integer dtype");
      }
    }
    if (op == Op::AVG) {
      for (int64_t j = 0; j < n; ++j) acc[j] = static_cast<T>(acc[j] / static_cast<T>(nsrc));
    }
    for (int k = 0; k < ndst; ++k) std::copy(acc, acc + n, dsts[k] + base);
  }
}

void reduceBool(bool* const* dsts, int ndst, const bool* const* srcs, int nsrc, int64_t count, Op op) {
  bool acc[kBlock];
  for (int64_t base = 0; base < count; base += kBlock) {
    const int64_t n = std::min(kBlock, count - base);
    std::copy(srcs[0] + base, srcs[0] + base + n, acc);
    for (int r = 1; r < nsrc; ++r) {
      const bool* s = srcs[r] + base;
      switch (op) {
        case Op::SUM: case Op::MAX: case Op::BOR:
          for (int64_t j = 0; j < n; ++j) acc[j] = acc[j] || s[j];
          break;
        case Op::PRODUCT: case Op::MIN: case Op::BAND:
          for (int64_t j = 0; j < n; ++j) acc[j] = acc[j] && s[j];
          break;
        case Op::BXOR:
          for (int64_t j = 0; j < n; ++j) acc[j] = acc[j] != s[j];
          break;
        default:
          TORCH_INTERNAL_ASSERT(false, "vccl: unexpected reduce op for bool");
      }
    }
    for (int k = 0; k < ndst; ++k) std::copy(acc, acc + n, dsts[k] + base);
  }
}

template <typename T, typename Acc>
void floatCase(void* const* dsts, int ndst, const void* const* srcs, int nsrc, int64_t count, Op op,
               const double* factors) {
  reduceFloat<T, Acc>(reinterpret_cast<T* const*>(dsts), ndst, reinterpret_cast<const T* const*>(srcs), nsrc, count,
                      op, factors);
}

template <typename T>
void intCase(void* const* dsts, int ndst, const void* const* srcs, int nsrc, int64_t count, Op op) {
  reduceInt<T>(reinterpret_cast<T* const*>(dsts), ndst, reinterpret_cast<const T* const*>(srcs), nsrc, count, op);
}

}  // namespace

bool shmReducible(at::ScalarType dtype) {
  switch (dtype) {
    case at::kFloat: case at::kDouble: case at::kHalf: case at::kBFloat16: case at::kFloat8_e4m3fn:
    case at::kFloat8_e5m2: case at::kFloat8_e4m3fnuz: case at::kFloat8_e5m2fnuz: case at::kComplexFloat:
    case at::kComplexDouble: case at::kChar: case at::kByte: case at::kShort: case at::kInt: case at::kLong:
    case at::kUInt16: case at::kUInt32: case at::kUInt64: case at::kBool:
      return true;
    default:
      return false;
  }
}

void reduce(void* const* dsts, int ndst, const void* const* srcs, int nsrc, int64_t count, at::ScalarType dtype,
            ReduceOp::RedOpType op, const double* factors) {
  switch (dtype) {
    case at::kFloat: return floatCase<float, float>(dsts, ndst, srcs, nsrc, count, op, factors);
    case at::kDouble: return floatCase<double, double>(dsts, ndst, srcs, nsrc, count, op, factors);
    case at::kHalf: return floatCase<c10::Half, float>(dsts, ndst, srcs, nsrc, count, op, factors);
    case at::kBFloat16: return floatCase<c10::BFloat16, float>(dsts, ndst, srcs, nsrc, count, op, factors);
    case at::kFloat8_e4m3fn: return floatCase<c10::Float8_e4m3fn, float>(dsts, ndst, srcs, nsrc, count, op, factors);
    case at::kFloat8_e5m2: return floatCase<c10::Float8_e5m2, float>(dsts, ndst, srcs, nsrc, count, op, factors);
    case at::kFloat8_e4m3fnuz:
      return floatCase<c10::Float8_e4m3fnuz, float>(dsts, ndst, srcs, nsrc, count, op, factors);
    case at::kFloat8_e5m2fnuz:
      return floatCase<c10::Float8_e5m2fnuz, float>(dsts, ndst, srcs, nsrc, count, op, factors);
    case at::kComplexFloat:
      return floatCase<c10::complex<float>, c10::complex<float>>(dsts, ndst, srcs, nsrc, count, op, factors);
    case at::kComplexDouble:
      return floatCase<c10::complex<double>, c10::complex<double>>(dsts, ndst, srcs, nsrc, count, op, factors);
    case at::kChar: return intCase<int8_t>(dsts, ndst, srcs, nsrc, count, op);
    case at::kByte: return intCase<uint8_t>(dsts, ndst, srcs, nsrc, count, op);
    case at::kShort: return intCase<int16_t>(dsts, ndst, srcs, nsrc, count, op);
    case at::kInt: return intCase<int32_t>(dsts, ndst, srcs, nsrc, count, op);
    case at::kLong: return intCase<int64_t>(dsts, ndst, srcs, nsrc, count, op);
    case at::kUInt16: return intCase<uint16_t>(dsts, ndst, srcs, nsrc, count, op);
    case at::kUInt32: return intCase<uint32_t>(dsts, ndst, srcs, nsrc, count, op);
    case at::kUInt64: return intCase<uint64_t>(dsts, ndst, srcs, nsrc, count, op);
    case at::kBool:
      return reduceBool(reinterpret_cast<bool* const*>(dsts), ndst, reinterpret_cast<const bool* const*>(srcs), nsrc,
                        count, op);
    default:
      TORCH_CHECK(false, "vccl: no shared-memory reduction for dtype ", dtype);
  }
}

}  // namespace c10d::vnpu
