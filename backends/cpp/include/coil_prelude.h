// coil_prelude.h: what every coil C++ translation unit includes first.
//
// One translation unit per compiled graph (backends/cpp/kernel.py), so the
// definitions below (coil_error, coil_errors) exist once per shared object.
// build.py compiles this header once per (header, compiler, flags) into a
// precompiled header in the build cache, and keys every library on its hash:
// an edit here rebuilds the kernels that include it.
//
// Only standard headers: a module of kernels must compile in well under a second,
// which ATen's headers (Inductor's choice) make impossible.  Everything a body needs
// beyond plain operators is a small inline function here: half-type conversions,
// NaN-propagating max/min, Python-style integer division, and the OpenMP reductions
// `omp simd` cannot express with built-in operators.
#ifndef COIL_PRELUDE_H
#define COIL_PRELUDE_H

#include <cstdint>

// ---- libm
// The functions a body may call, declared here instead of through <cmath>: the
// C++ <cmath> alone costs a quarter second per compile, more than the kernels.
// glibc declares them `noexcept`; GCC still treats them as builtins (floor becomes
// vroundps, sqrt vsqrtps).  Vector variants live in glibc's libmvec (2.22:
// exp/log/sin/cos/pow, 2.35: the rest; build.py defines COIL_LIBMVEC where it is
// there and links it): the `simd` attribute lets `omp simd` loops call them.
#if defined(COIL_LIBMVEC) && defined(__x86_64__)
#define COIL_SIMD __attribute__((simd("notinbranch")))
#else
#define COIL_SIMD
#endif
extern "C" {
float sqrtf(float) noexcept;
double sqrt(double) noexcept;
COIL_SIMD float expf(float) noexcept;
COIL_SIMD double exp(double) noexcept;
COIL_SIMD float exp2f(float) noexcept;
COIL_SIMD double exp2(double) noexcept;
COIL_SIMD float expm1f(float) noexcept;
COIL_SIMD double expm1(double) noexcept;
COIL_SIMD float logf(float) noexcept;
COIL_SIMD double log(double) noexcept;
COIL_SIMD float log1pf(float) noexcept;
COIL_SIMD double log1p(double) noexcept;
COIL_SIMD float log2f(float) noexcept;
COIL_SIMD double log2(double) noexcept;
COIL_SIMD float sinf(float) noexcept;
COIL_SIMD double sin(double) noexcept;
COIL_SIMD float cosf(float) noexcept;
COIL_SIMD double cos(double) noexcept;
COIL_SIMD float tanf(float) noexcept;
COIL_SIMD double tan(double) noexcept;
COIL_SIMD float tanhf(float) noexcept;
COIL_SIMD double tanh(double) noexcept;
COIL_SIMD float erff(float) noexcept;
COIL_SIMD double erf(double) noexcept;
float floorf(float) noexcept;
double floor(double) noexcept;
float ceilf(float) noexcept;
double ceil(double) noexcept;
float truncf(float) noexcept;
double trunc(double) noexcept;
float nearbyintf(float) noexcept;
double nearbyint(double) noexcept;
float fabsf(float) noexcept;
double fabs(double) noexcept;
float fmodf(float, float) noexcept;
double fmod(double, double) noexcept;
float copysignf(float, float) noexcept;
double copysign(double, double) noexcept;
COIL_SIMD float powf(float, float) noexcept;
COIL_SIMD double pow(double, double) noexcept;
}
// coil_<fn>: one overloaded name per libm function, so generated code never
// spells the float / double variant itself (coil_erf(float) is coil's own, below)
static inline float coil_sqrt(float a) { return sqrtf(a); }
static inline double coil_sqrt(double a) { return sqrt(a); }
static inline double coil_exp(double a) { return exp(a); }
static inline float coil_exp2(float a) { return exp2f(a); }
static inline double coil_exp2(double a) { return exp2(a); }
static inline float coil_expm1(float a) { return expm1f(a); }
static inline double coil_expm1(double a) { return expm1(a); }
static inline double coil_log(double a) { return log(a); }
static inline float coil_log1p(float a) { return log1pf(a); }
static inline double coil_log1p(double a) { return log1p(a); }
static inline float coil_log2(float a) { return log2f(a); }
static inline double coil_log2(double a) { return log2(a); }
// sin and cos: through names GCC does not take for its builtins.  Where a loop
// computes both of one value (a rotary embedding's cos(x) and sin(x)), GCC merges
// the builtins into one sincosf call, which has no vector variant, and the whole
// loop stays scalar: Llama's rotary kernel at the CPU models size took 206 us
// (bench/probes/cpu_kernels.py).  Under these names the two stay vector calls.
extern "C" {
__attribute__((const)) COIL_SIMD float coil_libm_sinf(float) noexcept __asm__("sinf");
__attribute__((const)) COIL_SIMD double coil_libm_sin(double) noexcept __asm__("sin");
__attribute__((const)) COIL_SIMD float coil_libm_cosf(float) noexcept __asm__("cosf");
__attribute__((const)) COIL_SIMD double coil_libm_cos(double) noexcept __asm__("cos");
}
static inline float coil_sin(float a) { return coil_libm_sinf(a); }
static inline double coil_sin(double a) { return coil_libm_sin(a); }
static inline float coil_cos(float a) { return coil_libm_cosf(a); }
static inline double coil_cos(double a) { return coil_libm_cos(a); }
static inline float coil_tan(float a) { return tanf(a); }
static inline double coil_tan(double a) { return tan(a); }
static inline float coil_tanh(float a) { return tanhf(a); }
static inline double coil_tanh(double a) { return tanh(a); }
static inline double coil_erf(double a) { return erf(a); }
static inline float coil_floor(float a) { return floorf(a); }
static inline double coil_floor(double a) { return floor(a); }
static inline float coil_ceil(float a) { return ceilf(a); }
static inline double coil_ceil(double a) { return ceil(a); }
static inline float coil_trunc(float a) { return truncf(a); }
static inline double coil_trunc(double a) { return trunc(a); }
static inline float coil_nearbyint(float a) { return nearbyintf(a); }
static inline double coil_nearbyint(double a) { return nearbyint(a); }
static inline float coil_fabs(float a) { return fabsf(a); }
static inline double coil_fabs(double a) { return fabs(a); }
static inline float coil_fmod(float a, float b) { return fmodf(a, b); }
static inline double coil_fmod(double a, double b) { return fmod(a, b); }
static inline float coil_copysign(float a, float b) { return copysignf(a, b); }
static inline double coil_copysign(double a, double b) { return copysign(a, b); }
static inline float coil_pow(float a, float b) { return powf(a, b); }
static inline double coil_pow(double a, double b) { return pow(a, b); }

// ---- erf(float): coil's own (libmvec's erff is 4 ulp and slower)
// erf(x) = x * A(x^2) for |x| < 1, 1 - B(|x| - 2.5) for 1 <= |x| < 4, and +-1 beyond
// (erf(3.92) rounds to 1.0f).  Least-squares fits on Chebyshev nodes in float64,
// evaluated in float by Horner's rule (with FMA where the target has it): within
// 2.5 ulp of erf on a dense sweep of [-5, 5].
#ifdef __FMA__
#define COIL_FMAF(a, b, c) __builtin_fmaf(a, b, c)
#else
#define COIL_FMAF(a, b, c) ((a) * (b) + (c))
#endif
// ---- exp(float): coil's own.  glibc's vector expf computes a whole vector on its
// scalar path when one lane is below -87.3 (where the result is denormal or 0), and
// a causal mask's -3.4e38 puts such a lane in most vectors of a softmax: T5's
// masked softmax at the CPU models size took 271 us instead of 75.  This one has
// no such path: n = rint(a * log2 e) and r = a - n ln 2 (Cody and Waite's two-part
// ln 2, so n * the first part is exact), e^r by Cephes's degree-7 polynomial on
// |r| <= ln 2 / 2, and 2^n applied as two powers of two, so a denormal result
// is rounded once.  The input is clamped to [-104, 89] first: below, e^a rounds to
// 0; above, to inf; a NaN passes the clamp and stays NaN.  Within 1 ulp of the
// correctly rounded e^a (a sweep of every 97th float in [-110, 95]), and as fast
// as glibc's vector expf on ordinary inputs (65536 floats: 24 us against 26; with
// most lanes masked: 34 against 439).
static inline float coil_exp(float a) {
  float x = a < -104.0f ? -104.0f : a;
  x = x > 89.0f ? 89.0f : x;
  const float n = __builtin_rintf(x * 1.44269504088896341f);
  float r = COIL_FMAF(n, -0.693359375f, x);
  r = COIL_FMAF(n, 2.12194440e-4f, r);
  float p = 1.9875691500e-4f;
  p = COIL_FMAF(p, r, 1.3981999507e-3f);
  p = COIL_FMAF(p, r, 8.3334519073e-3f);
  p = COIL_FMAF(p, r, 4.1665795894e-2f);
  p = COIL_FMAF(p, r, 1.6666665459e-1f);
  p = COIL_FMAF(p, r, 5.0000001201e-1f);
  const float y = COIL_FMAF(p, r * r, r) + 1.0f;
  const int32_t k = static_cast<int32_t>(n), k1 = k >> 1, k2 = k - k1;
  return y * __builtin_bit_cast(float, (k1 + 127) << 23) * __builtin_bit_cast(float, (k2 + 127) << 23);
}
// ---- log(float): coil's own, for the same reason as exp: glibc's vector logf
// takes its scalar path for a whole vector when one lane is 0, negative, denormal,
// inf or NaN, and T5's position buckets take the log of |i - j|, 0 on the diagonal
// (its softmax kernels at the CPU models size: 295 us, 120 without the log).
// a = m 2^e with m in [sqrt(1/2), sqrt(2)) (denormals scaled by 2^23 first),
// log(m) by Cephes's degree-9 polynomial in m - 1, e ln 2 in two parts; the special
// inputs are selected at the end.  Within 1 ulp of the correctly rounded log over
// a sweep of every 61st float; 65536 floats in 29 us against glibc's 21, and 30
// against 50 with one zero in every 64.
static inline float coil_log(float a) {
  const bool tiny = a < 1.17549435e-38f;
  const float x = tiny ? a * 8388608.0f : a;
  const int32_t bits = __builtin_bit_cast(int32_t, x);
  const int32_t e = (bits - 0x3f3504f3) >> 23;
  const float f = __builtin_bit_cast(float, bits - (e << 23)) - 1.0f;
  const float z = f * f;
  float p = 7.0376836292e-2f;
  p = COIL_FMAF(p, f, -1.1514610310e-1f);
  p = COIL_FMAF(p, f, 1.1676998740e-1f);
  p = COIL_FMAF(p, f, -1.2420140846e-1f);
  p = COIL_FMAF(p, f, 1.4249322787e-1f);
  p = COIL_FMAF(p, f, -1.6668057665e-1f);
  p = COIL_FMAF(p, f, 2.0000714765e-1f);
  p = COIL_FMAF(p, f, -2.4999993993e-1f);
  p = COIL_FMAF(p, f, 3.3333331174e-1f);
  const float n = static_cast<float>(tiny ? e - 23 : e);
  float y = COIL_FMAF(n, -2.12194440e-4f, p * f * z);
  y = COIL_FMAF(z, -0.5f, y);
  float r = COIL_FMAF(n, 0.693359375f, f + y);
  r = a == 0.0f ? -__builtin_inff() : r;
  r = a == __builtin_inff() ? a : r;
  r = a < 0.0f ? __builtin_nanf("") : r;
  return a != a ? a : r;
}
static inline float coil_erf(float a) {
  const float x = a < 0.0f ? -a : a;
  const float x2 = x * x;
  float p = 7.898115291027352e-05f;  // A, from x^12 down
  p = COIL_FMAF(p, x2, -0.0008024327689781785f);
  p = COIL_FMAF(p, x2, 0.005190050695091486f);
  p = COIL_FMAF(p, x2, -0.026854807510972023f);
  p = COIL_FMAF(p, x2, 0.11283612251281738f);
  p = COIL_FMAF(p, x2, -0.3761262893676758f);
  p = COIL_FMAF(p, x2, 1.128379225730896f);
  const float small = x * p;
  const float t = (x < 4.0f ? x : 4.0f) - 2.5f;
  float q = -8.90137926035095e-07f;  // B, from t^14 down
  q = COIL_FMAF(q, t, -4.985204782315122e-07f);
  q = COIL_FMAF(q, t, 1.5719277143944055e-05f);
  q = COIL_FMAF(q, t, -1.7760552509571426e-05f);
  q = COIL_FMAF(q, t, -8.110048656817526e-05f);
  q = COIL_FMAF(q, t, 0.00027061899891123176f);
  q = COIL_FMAF(q, t, -0.00025873008416965604f);
  q = COIL_FMAF(q, t, -0.0005603611352853477f);
  q = COIL_FMAF(q, t, 0.002797554712742567f);
  q = COIL_FMAF(q, t, -0.0061091091483831406f);
  q = COIL_FMAF(q, t, 0.008622604422271252f);
  q = COIL_FMAF(q, t, -0.008351770229637623f);
  q = COIL_FMAF(q, t, 0.005445688497275114f);
  q = COIL_FMAF(q, t, -0.002178184688091278f);
  q = COIL_FMAF(q, t, 0.0004069523711223155f);
  const float large = 1.0f - q;
  const float y = x < 1.0f ? small : (x < 4.0f ? large : 1.0f);
  return (a != a || a == 0.0f) ? a : (a < 0.0f ? -y : y);  // NaN and -0.0 pass through
}

// ---- half types: stored as uint16_t, computed in float, rounded to nearest even on store
static inline float coil_bf16_to_f32(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16; float f; __builtin_memcpy(&f, &u, 4); return f;
}
static inline uint16_t coil_f32_to_bf16(float f) {
  if (f != f) return 0x7fc0;  // c10::BFloat16's quiet NaN
  uint32_t u; __builtin_memcpy(&u, &f, 4);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
#ifdef __FLT16_MAX__
static inline float coil_f16_to_f32(uint16_t h) { _Float16 v; __builtin_memcpy(&v, &h, 2); return static_cast<float>(v); }
static inline uint16_t coil_f32_to_f16(float f) { _Float16 v = static_cast<_Float16>(f); uint16_t h; __builtin_memcpy(&h, &v, 2); return h; }
#else
// the bit manipulation of c10/util/Half.h (fp16_ieee_to/from_fp32_value)
static inline float coil_bits_f32(uint32_t u) { float f; __builtin_memcpy(&f, &u, 4); return f; }
static inline uint32_t coil_f32_bits(float f) { uint32_t u; __builtin_memcpy(&u, &f, 4); return u; }
static inline float coil_f16_to_f32(uint16_t h) {
  const uint32_t w = static_cast<uint32_t>(h) << 16, sign = w & 0x80000000u, two_w = w + w;
  const float normalized = coil_bits_f32((two_w >> 4) + (0xE0u << 23)) * 0x1.0p-112f;
  const float denormalized = coil_bits_f32((two_w >> 17) | (126u << 23)) - 0.5f;
  const uint32_t result = sign | (two_w < (1u << 27) ? coil_f32_bits(denormalized) : coil_f32_bits(normalized));
  return coil_bits_f32(result);
}
static inline uint16_t coil_f32_to_f16(float f) {
  float base = (coil_fabs(f) * 0x1.0p+112f) * 0x1.0p-110f;
  const uint32_t w = coil_f32_bits(f), shl1_w = w + w, sign = w & 0x80000000u;
  uint32_t bias = shl1_w & 0xFF000000u;
  if (bias < 0x71000000u) bias = 0x71000000u;
  base = coil_bits_f32((bias >> 1) + 0x07800000u) + base;
  const uint32_t bits = coil_f32_bits(base);
  const uint32_t exp_bits = (bits >> 13) & 0x00007C00u, mantissa_bits = bits & 0x00000FFFu;
  const uint32_t nonsign = exp_bits + mantissa_bits;
  return static_cast<uint16_t>((sign >> 16) | (shl1_w > 0xFF000000u ? 0x7E00u : nonsign));
}
#endif
static inline float coil_round_f16(float f) { return coil_f16_to_f32(coil_f32_to_f16(f)); }
static inline float coil_round_bf16(float f) { return coil_bf16_to_f32(coil_f32_to_bf16(f)); }

static inline int64_t coil_min_index(int64_t a, int64_t b) { return a < b ? a : b; }

// ---- row scratch of a length only the call knows (a kernel with symbolic sizes;
// a static row's scratch is an array on the stack).  Per thread and slot, one
// buffer, grown to the longest row met and kept for the next rows and calls.
extern "C" {
void* aligned_alloc(unsigned long, unsigned long) noexcept;
void free(void*) noexcept;
}
struct coil_scratch_buffer {
  void* data = nullptr;
  int64_t bytes = 0;
  ~coil_scratch_buffer() { free(data); }
};
template <int Slot> static inline void* coil_row_scratch(int64_t bytes) {
  static thread_local coil_scratch_buffer buf;
  if (bytes > buf.bytes) {
    free(buf.data);
    buf.bytes = (bytes + 63) / 64 * 64;
    buf.data = aligned_alloc(64, static_cast<unsigned long>(buf.bytes));
    if (buf.data == nullptr) __builtin_trap();  // out of memory for one row
  }
  return buf.data;
}

// ---- run-time checks (ir/expr.py's Check).  A kernel cannot throw through ctypes:
// the first failed check of a call records {error code, value, size, dim} in
// coil_error (a compare-and-swap on the code: among threads, the first wins) and
// the kernel goes on with a harmless value, so no access leaves its buffer.  The
// wrapper reads the code after each kernel that checks (coil_errors gives its
// address), raises eager's error and clears it.
static int64_t coil_error[4] = {0, 0, 0, 0};
extern "C" int64_t* coil_errors() { return coil_error; }
__attribute__((noinline, cold)) static void coil_fail(int64_t code, int64_t value, int64_t size, int64_t dim) {
  int64_t none = 0;
  if (__atomic_compare_exchange_n(&coil_error[0], &none, -1, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
    coil_error[1] = value;
    coil_error[2] = size;
    coil_error[3] = dim;
    __atomic_store_n(&coil_error[0], code, __ATOMIC_RELEASE);
  }
}
// an index into a dim of n: negatives wrapped once when `wrap`; out of [0, n): fail, read 0
static inline int64_t coil_check_index(int64_t v, int64_t n, bool wrap, int64_t code, int64_t dim) {
  const int64_t w = (wrap && v < 0) ? v + n : v;
  if (__builtin_expect(w < 0 || w >= n, 0)) {
    coil_fail(code, v, n, dim);
    return 0;
  }
  return w;
}
// an integer divisor: 0 fails (eager raises ZeroDivisionError on the CPU), then divides by 1
template <typename T> static inline T coil_check_divisor(T b, int64_t code) {
  if (__builtin_expect(b == 0, 0)) {
    coil_fail(code, 0, 0, 0);
    return 1;
  }
  return b;
}

// ---- arithmetic with torch's semantics
// maximum / minimum / amax / amin propagate NaN (for integers `a != a` is false)
template <typename T> static inline T coil_max(T a, T b) { return (a > b || a != a) ? a : b; }
template <typename T> static inline T coil_min(T a, T b) { return (a < b || a != a) ? a : b; }
// integer division by zero: the divisor's Check raises (eager's CPU error); an
// unchecked zero divisor gives 0 instead of a SIGFPE
template <typename T> static inline T coil_floordiv_int(T a, T b) {
  if (b == 0) return 0;
  if (b == -1) return static_cast<T>(0 - a);
  const T q = a / b, r = a % b;
  return (r != 0 && ((r < 0) != (b < 0))) ? static_cast<T>(q - 1) : q;
}
template <typename T> static inline T coil_truncdiv_int(T a, T b) {
  if (b == 0) return 0;
  if (b == -1) return static_cast<T>(0 - a);
  return static_cast<T>(a / b);
}
template <typename T> static inline T coil_fmod_int(T a, T b) { return (b == 0 || b == -1) ? 0 : static_cast<T>(a % b); }
template <typename T> static inline T coil_remainder_int(T a, T b) {
  if (b == 0 || b == -1) return 0;
  const T r = a % b;
  return (r != 0 && ((r < 0) != (b < 0))) ? static_cast<T>(r + b) : r;
}
// c10's div_floor_floating
template <typename T> static inline T coil_floordiv_fp(T a, T b) {
  if (b == 0) return a / b;
  const T mod = coil_fmod(a, b);
  T div = (a - mod) / b;
  if (mod != 0 && ((b < 0) != (mod < 0))) div -= T(1);
  if (div == 0) return coil_copysign(T(0), a / b);
  T floordiv = coil_floor(div);
  if (div - floordiv > T(0.5)) floordiv += T(1);
  return floordiv;
}
template <typename T> static inline T coil_remainder_fp(T a, T b) {
  T mod = coil_fmod(a, b);
  if (mod != 0 && ((b < 0) != (mod < 0))) mod += b;
  return mod;
}
template <typename T> static inline T coil_ipow(T base, T exp) {
  if (exp < 0) {
    if (base == 1) return 1;
    if (base == -1) return (exp & 1) ? -1 : 1;
    return 0;
  }
  T result = 1;
  while (exp) {
    if (exp & 1) result = static_cast<T>(result * base);
    exp >>= 1;
    base = static_cast<T>(base * base);
  }
  return result;
}

// ---- tiles of transposed inputs
// dst[i * T + j] = src[i + j * stride] for i, j < T: a pointwise kernel reading an
// input along its slow dim copies each tile here first, so the compute loop reads
// contiguous memory.  4-byte elements go through 8x8 register transposes (GCC
// vector extensions: no intrinsics header to parse); others are copied one by one.
typedef float coil_v8f __attribute__((vector_size(32), aligned(4), may_alias));
typedef int32_t coil_v8i __attribute__((vector_size(32)));
static inline void coil_transpose8x8(const float* src, int64_t ss, float* dst, int64_t ds) {
  const coil_v8f r0 = *(const coil_v8f*)(src), r1 = *(const coil_v8f*)(src + ss),
    r2 = *(const coil_v8f*)(src + 2 * ss), r3 = *(const coil_v8f*)(src + 3 * ss),
    r4 = *(const coil_v8f*)(src + 4 * ss), r5 = *(const coil_v8f*)(src + 5 * ss),
    r6 = *(const coil_v8f*)(src + 6 * ss), r7 = *(const coil_v8f*)(src + 7 * ss);
  const coil_v8i lo1 = {0, 8, 1, 9, 4, 12, 5, 13}, hi1 = {2, 10, 3, 11, 6, 14, 7, 15};
  const coil_v8f t0 = __builtin_shuffle(r0, r1, lo1), t1 = __builtin_shuffle(r0, r1, hi1),
    t2 = __builtin_shuffle(r2, r3, lo1), t3 = __builtin_shuffle(r2, r3, hi1),
    t4 = __builtin_shuffle(r4, r5, lo1), t5 = __builtin_shuffle(r4, r5, hi1),
    t6 = __builtin_shuffle(r6, r7, lo1), t7 = __builtin_shuffle(r6, r7, hi1);
  const coil_v8i lo2 = {0, 1, 8, 9, 4, 5, 12, 13}, hi2 = {2, 3, 10, 11, 6, 7, 14, 15};
  const coil_v8f u0 = __builtin_shuffle(t0, t2, lo2), u1 = __builtin_shuffle(t0, t2, hi2),
    u2 = __builtin_shuffle(t1, t3, lo2), u3 = __builtin_shuffle(t1, t3, hi2),
    u4 = __builtin_shuffle(t4, t6, lo2), u5 = __builtin_shuffle(t4, t6, hi2),
    u6 = __builtin_shuffle(t5, t7, lo2), u7 = __builtin_shuffle(t5, t7, hi2);
  const coil_v8i lo3 = {0, 1, 2, 3, 8, 9, 10, 11}, hi3 = {4, 5, 6, 7, 12, 13, 14, 15};
  *(coil_v8f*)(dst) = __builtin_shuffle(u0, u4, lo3);
  *(coil_v8f*)(dst + ds) = __builtin_shuffle(u1, u5, lo3);
  *(coil_v8f*)(dst + 2 * ds) = __builtin_shuffle(u2, u6, lo3);
  *(coil_v8f*)(dst + 3 * ds) = __builtin_shuffle(u3, u7, lo3);
  *(coil_v8f*)(dst + 4 * ds) = __builtin_shuffle(u0, u4, hi3);
  *(coil_v8f*)(dst + 5 * ds) = __builtin_shuffle(u1, u5, hi3);
  *(coil_v8f*)(dst + 6 * ds) = __builtin_shuffle(u2, u6, hi3);
  *(coil_v8f*)(dst + 7 * ds) = __builtin_shuffle(u3, u7, hi3);
}
template <int T, typename S>
static inline void coil_transpose_tile(const S* __restrict__ src, int64_t stride, S* __restrict__ dst) {
  if constexpr (sizeof(S) == 4 && T % 8 == 0) {
    for (int j = 0; j < T; j += 8)
      for (int i = 0; i < T; i += 8)
        coil_transpose8x8(reinterpret_cast<const float*>(src + i + j * stride), stride,
                          reinterpret_cast<float*>(dst + i * T + j), T);
  } else {
    for (int j = 0; j < T; ++j)
      for (int i = 0; i < T; ++i) dst[i * T + j] = src[i + j * stride];
  }
}

// ---- streaming stores
// coil_stream copies n bytes of a small local buffer to dst with non-temporal
// stores: a large output then goes to memory without first being read into the
// cache (half the write traffic).  coil_sfence orders them before the thread's
// later stores (call it before the thread leaves its share of the work).
#if defined(__AVX__)
typedef long long coil_v4di __attribute__((vector_size(32)));
typedef long long coil_v4di_u __attribute__((vector_size(32), aligned(1)));
#define COIL_STREAM_BYTES 32
#define COIL_STREAM(d, s) __builtin_ia32_movntdq256((coil_v4di*)(d), *(const coil_v4di_u*)(s))
#elif defined(__SSE2__)
typedef long long coil_v2di __attribute__((vector_size(16)));
typedef long long coil_v2di_u __attribute__((vector_size(16), aligned(1)));
#define COIL_STREAM_BYTES 16
#define COIL_STREAM(d, s) __builtin_ia32_movntdq((coil_v2di*)(d), *(const coil_v2di_u*)(s))
#endif
static inline void coil_stream(void* __restrict__ dst, const void* __restrict__ src, int64_t n) {
  char* d = static_cast<char*>(dst);
  const char* s = static_cast<const char*>(src);
  int64_t i = 0;
#ifdef COIL_STREAM_BYTES
  int64_t head = static_cast<int64_t>((-reinterpret_cast<uintptr_t>(d)) & (COIL_STREAM_BYTES - 1));
  for (; i < head && i < n; ++i) d[i] = s[i];
  for (; i + COIL_STREAM_BYTES <= n; i += COIL_STREAM_BYTES) COIL_STREAM(d + i, s + i);
#endif
  for (; i < n; ++i) d[i] = s[i];
}
static inline void coil_sfence() {
#ifdef COIL_STREAM_BYTES
  __builtin_ia32_sfence();
#endif
}

// ---- reductions `omp simd` cannot spell with a built-in operator
#pragma omp declare reduction(coil_nanmax : float : omp_out = coil_max(omp_out, omp_in)) initializer(omp_priv = -__builtin_inf())
#pragma omp declare reduction(coil_nanmax : double : omp_out = coil_max(omp_out, omp_in)) initializer(omp_priv = -__builtin_inf())
#pragma omp declare reduction(coil_nanmin : float : omp_out = coil_min(omp_out, omp_in)) initializer(omp_priv = __builtin_inf())
#pragma omp declare reduction(coil_nanmin : double : omp_out = coil_min(omp_out, omp_in)) initializer(omp_priv = __builtin_inf())

#endif  // COIL_PRELUDE_H
