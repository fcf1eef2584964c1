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
#include <math.h>
#include <stdint.h>
#include <string.h>
#if defined(__AVX512F__)
#include <immintrin.h>
#endif
#if defined(_OPENMP)
#include <omp.h>
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

/* lanes() of 16 vectors at once: out[j] = lanes(s[j]), every sum in the same order (lane 0 first), so the same
 * bits. A 16 x 16 transpose turns sixteen chains of scalar additions into sixteen vector additions. */
static inline v16 lanes16(const v16* s) {
#if defined(__AVX512F__)
  __m512 t[16], u[16], col[16];
  for (int i = 0; i < 16; i += 2) { /* per 128-bit lane: rows i, i + 1 interleaved */
    t[i] = _mm512_unpacklo_ps((__m512)s[i], (__m512)s[i + 1]);
    t[i + 1] = _mm512_unpackhi_ps((__m512)s[i], (__m512)s[i + 1]);
  }
  for (int g = 0; g < 16; g += 4) { /* u[g + c]: rows g..g + 3 of columns c, c + 4, c + 8, c + 12 */
    u[g] = _mm512_shuffle_ps(t[g], t[g + 2], 0x44);
    u[g + 1] = _mm512_shuffle_ps(t[g], t[g + 2], 0xEE);
    u[g + 2] = _mm512_shuffle_ps(t[g + 1], t[g + 3], 0x44);
    u[g + 3] = _mm512_shuffle_ps(t[g + 1], t[g + 3], 0xEE);
  }
  for (int c = 0; c < 4; ++c) { /* col[j]: column j of every row */
    __m512 even = _mm512_shuffle_f32x4(u[c], u[4 + c], 0x88), odd = _mm512_shuffle_f32x4(u[c], u[4 + c], 0xDD);
    __m512 even2 = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], 0x88);
    __m512 odd2 = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], 0xDD);
    col[c] = _mm512_shuffle_f32x4(even, even2, 0x88);
    col[c + 8] = _mm512_shuffle_f32x4(even, even2, 0xDD);
    col[c + 4] = _mm512_shuffle_f32x4(odd, odd2, 0x88);
    col[c + 12] = _mm512_shuffle_f32x4(odd, odd2, 0xDD);
  }
  __m512 sum = _mm512_setzero_ps();
  for (int j = 0; j < 16; ++j) sum = _mm512_add_ps(sum, col[j]);
  return (v16)sum;
#else
  v16 out;
  for (int j = 0; j < 16; ++j) out[j] = lanes(s[j]);
  return out;
#endif
}

/* The body of a dot product (k below `body`, a multiple of 64) in the order every caller shares: four 16-lane
 * accumulators over k, folded as (a0 + a1) + (a2 + a3); its lanes are summed next, then the tail. */
static inline __attribute__((always_inline)) v16 fold(const void* w, const float* x, int64_t body, int kind) {
  v16 a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0};
  for (int64_t k = 0; k < body; k += 64) {
    a0 += weights(w, k, kind) * load_f32(x + k);
    a1 += weights(w, k + 16, kind) * load_f32(x + k + 16);
    a2 += weights(w, k + 32, kind) * load_f32(x + k + 32);
    a3 += weights(w, k + 48, kind) * load_f32(x + k + 48);
  }
  return (a0 + a1) + (a2 + a3);
}

/* fold() of one weight row with two activation rows, reading the weight once (the same bits as two folds). */
static inline __attribute__((always_inline)) void fold2(const void* w, const float* x0, const float* x1,
                                                        int64_t body, int kind, v16* f0, v16* f1) {
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
  *f0 = (a0 + a1) + (a2 + a3);
  *f1 = (c0 + c1) + (c2 + c3);
}

/* The tail of a dot product past `body`, after its lanes: fmaf, so that its rounding is the same for every weight
 * type, whatever the compiler contracts. */
static inline float tail(const void* w, const float* x, int64_t body, int64_t K, int kind, float t) {
  for (int64_t k = body; k < K; ++k) t = __builtin_fmaf(weight_at(w, k, kind), x[k], t);
  return t;
}

/* One dot product of a weight row with an activation row: fold(), its lanes, the tail. */
static inline __attribute__((always_inline)) float dot(const void* w, const float* x, int64_t K, int kind) {
  int64_t body = K - K % 64;
  return tail(w, x, body, K, kind, lanes(fold(w, x, body, kind)));
}

static inline float finish(float t, const float* scale, const float* b, int64_t n) {
  float v = scale ? t * scale[n] : t;
  return b ? v + b[n] : v;
}

static inline const void* weight_row(const void* w, int64_t n, int64_t K, int kind) {
  return kind == I8 ? (const void*)((const int8_t*)w + n * K)
         : kind == BF16 ? (const void*)((const uint16_t*)w + n * K) : (const void*)((const float*)w + n * K);
}

/* dot() of one weight row with two activation rows, reading the weight once (the same bits). */
static inline __attribute__((always_inline)) void dot2(const void* w, const float* x0, const float* x1, int64_t K,
                                                       float* t0, float* t1, int kind) {
  int64_t body = K - K % 64;
  v16 f0, f1;
  fold2(w, x0, x1, body, kind, &f0, &f1);
  *t0 = tail(w, x0, body, K, kind, lanes(f0));
  *t1 = tail(w, x1, body, K, kind, lanes(f1));
}

/* y[m, n] = scale[n] * (x[m, :] . w[n, :]) + b[n] for every m (scale, b optional), two rows at a time. */
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

enum { BLOCK_N = 16, TILE_M = 4, TILE_N = 4 }; /* weight rows whose lanes are summed together; a tile's rows */

/* One of dot()'s four accumulators (the lanes at k = phase mod 64) for `rows` (1..TILE_M, a constant where inlined)
 * activation rows x and TILE_N weight rows w[j]: acc[r][j] += w[j][k..] * x[r][k..] over k in order, exactly as
 * dot() adds them. Holding one accumulator per pair, a tile reads each weight and activation vector once for
 * rows x TILE_N products. */
static inline __attribute__((always_inline)) void tile_phase(const void* const* w, const float* x, int64_t K,
                                                             int64_t body, int64_t phase, int kind, int rows,
                                                             v16 acc[TILE_M][TILE_N]) {
  v16 a[TILE_M][TILE_N];
  for (int r = 0; r < TILE_M; ++r)
    for (int j = 0; j < TILE_N; ++j) a[r][j] = (v16){0};
  for (int64_t k = phase; k < body; k += 64) {
    v16 wv[TILE_N];
    for (int j = 0; j < TILE_N; ++j) wv[j] = weights(w[j], k, kind);
    for (int r = 0; r < rows; ++r) {
      v16 xv = load_f32(x + r * K + k);
      for (int j = 0; j < TILE_N; ++j) a[r][j] += wv[j] * xv;
    }
  }
  for (int r = 0; r < rows; ++r)
    for (int j = 0; j < TILE_N; ++j) acc[r][j] = a[r][j];
}

/* fold() of TILE_N weight rows with `rows` activation rows into folded[r][j] (the same bits): each accumulator
 * in turn, then (a0 + a1) + (a2 + a3). */
static inline __attribute__((always_inline)) void tile_fold(const void* const* w, const float* x, int64_t K,
                                                            int64_t body, int kind, int rows,
                                                            v16 folded[TILE_M][BLOCK_N], int j0) {
  v16 part[4][TILE_M][TILE_N];
  for (int c = 0; c < 4; ++c) tile_phase(w, x, K, body, 16 * c, kind, rows, part[c]);
  for (int r = 0; r < rows; ++r)
    for (int j = 0; j < TILE_N; ++j)
      folded[r][j0 + j] = (part[0][r][j] + part[1][r][j]) + (part[2][r][j] + part[3][r][j]);
}

/* row_products() for the 16 weight rows from n0 on (w points to row n0), the same bits: tiles of activation rows
 * and weight rows fold their products, then sixteen outputs' lanes are summed at once (lanes16). */
static inline __attribute__((always_inline)) void block_products(const void* w, const float* x, const float* scale,
                                                                 const float* b, float* y, int64_t n0, int64_t M,
                                                                 int64_t N, int64_t K, int kind) {
  int64_t body = K - K % 64;
  v16 folded[TILE_M][BLOCK_N];
  for (int64_t m0 = 0; m0 < M; m0 += TILE_M) {
    int rows = M - m0 < TILE_M ? (int)(M - m0) : TILE_M;
    const float* xm = x + m0 * K;
    for (int j0 = 0; j0 < BLOCK_N; j0 += TILE_N) {
      const void* wj[TILE_N];
      for (int j = 0; j < TILE_N; ++j) wj[j] = weight_row(w, j0 + j, K, kind);
      /* The next TILE_N weight rows (the next block's first ones after the last) are read a line in four at a time
       * below, which a hardware prefetcher need not follow: fetched ahead here, each line once. */
      if (m0 == 0) {
        const char* next = (const char*)weight_row(w, j0 + TILE_N, K, kind);
        const char* end = (const char*)weight_row(w, j0 + 2 * TILE_N, K, kind);
        for (const char* at = next; at < end; at += 64) __builtin_prefetch(at, 0, 3);
      }
      switch (rows) { /* a constant row count for each inlined copy */
        case 1: tile_fold(wj, xm, K, body, kind, 1, folded, j0); break;
        case 2: tile_fold(wj, xm, K, body, kind, 2, folded, j0); break;
        case 3: tile_fold(wj, xm, K, body, kind, 3, folded, j0); break;
        default: tile_fold(wj, xm, K, body, kind, 4, folded, j0); break;
      }
    }
    for (int r = 0; r < rows; ++r) {
      v16 sums = lanes16(folded[r]);
      for (int j = 0; j < BLOCK_N; ++j)
        y[(m0 + r) * N + n0 + j] = finish(tail(weight_row(w, j, K, kind), xm + r * K, body, K, kind, sums[j]), scale,
                                          b, n0 + j);
    }
  }
}

/* y = x . w^T for every row of x (scale, b optional), inside a parallel region: the threads share out the weight
 * rows, each streamed once. One row takes each weight row in turn (a step, memory-bound); more take blocks of 16
 * weight rows in tiles (block_products: 1.2-2.5x as fast from 4 rows on, in cache on an Intel Xeon; a pass of
 * `base` over 2 tokens 1.2-1.3x); the bits are the same either way. */
static inline __attribute__((always_inline)) void products(const void* w, const float* x, const float* scale,
                                                           const float* b, float* y, int64_t M, int64_t N, int64_t K,
                                                           int kind) {
  int64_t blocks = M > 1 ? N / BLOCK_N : 0;
  #pragma omp for schedule(static) nowait
  for (int64_t i = 0; i < blocks; ++i)
    block_products(weight_row(w, i * BLOCK_N, K, kind), x, scale, b, y, i * BLOCK_N, M, N, K, kind);
  #pragma omp for schedule(static)
  for (int64_t n = blocks * BLOCK_N; n < N; ++n)
    row_products(weight_row(w, n, K, kind), x, scale, b, y, n, M, N, K, kind);
}

/* ---- Products over a weight packed for them -------------------------------------------------------------------
 *
 * products() reads a weight as it is stored, row by row, so each output's sum runs along k in vector lanes that
 * are added up at the end: for a few activation rows its tiles spend as much on those sums and on reloading the
 * activations as on the products (24 rows of a 1536 x 512 weight in cache: ~130 GFLOP/s on an Intel Xeon).
 * packed_products() reads a copy packed once per model, in blocks of PACK_N outputs laid out k-major
 * (`[N / PACK_N][K][PACK_N]`, zero past the last output): a tile of PACK_ROWS activation rows by PACK_N outputs
 * keeps 24 vector accumulators, loads four weight vectors for each k and multiplies them by each row's x[k]
 * broadcast, one output per lane (~290 GFLOP/s in the same case; over a step's 88 MB of weights 1.3-1.6x for 8-24
 * rows, one row no slower, docs/precision.md). Every output sums its k in blocks of PACK_K, each block from zero
 * and in order, then the blocks in order: the same bits for a row whatever the row count or the thread count, and,
 * blocked, about the accuracy of products()'s partial sums. */
enum { PACK_N = 64, PACK_K = 64, PACK_ROWS = 6 };

/* a + w * x[lane] rounded once, as a fused multiply-add (the same bits however the compiler would contract). */
static inline v16 fma_splat(v16 w, float x, v16 a) {
#if defined(__AVX512F__)
  return (v16)_mm512_fmadd_ps((__m512)w, _mm512_set1_ps(x), (__m512)a);
#else
  for (int i = 0; i < 16; ++i) a[i] = __builtin_fmaf(w[i], x, a[i]);
  return a;
#endif
}

/* One tile: `rows` (1..PACK_ROWS, a constant where inlined) activation rows x (stride K) by the PACK_N outputs of
 * packed block wb, over k in [k0, k1); the block's sums added to y's (stride N, outputs n0.. of N), or stored
 * where k0 is 0. */
static inline __attribute__((always_inline)) void packed_tile(const void* wb, const float* x, float* y, int64_t n0,
                                                              int64_t N, int64_t K, int64_t k0, int64_t k1, int rows,
                                                              int kind, int ahead) {
  v16 acc[PACK_ROWS][4];
  for (int r = 0; r < PACK_ROWS; ++r)
    for (int j = 0; j < 4; ++j) acc[r][j] = (v16){0};
  int64_t bytes = kind == F32 ? 4 : kind == BF16 ? 2 : 1; /* a weight's */
  for (int64_t k = k0; k < k1; ++k) {
    /* The first tile of rows fetches the block's next PACK_K values of k ahead, which the products of many rows
     * would otherwise wait on: with a tile's arithmetic between loads the hardware's prefetcher falls behind. */
    if (ahead && k + PACK_K < K)
      for (int64_t at = 0; at < PACK_N * bytes; at += 64)
        __builtin_prefetch((const char*)wb + (k + PACK_K) * PACK_N * bytes + at, 0, 3);
    v16 w0 = weights(wb, k * PACK_N, kind), w1 = weights(wb, k * PACK_N + 16, kind),
        w2 = weights(wb, k * PACK_N + 32, kind), w3 = weights(wb, k * PACK_N + 48, kind);
    for (int r = 0; r < rows; ++r) {
      float xk = x[r * K + k];
      acc[r][0] = fma_splat(w0, xk, acc[r][0]);
      acc[r][1] = fma_splat(w1, xk, acc[r][1]);
      acc[r][2] = fma_splat(w2, xk, acc[r][2]);
      acc[r][3] = fma_splat(w3, xk, acc[r][3]);
    }
  }
  for (int r = 0; r < rows; ++r)
    for (int j = 0; j < 4; ++j) {
      float* out = y + r * N + n0 + 16 * j;
      int64_t valid = N - (n0 + 16 * j);
      if (valid >= 16) {
        v16 sum = acc[r][j];
        if (k0 > 0) sum = load_f32(out) + sum;
        memcpy(out, &sum, sizeof sum);
      } else {
        for (int64_t i = 0; i < valid; ++i) out[i] = k0 > 0 ? out[i] + acc[r][j][i] : acc[r][j][i];
      }
    }
}

/* y = x . w^T (times scale, plus b: both optional) for every row of x, w packed as above, inside a parallel
 * region: the threads share out the blocks of outputs. Each block takes PACK_K of its k at a time for every tile
 * of rows, so that part of the weight stays in the L1 cache while the rows' tiles read it. */
static inline __attribute__((always_inline)) void packed_products(const void* wp, const float* x, const float* scale,
                                                                  const float* b, float* y, int64_t M, int64_t N,
                                                                  int64_t K, int kind) {
  int64_t blocks = (N + PACK_N - 1) / PACK_N;
  #pragma omp for schedule(static)
  for (int64_t nb = 0; nb < blocks; ++nb) {
    const void* wb = weight_row(wp, nb * PACK_N, K, kind);
    int64_t n0 = nb * PACK_N;
    for (int64_t k0 = 0; k0 < K; k0 += PACK_K) {
      int64_t k1 = K - k0 < PACK_K ? K : k0 + PACK_K;
      for (int64_t m0 = 0; m0 < M; m0 += PACK_ROWS) {
        const float* xm = x + m0 * K;
        float* ym = y + m0 * N;
        switch (M - m0 < PACK_ROWS ? M - m0 : PACK_ROWS) { /* a constant row count for each inlined copy */
          case 1: packed_tile(wb, xm, ym, n0, N, K, k0, k1, 1, kind, m0 == 0); break;
          case 2: packed_tile(wb, xm, ym, n0, N, K, k0, k1, 2, kind, m0 == 0); break;
          case 3: packed_tile(wb, xm, ym, n0, N, K, k0, k1, 3, kind, m0 == 0); break;
          case 4: packed_tile(wb, xm, ym, n0, N, K, k0, k1, 4, kind, m0 == 0); break;
          case 5: packed_tile(wb, xm, ym, n0, N, K, k0, k1, 5, kind, m0 == 0); break;
          default: packed_tile(wb, xm, ym, n0, N, K, k0, k1, 6, kind, m0 == 0); break;
        }
      }
    }
    if (K == 0)
      for (int64_t m = 0; m < M; ++m)
        for (int64_t n = n0; n < N && n < n0 + PACK_N; ++n) y[m * N + n] = 0.f;
    if (scale || b)
      for (int64_t m = 0; m < M; ++m)
        for (int64_t n = n0; n < N && n < n0 + PACK_N; ++n) y[m * N + n] = finish(y[m * N + n], scale, b, n);
  }
}

void rowdot_f32(const float* x, const float* w, const float* b, float* y, int64_t M, int64_t N, int64_t K,
                int threads) {
  #pragma omp parallel num_threads(threads)
  products(w, x, NULL, b, y, M, N, K, F32);
}

void rowdot_bf16(const float* x, const uint16_t* w, const float* b, float* y, int64_t M, int64_t N, int64_t K,
                 int threads) {
  #pragma omp parallel num_threads(threads)
  products(w, x, NULL, b, y, M, N, K, BF16);
}

/* Weight-only int8 with one scale per output row: y = scale[n] * (x . w_int8[n]) + b[n]. */
void rowdot_i8(const float* x, const int8_t* w, const float* scale, const float* b, float* y, int64_t M, int64_t N,
               int64_t K, int threads) {
  #pragma omp parallel num_threads(threads)
  products(w, x, scale, b, y, M, N, K, I8);
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

/* ---- A whole decoder step in one call -------------------------------------------------------------------------
 *
 * A decoder step of a few rows runs ~50 small operations (a draft's two layers, a model's six), each costing
 * more in dispatch than its arithmetic: base-draft:int8's pass took 1.4 ms in decoding where reading its weights
 * takes a fraction of that, and base's ~1 ms more than its products and attention. decoder_step runs the layers of
 * a Whisper decoder (pre-norm self-attention over the cache, cross-attention over the encoder frames, GELU MLP)
 * and the final norm for a few new tokens in one parallel region. Every row is computed on its own, in one fixed
 * order whatever the row count (products by dot(), attention and norms row by row), so a check of drafts gives
 * each row a one-token step's bits. A draft may read the cross-attention keys and values in bfloat16 (half the
 * bytes of its step): it only proposes tokens that the model then checks. */

enum { BLOCK_ROWS = 4 }; /* query rows the attention kernels take at a time (a step of more, in blocks) */
enum { SCORE_TILES = 4 }; /* key tiles a score pass of one or two rows takes at a time */

typedef struct {
  const void* w;       /* [n, k] float32, bfloat16 or int8 (kind) */
  const float* scale;  /* [n] for int8, else NULL */
  const float* bias;   /* [n] or NULL */
  int64_t n, k;
  int64_t kind;
  const void* packed;  /* w packed for packed_products() (the same kind), or NULL: products() over w */
} step_linear;

typedef struct {
  const float *norm_self_w, *norm_self_b;
  step_linear q, k, v, out;
  const float *norm_cross_w, *norm_cross_b;
  step_linear cross_q, cross_out;
  /* float32 or bfloat16 (the model's cross_kind). Keys in tiles of 16 frames, each tile head_dim rows of 16
   * (frame-minor: [heads, tiles, head_dim, 16], zero past the last frame), so one query's scores for 16 frames
   * are head_dim vector products with no horizontal sum; values [heads, frames, head_dim]. */
  const void *cross_k, *cross_v;
  const float *norm_ffn_w, *norm_ffn_b;
  step_linear fc1, fc2;
} step_layer;

typedef struct {
  int64_t layers, d, heads, frames, ffn, capacity;
  int64_t cross_kind; /* F32 or BF16 */
  int64_t embed_kind; /* the token table's: F32 or BF16 */
  float eps;
  const step_layer* layer;
  const void* embed_tokens;                     /* [vocab, d] (embed_kind) */
  const float* embed_positions;                 /* float32 [positions, d] */
  const float *norm_w, *norm_b;                 /* the final layer norm */
  /* decoder_step_windows: elements from one stored window's cross-attention keys (tiles) and values to the next */
  int64_t window_k, window_v;
} step_model;

static inline float hsum(v16 s) {
#if defined(__AVX512F__)
  return _mm512_reduce_add_ps((__m512)s);
#else
  return lanes(s);
#endif
}

/* out = x . w (+ b) for rows of x (inside a parallel region): over the packed copy where the model has one, else
 * the weight rows shared out among the threads. */
static void step_product(const step_linear* l, const float* x, float* y, int64_t rows) {
  if (l->packed) {
    if (l->kind == I8) packed_products(l->packed, x, l->scale, l->bias, y, rows, l->n, l->k, I8);
    else if (l->kind == BF16) packed_products(l->packed, x, NULL, l->bias, y, rows, l->n, l->k, BF16);
    else packed_products(l->packed, x, NULL, l->bias, y, rows, l->n, l->k, F32);
  } else if (l->kind == I8) products(l->w, x, l->scale, l->bias, y, rows, l->n, l->k, I8);
  else if (l->kind == BF16) products(l->w, x, NULL, l->bias, y, rows, l->n, l->k, BF16);
  else products(l->w, x, NULL, l->bias, y, rows, l->n, l->k, F32);
}

/* A step's product on its own, over a weight packed as pack() lays it out: kind 0 float32, 1 bfloat16, 2 int8 (with
 * scale). */
void rowdot_packed(const float* x, const void* w, const float* scale, const float* b, float* y, int64_t M, int64_t N,
                   int64_t K, int64_t kind, int threads) {
  step_linear l = {NULL, scale, b, N, K, kind, w};
  #pragma omp parallel num_threads(threads)
  step_product(&l, x, y, M);
}

static void layer_norm_rows(const float* x, const float* g, const float* b, float* y, int64_t rows, int64_t d,
                            float eps) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * d;
    double mean = 0, var = 0;
    for (int64_t i = 0; i < d; ++i) mean += xr[i];
    mean /= d;
    for (int64_t i = 0; i < d; ++i) var += (xr[i] - mean) * (xr[i] - mean);
    float inv = 1.f / sqrtf((float)(var / d) + eps);
    for (int64_t i = 0; i < d; ++i) y[r * d + i] = (float)(xr[i] - mean) * inv * g[i] + b[i];
  }
}

#if defined(__AVX512F__)
#include "vector_exp.h"

/* s = softmax(s) over n scores, 16 lanes at a time (the same order for every row). */
static void softmax_row(float* s, int64_t n) {
  int64_t body = n - n % 16;
  __m512 top16 = _mm512_set1_ps(-INFINITY);
  for (int64_t i = 0; i < body; i += 16) top16 = _mm512_max_ps(top16, _mm512_loadu_ps(s + i));
  float top = _mm512_reduce_max_ps(top16);
  for (int64_t i = body; i < n; ++i) top = s[i] > top ? s[i] : top;
  __m512 shift = _mm512_set1_ps(top), total16 = _mm512_setzero_ps();
  for (int64_t i = 0; i < body; i += 16) {
    __m512 e = exp16(_mm512_sub_ps(_mm512_loadu_ps(s + i), shift));
    _mm512_storeu_ps(s + i, e);
    total16 = _mm512_add_ps(total16, e);
  }
  float total = _mm512_reduce_add_ps(total16);
  if (body < n) {
    __mmask16 tail = (__mmask16)((1u << (n - body)) - 1);
    __m512 e = exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(tail, s + body), shift));
    _mm512_mask_storeu_ps(s + body, tail, e);
    total += _mm512_mask_reduce_add_ps(tail, e);
  }
  __m512 inv = _mm512_set1_ps(1.f / total);
  for (int64_t i = 0; i < body; i += 16) _mm512_storeu_ps(s + i, _mm512_mul_ps(_mm512_loadu_ps(s + i), inv));
  for (int64_t i = body; i < n; ++i) s[i] *= 1.f / total;
}
#else
static void softmax_row(float* s, int64_t n) {
  float top = -INFINITY;
  for (int64_t i = 0; i < n; ++i) top = s[i] > top ? s[i] : top;
  float total = 0.f;
  for (int64_t i = 0; i < n; ++i) total += (s[i] = expf(s[i] - top));
  for (int64_t i = 0; i < n; ++i) s[i] /= total;
}
#endif

/* out[r0 + r] = sum_t scores[r0 + r, t] values[t] for the `block` rows from r0 (1..BLOCK_ROWS) and the `chunks`
 * vectors of features from k0 (1..4), both constants where inlined so that the sums stay in registers, over t in
 * [from, to): from 0, or on from the sums already in out (a span at a time). Each value vector is read once for the
 * block, and every output element sums over t in order. */
static inline __attribute__((always_inline)) void value_block(const float* scores, int64_t stride,
                                                              const void* values, int64_t visible, int causal,
                                                              int kind, int64_t hd, int64_t r0, int block,
                                                              int64_t from, int64_t to, int64_t k0, int chunks,
                                                              float* out, int64_t out_stride) {
  v16 a[BLOCK_ROWS][4];
  for (int r = 0; r < block; ++r)
    for (int c = 0; c < chunks; ++c) {
      if (from == 0) a[r][c] = (v16){0};
      else memcpy(&a[r][c], out + (r0 + r) * out_stride + k0 + 16 * c, sizeof(v16));
    }
  for (int64_t t = from; t < to; ++t) {
    v16 w[4];
    for (int c = 0; c < chunks; ++c) w[c] = weights(values, t * hd + k0 + 16 * c, kind);
    for (int r = 0; r < block; ++r) {
      if (causal && t >= visible + r0 + r) continue;
      float p = scores[(r0 + r) * stride + t];
      for (int c = 0; c < chunks; ++c) a[r][c] += p * w[c];
    }
  }
  for (int r = 0; r < block; ++r)
    for (int c = 0; c < chunks; ++c) memcpy(out + (r0 + r) * out_stride + k0 + 16 * c, &a[r][c], sizeof(v16));
}

/* Frames a span of the cross-attention takes for every block of rows before the next: a head's keys (or values)
 * for them, 128 KB in float32, then stay in the L2 cache, not read again from memory for each block. */
enum { SPAN_FRAMES = 512 };

/* out[r] = sum_t scores[r, t] values[t] for rows r of one head (values [count, hd], float32 or bfloat16), row r
 * over its first visible + r values (causal) or all count of them. Blocks of BLOCK_ROWS rows read each value row
 * once a span, 64 features at a time; every output element sums over t in order, whatever the row count. */
static inline __attribute__((always_inline)) void weighted_values(const float* scores, int64_t stride,
                                                                  const void* values, int64_t count,
                                                                  int64_t visible, int causal, int kind, int64_t hd,
                                                                  int64_t rows, float* out, int64_t out_stride) {
  for (int64_t from = 0; from < count || from == 0; from += SPAN_FRAMES)
    for (int64_t r0 = 0; r0 < rows; r0 += BLOCK_ROWS) {
      int block = rows - r0 < BLOCK_ROWS ? (int)(rows - r0) : BLOCK_ROWS;
      int64_t seen = causal ? visible + r0 + block - 1 : count;  /* the values the block's last row sees */
      int64_t to = seen - from < SPAN_FRAMES ? seen : from + SPAN_FRAMES;
      if (to < from) to = from;
      for (int64_t k0 = 0; k0 < hd; k0 += 64) {
        int chunks = hd - k0 < 64 ? (int)(hd - k0) / 16 : 4;
#define VALUES(B, C) value_block(scores, stride, values, visible, causal, kind, hd, r0, B, from, to, k0, C, out, \
                                 out_stride)
        if (chunks == 4) {
          switch (block) {
            case 1: VALUES(1, 4); break;
            case 2: VALUES(2, 4); break;
            case 3: VALUES(3, 4); break;
            default: VALUES(4, 4); break;
          }
        } else {
          VALUES(block, chunks);
        }
#undef VALUES
      }
    }
}

/* Self-attention of one head: out[r] = softmax(q[r] . keys / sqrt(hd)) . values, keys and values [count, hd]
 * float32, row r over the first visible + r of them. The rows share one pass over the keys; each row's sums run
 * in the same order whatever the row count. `scores` holds rows * stride floats. */
static inline __attribute__((always_inline)) void attend(const float* q, int64_t q_stride, const float* keys,
                                                         const float* values, int64_t visible, int64_t hd,
                                                         int64_t rows, float* scores, int64_t stride, float* out,
                                                         int64_t out_stride) {
  float scale = 1.f / sqrtf((float)hd);
  for (int64_t t = 0; t < visible + rows - 1; ++t)
    for (int64_t r = 0; r < rows; ++r) {
      if (t >= visible + r) continue;
      const float* qr = q + r * q_stride;
      v16 a = {0};
      for (int64_t k = 0; k < hd; k += 16) a += load_f32(keys + t * hd + k) * load_f32(qr + k);
      scores[r * stride + t] = hsum(a) * scale;
    }
  for (int64_t r = 0; r < rows; ++r) softmax_row(scores + r * stride, visible + r);
  weighted_values(scores, stride, values, visible + rows - 1, visible, 1, F32, hd, rows, out, out_stride);
}

/* Scores of `block` (1..BLOCK_ROWS, a constant where inlined) query rows over keys in tiles of 16 frames
 * (step_layer's cross_k layout): each score sums q[k] key[k] over k in order, in its own lane. */
static inline __attribute__((always_inline)) void tile_scores(const float* q, int64_t q_stride, const void* tiles,
                                                              int64_t first, int64_t last, int kind, int64_t hd,
                                                              int block, float scale, float* scores, int64_t stride) {
  int64_t tile = first;
  /* One or two rows: SCORE_TILES tiles at a time. A tile's sum over k is one chain of dependent additions, which
   * for a row alone waited on each addition's latency; side by side the chains overlap. Each tile's sum keeps its
   * order, so the bits are those of one tile at a time. */
  if (block <= 2)
    for (; tile + SCORE_TILES <= last; tile += SCORE_TILES) {
      v16 a[2][SCORE_TILES] = {{{0}}};
      for (int64_t k = 0; k < hd; ++k) {
        v16 w[SCORE_TILES];
        for (int j = 0; j < SCORE_TILES; ++j) w[j] = weights(tiles, ((tile + j) * hd + k) * 16, kind);
        for (int r = 0; r < block; ++r)
          for (int j = 0; j < SCORE_TILES; ++j) a[r][j] += q[r * q_stride + k] * w[j];
      }
      for (int r = 0; r < block; ++r)
        for (int j = 0; j < SCORE_TILES; ++j) {
          v16 scaled = a[r][j] * scale;
          memcpy(scores + r * stride + (tile + j) * 16, &scaled, sizeof scaled);
        }
    }
  for (; tile < last; ++tile) {
    v16 a[BLOCK_ROWS] = {{0}};
    for (int64_t k = 0; k < hd; ++k) {
      v16 w = weights(tiles, (tile * hd + k) * 16, kind);
      for (int r = 0; r < block; ++r) a[r] += q[r * q_stride + k] * w;
    }
    for (int r = 0; r < block; ++r) {
      v16 scaled = a[r] * scale;
      memcpy(scores + r * stride + tile * 16, &scaled, sizeof scaled);
    }
  }
}

/* Cross-attention of one head over `count` frames: keys in tiles (step_layer's cross_k), values [count, hd];
 * float32 or bfloat16 (kind). `scores` holds rows * stride floats, stride at least the tiles' frames. */
static inline __attribute__((always_inline)) void attend_cross(const float* q, int64_t q_stride, const void* tiles,
                                                               const void* values, int64_t count, int kind,
                                                               int64_t hd, int64_t rows, float* scores,
                                                               int64_t stride, float* out, int64_t out_stride) {
  float scale = 1.f / sqrtf((float)hd);
  int64_t tile_count = (count + 15) / 16, span = SPAN_FRAMES / 16;
  for (int64_t first = 0; first < tile_count; first += span) {
    int64_t last = tile_count - first < span ? tile_count : first + span;
    for (int64_t r0 = 0; r0 < rows; r0 += BLOCK_ROWS) {
      const float* qb = q + r0 * q_stride;
      float* sb = scores + r0 * stride;
      switch (rows - r0 < BLOCK_ROWS ? rows - r0 : BLOCK_ROWS) {
        case 1: tile_scores(qb, q_stride, tiles, first, last, kind, hd, 1, scale, sb, stride); break;
        case 2: tile_scores(qb, q_stride, tiles, first, last, kind, hd, 2, scale, sb, stride); break;
        case 3: tile_scores(qb, q_stride, tiles, first, last, kind, hd, 3, scale, sb, stride); break;
        default: tile_scores(qb, q_stride, tiles, first, last, kind, hd, 4, scale, sb, stride); break;
      }
    }
  }
  for (int64_t r = 0; r < rows; ++r) softmax_row(scores + r * stride, count);
  weighted_values(scores, stride, values, count, 0, 0, kind, hd, rows, out, out_stride);
}

#if defined(__AVX512F__)
/* GELU(x) = x / 2 (1 + erf(x / sqrt 2)), 16 at a time: 1 + erf(z) from erf's complement by Abramowitz and Stegun
 * 7.1.26 (absolute error below 1.5e-7) and exp16; within 1.7e-7 max(1, |x|) of the exact GELU, as glibc's erff is
 * within 1.0e-7, at a thirtieth of its time. One formula for every element: a row's bits do not depend on the
 * rows beside it. */
static inline __m512 gelu16(__m512 x) {
  const __m512 one = _mm512_set1_ps(1.f);
  __m512 z = _mm512_mul_ps(x, _mm512_set1_ps(0.70710678118654752f));
  __m512 az = _mm512_abs_ps(z);
  __m512 t = _mm512_div_ps(one, _mm512_fmadd_ps(_mm512_set1_ps(0.3275911f), az, one));
  __m512 p = _mm512_set1_ps(1.061405429f);
  p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(-1.453152027f));
  p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(1.421413741f));
  p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(-0.284496736f));
  p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(0.254829592f));
  __m512 gauss = exp16(_mm512_sub_ps(_mm512_setzero_ps(), _mm512_mul_ps(az, az)));
  __m512 complement = _mm512_mul_ps(_mm512_mul_ps(p, t), gauss);
  __mmask16 positive = _mm512_cmp_ps_mask(z, _mm512_setzero_ps(), _CMP_GE_OQ);
  __m512 one_plus_erf = _mm512_mask_sub_ps(complement, positive, _mm512_set1_ps(2.f), complement);
  return _mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(0.5f), x), one_plus_erf);
}

/* f = GELU(f) over n values, inside a parallel region (the threads share out the vectors). */
static void gelu_values(float* f, int64_t n) {
  #pragma omp for schedule(static)
  for (int64_t v = 0; v < (n + 15) / 16; ++v) {
    int64_t i = v * 16;
    __mmask16 lanes = n - i >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (n - i)) - 1);
    _mm512_mask_storeu_ps(f + i, lanes, gelu16(_mm512_maskz_loadu_ps(lanes, f + i)));
  }
}
#else
static float gelu(float x) { return 0.5f * x * (1.f + erff(x * 0.70710678118654752f)); }

static void gelu_values(float* f, int64_t n) {
  #pragma omp for schedule(static)
  for (int64_t i = 0; i < n; ++i) f[i] = gelu(f[i]);
}
#endif

/* The parts of a layer's step that decoder_step and decoder_step_windows share, each called by every thread of
 * their parallel region (one thread norms, the products share out weight rows). */

/* A step's scratch for `rows` rows: the residual stream x, its norm h, queries/keys/values qkv [3, rows, d], the
 * attention's output a [rows, d], the MLP's f [rows, ffn], then each thread's scores (score_len floats a row). */
typedef struct {
  float *x, *h, *qkv, *a, *f, *scores;
  int64_t score_len;
} step_buffers;

static step_buffers carve(const step_model* m, float* scratch, int64_t rows) {
  step_buffers s;
  int64_t d = m->d, tiles = (m->frames + 15) / 16 * 16;
  s.x = scratch;
  s.h = s.x + rows * d;
  s.qkv = s.h + rows * d;
  s.a = s.qkv + rows * 3 * d;
  s.f = s.a + rows * d;
  s.scores = s.f + rows * m->ffn;
  s.score_len = tiles > m->capacity ? tiles : m->capacity;
  return s;
}

/* x [d] = the token's embedding + the position's. */
static void embed(const step_model* m, int64_t id, int64_t position, float* x) {
  for (int64_t i = 0; i < m->d; ++i)
    x[i] = weight_at(m->embed_tokens, id * m->d + i, (int)m->embed_kind) + m->embed_positions[position * m->d + i];
}

/* x += h (the residual), then h = layer_norm(x) where a norm is given. */
static void add_and_norm(float* x, float* h, const float* w, const float* b, int64_t rows, int64_t d, float eps) {
  #pragma omp single
  {
    for (int64_t i = 0; i < rows * d; ++i) x[i] += h[i];
    if (w) layer_norm_rows(x, w, b, h, rows, d, eps);
  }
}

/* h = the self-attention's norm of x; its queries, keys and values into qkv [3, rows, d]. */
static void self_projections(const step_model* m, const step_layer* L, const float* x, float* h, float* qkv,
                             int64_t rows) {
  #pragma omp single
  layer_norm_rows(x, L->norm_self_w, L->norm_self_b, h, rows, m->d, m->eps);
  step_product(&L->q, h, qkv, rows);
  step_product(&L->k, h, qkv + rows * m->d, rows);
  step_product(&L->v, h, qkv + 2 * rows * m->d, rows);
}

/* After the self-attention (its output in a): the residual, the cross-attention's norm and queries (into qkv). */
static void cross_queries(const step_model* m, const step_layer* L, float* x, float* h, const float* a, float* qkv,
                          int64_t rows) {
  step_product(&L->out, a, h, rows);
  add_and_norm(x, h, L->norm_cross_w, L->norm_cross_b, rows, m->d, m->eps);
  step_product(&L->cross_q, h, qkv, rows);
}

/* Cross-attention of head g of stored window `window` for `rows` query rows q (stride d) into out (stride d): over
 * the keys (tiles) and values step_layer points to, in the model's cross_kind. */
static inline __attribute__((always_inline)) void cross_head(const step_model* m, const step_layer* L,
                                                             int64_t window, int64_t g, const float* q, int64_t rows,
                                                             float* scores, int64_t score_len, float* out) {
  const int64_t d = m->d, hd = d / m->heads, T = m->frames;
  int64_t k = window * m->window_k + g * ((T + 15) / 16 * 16 * hd), v = window * m->window_v + g * T * hd;
  if (m->cross_kind == BF16)
    attend_cross(q, d, (const uint16_t*)L->cross_k + k, (const uint16_t*)L->cross_v + v, T, BF16, hd, rows, scores,
                 score_len, out, d);
  else
    attend_cross(q, d, (const float*)L->cross_k + k, (const float*)L->cross_v + v, T, F32, hd, rows, scores,
                 score_len, out, d);
}

/* After the cross-attention (its output in a): the residual and the GELU MLP with its residual. */
static void feed_forward(const step_model* m, const step_layer* L, float* x, float* h, const float* a, float* f,
                         int64_t rows) {
  step_product(&L->cross_out, a, h, rows);
  add_and_norm(x, h, L->norm_ffn_w, L->norm_ffn_b, rows, m->d, m->eps);
  step_product(&L->fc1, h, f, rows);
  gelu_values(f, rows * m->ffn);
  step_product(&L->fc2, f, h, rows);
  add_and_norm(x, h, NULL, NULL, rows, m->d, m->eps);
}

/* One step of a decoder over `rows` new tokens `ids` at positions start.. (its cache filled up to start): writes the
 * new keys and values into `keys`/`values` ([layers, heads, capacity, head_dim] float32) and the final-normed
 * hidden states of the last `outputs` rows into `out` [outputs, d]. `scratch` holds
 * rows * (6 d + ffn + threads * max(frames rounded up to 16, capacity)) floats. Head dims multiples of 16. */
void decoder_step(const step_model* m, const int64_t* ids, int64_t rows, int64_t start, float* keys, float* values,
                float* scratch, float* out, int64_t outputs, int threads) {
  const int64_t d = m->d, H = m->heads, hd = d / H, cap = m->capacity;
  step_buffers s = carve(m, scratch, rows);
  float *x = s.x, *h = s.h, *qkv = s.qkv, *a = s.a, *f = s.f, *score_base = s.scores;
  int64_t score_len = s.score_len;
  for (int64_t r = 0; r < rows; ++r) embed(m, ids[r], start + r, x + r * d);
  #pragma omp parallel num_threads(threads)
  {
#if defined(_OPENMP)
    float* scores = score_base + omp_get_thread_num() * rows * score_len;
#else
    float* scores = score_base;
#endif
    for (int64_t l = 0; l < m->layers; ++l) {
      const step_layer* L = m->layer + l;
      float* lk = keys + l * H * cap * hd;
      float* lv = values + l * H * cap * hd;
      self_projections(m, L, x, h, qkv, rows);
      #pragma omp single
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t g = 0; g < H; ++g) {
          memcpy(lk + (g * cap + start + r) * hd, qkv + (rows + r) * d + g * hd, hd * sizeof(float));
          memcpy(lv + (g * cap + start + r) * hd, qkv + (2 * rows + r) * d + g * hd, hd * sizeof(float));
        }
      #pragma omp for schedule(static)
      for (int64_t g = 0; g < H; ++g)
        attend(qkv + g * hd, d, lk + g * cap * hd, lv + g * cap * hd, start + 1, hd, rows, scores, score_len,
               a + g * hd, d);
      cross_queries(m, L, x, h, a, qkv, rows);
      #pragma omp for schedule(static)
      for (int64_t g = 0; g < H; ++g) cross_head(m, L, 0, g, qkv + g * hd, rows, scores, score_len, a + g * hd);
      feed_forward(m, L, x, h, a, f, rows);
    }
  }
  layer_norm_rows(x + (rows - outputs) * d, m->norm_w, m->norm_b, out, outputs, d, m->eps);
}

/* One new token for each of `windows` windows decoded together (a batch's rows), each row computed exactly as
 * decoder_step computes a one-token step of its window alone (the same order of every sum, so the same bits).
 * Row b's token ids[b] at position positions[b] is written at cache slot `slot` of row b (keys and values
 * [layers, windows, heads, capacity, head_dim] float32) and attends over its slots first[b]..slot: its own tokens
 * in order (a batch left-pads shorter prompts). Its cross-attention reads stored window stored[b]: the keys and
 * values step_layer points to, stored[b] * m->window_k (window_v) elements on. `out` [windows, d] gets the
 * final-normed hidden states; `scratch` holds windows * (6 d + ffn) + threads * max(frames rounded up to 16,
 * capacity) floats. */
void decoder_step_windows(const step_model* m, const int64_t* ids, const int64_t* positions, const int64_t* first,
                          const int64_t* stored, int64_t windows, int64_t slot, float* keys, float* values,
                          float* scratch, float* out, int threads) {
  const int64_t d = m->d, H = m->heads, hd = d / H, cap = m->capacity, B = windows;
  step_buffers s = carve(m, scratch, B);
  float *x = s.x, *h = s.h, *qkv = s.qkv, *a = s.a, *f = s.f, *score_base = s.scores;
  int64_t score_len = s.score_len;
  for (int64_t r = 0; r < B; ++r) embed(m, ids[r], positions[r], x + r * d);
  #pragma omp parallel num_threads(threads)
  {
#if defined(_OPENMP)
    float* scores = score_base + omp_get_thread_num() * score_len;
#else
    float* scores = score_base;
#endif
    for (int64_t l = 0; l < m->layers; ++l) {
      const step_layer* L = m->layer + l;
      float* lk = keys + l * B * H * cap * hd;
      float* lv = values + l * B * H * cap * hd;
      self_projections(m, L, x, h, qkv, B);
      #pragma omp single
      for (int64_t r = 0; r < B; ++r)
        for (int64_t g = 0; g < H; ++g) {
          memcpy(lk + ((r * H + g) * cap + slot) * hd, qkv + (B + r) * d + g * hd, hd * sizeof(float));
          memcpy(lv + ((r * H + g) * cap + slot) * hd, qkv + (2 * B + r) * d + g * hd, hd * sizeof(float));
        }
      #pragma omp for schedule(static)
      for (int64_t i = 0; i < B * H; ++i) {
        int64_t r = i / H, g = i % H;
        int64_t at = (r * H + g) * cap + first[r];
        attend(qkv + r * d + g * hd, d, lk + at * hd, lv + at * hd, slot - first[r] + 1, hd, 1, scores, score_len,
               a + r * d + g * hd, d);
      }
      cross_queries(m, L, x, h, a, qkv, B);
      #pragma omp for schedule(static)
      for (int64_t i = 0; i < B * H; ++i) {
        int64_t r = i / H, g = i % H;
        cross_head(m, L, stored[r], g, qkv + r * d + g * hd, 1, scores, score_len, a + r * d + g * hd);
      }
      feed_forward(m, L, x, h, a, f, B);
    }
  }
  layer_norm_rows(x, m->norm_w, m->norm_b, out, B, d, m->eps);
}

/* Build check: the caller compares this with the version it expects. */
int rowdot_version(void) { return 10; }
