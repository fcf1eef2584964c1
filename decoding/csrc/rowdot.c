/* Products of a few activation rows with a large weight matrix, for a decoder step on a CPU.
 *
 * y[m, n] = x[m, :] . w[n, :] (+ b[n]) for float32 x [M, K] and w [N, K], both row-major, w in float32, bfloat16 or
 * int8 (times a scale per row n), each weight widened exactly to float32 as it is read. Each thread streams its
 * own contiguous block of weight rows once, and each dot product runs in one fixed order (four 16-lane float32
 * accumulators over k, then their lanes), so a row's result never depends on M, on the other rows or on the
 * number of threads: a check of drafts gives each row the bits a one-token step gives it.
 *
 * Built by decoding/native.py with the system's C compiler (-O3 -march=native -fopenmp); GCC's and Clang's
 * vector extensions map the 16-lane vectors onto AVX-512, AVX2 or NEON as the machine has them.
 */
#include <stdint.h>
#include <string.h>
#if defined(__AVX512F__)
#include <immintrin.h>
#endif

typedef float v16 __attribute__((vector_size(64)));
typedef int32_t v16i __attribute__((vector_size(64)));
typedef int8_t v16b __attribute__((vector_size(16)));
typedef uint16_t v16h __attribute__((vector_size(32)));

static inline v16 load_f32(const float* p) {
  v16 v;
  memcpy(&v, p, sizeof v);
  return v;
}

/* Sixteen weights widened exactly to float32, from float32, bfloat16 (the upper half of a float32) or int8. */
static inline v16 weights_f32(const void* w, int64_t k) { return load_f32((const float*)w + k); }

static inline v16 weights_bf16(const void* w, int64_t k) {
  v16h h;
  memcpy(&h, (const uint16_t*)w + k, sizeof h);
  v16i bits = __builtin_convertvector(h, v16i) << 16;
  v16 v;
  memcpy(&v, &bits, sizeof v);
  return v;
}

static inline v16 weights_i8(const void* w, int64_t k) {
#if defined(__AVX512F__)
  /* GCC 12 widens an int8 vector lane by lane; the one-instruction sign extension is ~6x faster. */
  return (v16)_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)((const int8_t*)w + k))));
#else
  v16b b;
  memcpy(&b, (const int8_t*)w + k, sizeof b);
  return __builtin_convertvector(__builtin_convertvector(b, v16i), v16);
#endif
}

/* The weight type, a constant wherever the functions below are inlined: 0 float32, 1 bfloat16, 2 int8. */
enum { F32 = 0, BF16 = 1, I8 = 2 };

static inline v16 weights(const void* w, int64_t k, int kind) {
  return kind == F32 ? weights_f32(w, k) : kind == BF16 ? weights_bf16(w, k) : weights_i8(w, k);
}

static inline float weight_at(const void* w, int64_t k, int kind) {
  if (kind == F32) return ((const float*)w)[k];
  if (kind == BF16) {
    uint32_t bits = (uint32_t)((const uint16_t*)w)[k] << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
  }
  return (float)((const int8_t*)w)[k];
}

static inline float lanes(v16 s) {
  float t = 0.f;
  for (int i = 0; i < 16; ++i) t += s[i];
  return t;
}

/* One dot product of a weight row with an activation row, in the order every caller shares: four 16-lane
 * accumulators over k, then their lanes, then the tail. */
static inline __attribute__((always_inline)) float dot(const void* w, const float* x, int64_t K, int kind) {
  int64_t body = K - K % 64;
  v16 a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0};
  for (int64_t k = 0; k < body; k += 64) {
    a0 += weights(w, k, kind) * load_f32(x + k);
    a1 += weights(w, k + 16, kind) * load_f32(x + k + 16);
    a2 += weights(w, k + 32, kind) * load_f32(x + k + 32);
    a3 += weights(w, k + 48, kind) * load_f32(x + k + 48);
  }
  float t = lanes((a0 + a1) + (a2 + a3));
  /* fmaf: the tail's rounding is then the same for every weight type, whatever the compiler contracts. */
  for (int64_t k = body; k < K; ++k) t = __builtin_fmaf(weight_at(w, k, kind), x[k], t);
  return t;
}

/* Two dot products over one weight row, each in exactly dot()'s order (the same bits), reading the weight once. */
static inline __attribute__((always_inline)) void dot2(const void* w, const float* x0, const float* x1, int64_t K,
                                                       float* t0, float* t1, int kind) {
  int64_t body = K - K % 64;
  v16 a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0}, c0 = {0}, c1 = {0}, c2 = {0}, c3 = {0};
  for (int64_t k = 0; k < body; k += 64) {
    v16 w0 = weights(w, k, kind), w1 = weights(w, k + 16, kind), w2 = weights(w, k + 32, kind),
        w3 = weights(w, k + 48, kind);
    a0 += w0 * load_f32(x0 + k);
    a1 += w1 * load_f32(x0 + k + 16);
    a2 += w2 * load_f32(x0 + k + 32);
    a3 += w3 * load_f32(x0 + k + 48);
    c0 += w0 * load_f32(x1 + k);
    c1 += w1 * load_f32(x1 + k + 16);
    c2 += w2 * load_f32(x1 + k + 32);
    c3 += w3 * load_f32(x1 + k + 48);
  }
  float s0 = lanes((a0 + a1) + (a2 + a3)), s1 = lanes((c0 + c1) + (c2 + c3));
  for (int64_t k = body; k < K; ++k) {
    float wk = weight_at(w, k, kind);
    s0 = __builtin_fmaf(wk, x0[k], s0);
    s1 = __builtin_fmaf(wk, x1[k], s1);
  }
  *t0 = s0;
  *t1 = s1;
}

static inline float finish(float t, const float* scale, const float* b, int64_t n) {
  float v = scale ? t * scale[n] : t;
  return b ? v + b[n] : v;
}

/* y[m, n] = scale[n] * (x[m, :] . w[n, :]) + b[n] for every m, two rows at a time (scale, b optional). */
static inline __attribute__((always_inline)) void row_products(const void* w, const float* x, const float* scale,
                                                               const float* b, float* y, int64_t n, int64_t M,
                                                               int64_t N, int64_t K, int kind) {
  int64_t m = 0;
  for (; m + 1 < M; m += 2) {
    float t0, t1;
    dot2(w, x + m * K, x + (m + 1) * K, K, &t0, &t1, kind);
    y[m * N + n] = finish(t0, scale, b, n);
    y[(m + 1) * N + n] = finish(t1, scale, b, n);
  }
  if (m < M) y[m * N + n] = finish(dot(w, x + m * K, K, kind), scale, b, n);
}

/* Each thread streams its own contiguous block of weight rows once. */
void rowdot_f32(const float* x, const float* w, const float* b, float* y, int64_t M, int64_t N, int64_t K,
                int threads) {
  #pragma omp parallel for num_threads(threads) schedule(static)
  for (int64_t n = 0; n < N; ++n) row_products(w + n * K, x, NULL, b, y, n, M, N, K, F32);
}

void rowdot_bf16(const float* x, const uint16_t* w, const float* b, float* y, int64_t M, int64_t N, int64_t K,
                 int threads) {
  #pragma omp parallel for num_threads(threads) schedule(static)
  for (int64_t n = 0; n < N; ++n) row_products(w + n * K, x, NULL, b, y, n, M, N, K, BF16);
}

/* Weight-only int8 with one scale per output row: y = scale[n] * (x . w_int8[n]) + b[n]. */
void rowdot_i8(const float* x, const int8_t* w, const float* scale, const float* b, float* y, int64_t M, int64_t N,
               int64_t K, int threads) {
  #pragma omp parallel for num_threads(threads) schedule(static)
  for (int64_t n = 0; n < N; ++n) row_products(w + n * K, x, scale, b, y, n, M, N, K, I8);
}

/* Attention of a few query rows over many keys, per group g of G (a window's head), all float32 and contiguous:
 * scores[g, r, t] = q[g, r, :] . k[g, t, :]      (q [G, R, D], k [G, T, D], scores [G, R, T])
 * out[g, r, :] = sum_t w[g, r, t] v[g, t, :]      (w [G, R, T], v [G, T, D], out [G, R, D])
 * Keys and values are streamed once each; every sum runs in one fixed order per row. */
void attention_scores(const float* q, const float* k, float* scores, int64_t G, int64_t R, int64_t T, int64_t D,
                      int threads) {
  #pragma omp parallel for collapse(2) num_threads(threads) schedule(static)
  for (int64_t g = 0; g < G; ++g)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t r = 0; r < R; ++r)
        scores[(g * R + r) * T + t] = dot(k + (g * T + t) * D, q + (g * R + r) * D, D, F32);
}

void attention_values(const float* w, const float* v, float* out, int64_t G, int64_t R, int64_t T, int64_t D,
                      int threads) {
  /* Each value row is read once for all R query rows; every output element still sums over t in order. */
  #pragma omp parallel for num_threads(threads) schedule(static)
  for (int64_t g = 0; g < G; ++g) {
    float* o = out + g * R * D;
    const float* wg = w + g * R * T;
    for (int64_t i = 0; i < R * D; ++i) o[i] = 0.f;
    for (int64_t t = 0; t < T; ++t) {
      const float* vt = v + (g * T + t) * D;
      for (int64_t r = 0; r < R; ++r) {
        float a = wg[r * T + t];
        float* orow = o + r * D;
        for (int64_t d = 0; d < D; ++d) orow[d] += a * vt[d];
      }
    }
  }
}

/* Build check: the caller compares this with the version it expects. */
int rowdot_version(void) { return 2; }
