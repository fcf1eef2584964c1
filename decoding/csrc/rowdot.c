/* Products of a few activation rows with a large weight matrix, for a decoder step on a CPU.
 *
 * y[m, n] = x[m, :] . w[n, :] (+ b[n]) for x [M, K] and w [N, K], both row-major. Each thread streams its own
 * contiguous block of weight rows once, and each dot product runs in one fixed order (four 16-lane float32
 * accumulators over k, then their lanes), so a row's result never depends on M, on the other rows or on the
 * number of threads: a check of drafts gives each row the bits a one-token step gives it.
 *
 * Built by decoding/native.py with the system's C compiler (-O3 -march=native -fopenmp); GCC's and Clang's
 * vector extensions map the 16-lane vectors onto AVX-512, AVX2 or NEON as the machine has them.
 */
#include <stdint.h>
#include <string.h>

typedef float v16 __attribute__((vector_size(64)));

static inline v16 load_f32(const float* p) {
  v16 v;
  memcpy(&v, p, sizeof v);
  return v;
}

static inline float lanes(v16 s) {
  float t = 0.f;
  for (int i = 0; i < 16; ++i) t += s[i];
  return t;
}

/* One dot product, in the order every caller shares. */
static inline float dot(const float* w, const float* x, int64_t K) {
  int64_t body = K - K % 64;
  v16 a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0};
  for (int64_t k = 0; k < body; k += 64) {
    a0 += load_f32(w + k) * load_f32(x + k);
    a1 += load_f32(w + k + 16) * load_f32(x + k + 16);
    a2 += load_f32(w + k + 32) * load_f32(x + k + 32);
    a3 += load_f32(w + k + 48) * load_f32(x + k + 48);
  }
  float t = lanes((a0 + a1) + (a2 + a3));
  for (int64_t k = body; k < K; ++k) t += w[k] * x[k];
  return t;
}

/* Two dot products over one weight row, each in exactly dot()'s order (the same bits), loading the weight once. */
static inline void dot2(const float* w, const float* x0, const float* x1, int64_t K, float* t0, float* t1) {
  int64_t body = K - K % 64;
  v16 a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0}, c0 = {0}, c1 = {0}, c2 = {0}, c3 = {0};
  for (int64_t k = 0; k < body; k += 64) {
    v16 w0 = load_f32(w + k), w1 = load_f32(w + k + 16), w2 = load_f32(w + k + 32), w3 = load_f32(w + k + 48);
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
    s0 += w[k] * x0[k];
    s1 += w[k] * x1[k];
  }
  *t0 = s0;
  *t1 = s1;
}

static inline void row_products(const float* wr, const float* x, const float* b, float* y, int64_t n, int64_t M,
                                int64_t N, int64_t K) {
  int64_t m = 0;
  for (; m + 1 < M; m += 2) {
    float t0, t1;
    dot2(wr, x + m * K, x + (m + 1) * K, K, &t0, &t1);
    y[m * N + n] = b ? t0 + b[n] : t0;
    y[(m + 1) * N + n] = b ? t1 + b[n] : t1;
  }
  if (m < M) {
    float t = dot(wr, x + m * K, K);
    y[m * N + n] = b ? t + b[n] : t;
  }
}

void rowdot_f32(const float* x, const float* w, const float* b, float* y, int64_t M, int64_t N, int64_t K,
                int threads) {
  #pragma omp parallel for num_threads(threads) schedule(static)
  for (int64_t n = 0; n < N; ++n) row_products(w + n * K, x, b, y, n, M, N, K);
}

/* The same over a bfloat16 weight, each row widened exactly to float32 (a bfloat16 is the upper half of a
 * float32) into a buffer first: the same sums as rowdot_f32 over the widened weight. */
void rowdot_bf16(const float* x, const uint16_t* w, const float* b, float* y, int64_t M, int64_t N, int64_t K,
                 int threads) {
  #pragma omp parallel num_threads(threads)
  {
    float row[K];
    #pragma omp for schedule(static)
    for (int64_t n = 0; n < N; ++n) {
      const uint16_t* wr = w + n * K;
      for (int64_t k = 0; k < K; ++k) {
        uint32_t bits = (uint32_t)wr[k] << 16;
        memcpy(row + k, &bits, 4);
      }
      row_products(row, x, b, y, n, M, N, K);
    }
  }
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
        scores[(g * R + r) * T + t] = dot(k + (g * T + t) * D, q + (g * R + r) * D, D);
}

void attention_values(const float* w, const float* v, float* out, int64_t G, int64_t R, int64_t T, int64_t D,
                      int threads) {
  #pragma omp parallel for num_threads(threads) schedule(static)
  for (int64_t g = 0; g < G; ++g)
    for (int64_t r = 0; r < R; ++r) {
      float* o = out + (g * R + r) * D;
      const float* wr = w + (g * R + r) * T;
      for (int64_t d = 0; d < D; ++d) o[d] = 0.f;
      for (int64_t t = 0; t < T; ++t) {
        const float* vt = v + (g * T + t) * D;
        float a = wr[t];
        for (int64_t d = 0; d < D; ++d) o[d] += a * vt[d];
      }
    }
}

/* Build check: the caller compares this with the version it expects. */
int rowdot_version(void) { return 1; }
