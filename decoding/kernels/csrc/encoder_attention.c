/* Self-attention of a bfloat16 encoder over all its frames, for CPUs with AVX512-BF16 but no AMX.
 *
 * PyTorch's flash attention for bfloat16 on such a CPU runs at about its float32 speed (the AMD EPYC of
 * docs/figures/encoder-attention.md: 30.5 ms a call of `base`, 8 heads over 1,500 frames, 30.3 ms in float32), where
 * AVX512-BF16's dot products of bfloat16 pairs (vdpbf16ps) do twice a float32 FMA's work. Here both products
 * use them, with what flash attention keeps in float32 kept in float32:
 *   scores = q . k in float32 from bfloat16 pairs (scale applied after), softmax in float32 over the whole row,
 *   the probabilities rounded to bfloat16 for the product with v (as PyTorch's kernel does), summed in float32,
 *   divided by the float32 total and rounded to bfloat16.
 * Keys are regrouped 16 to a tile, each lane one key and each 32-bit element a pair of its dimensions; values two
 * keys to a 32-bit element, each lane one dimension. A thread takes 8 query rows of one head at a time, 4 rows
 * by 4 key tiles (or 4 rows by the 4 16-dimension blocks) in registers.
 *
 * q, k, v: [B, H, L, 64] bfloat16, contiguous; out: [B, L, H, 64] bfloat16 (the layout the encoder's output
 * projection reads). Built with csrc/rowdot.c by decoding/kernels/native.py.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(_OPENMP)
#include <omp.h>
#endif

#if defined(__AVX512BF16__) && defined(__AVX512F__)
#include <immintrin.h>

#include "vector_exp.h"

int encoder_attention_available(void) { return 1; }

enum { D = 64, PAIRS = D / 2, ROWS = 8, GROUP = 4, TILE = 16 };

/* Keys [L, 64] as tiles of 16: tiles[(t * PAIRS + p) * 16 + lane] = key t * 16 + lane's dimensions 2p, 2p + 1
 * (zero past L). Values [L, 64] as pairs: pairs[q * 64 + d] = value 2q's dimension d, then value 2q + 1's. */
static void pack_head(const uint32_t* k, const uint16_t* v, int64_t L, int64_t padded, uint32_t* tiles,
                      uint32_t* pairs) {
  for (int64_t t = 0; t < padded / TILE; ++t)
    for (int64_t p = 0; p < PAIRS; ++p)
      for (int64_t lane = 0; lane < TILE; ++lane) {
        int64_t key = t * TILE + lane;
        tiles[(t * PAIRS + p) * TILE + lane] = key < L ? k[key * PAIRS + p] : 0u;
      }
  for (int64_t q = 0; q < padded / 2; ++q)
    for (int64_t d = 0; d < D; ++d) {
      uint32_t lo = 2 * q < L ? v[(2 * q) * D + d] : 0u, hi = 2 * q + 1 < L ? v[(2 * q + 1) * D + d] : 0u;
      pairs[q * D + d] = lo | (hi << 16);
    }
}

/* scores[r][key] for the GROUP query rows q[r] (each PAIRS 32-bit pairs), `count` tiles from tile `first`. */
#define SCORE_TILES(count)                                                                             \
  do {                                                                                                 \
    __m512 acc[GROUP][count];                                                                          \
    for (int r = 0; r < GROUP; ++r)                                                                    \
      for (int c = 0; c < count; ++c) acc[r][c] = _mm512_setzero_ps();                                 \
    for (int p = 0; p < PAIRS; ++p) {                                                                  \
      __m512bh kt[count];                                                                              \
      for (int c = 0; c < count; ++c)                                                                  \
        kt[c] = (__m512bh)_mm512_loadu_si512(tiles + ((first + c) * PAIRS + p) * TILE);                \
      for (int r = 0; r < GROUP; ++r) {                                                                \
        __m512bh qp = (__m512bh)_mm512_set1_epi32((int)q[r][p]);                                       \
        for (int c = 0; c < count; ++c) acc[r][c] = _mm512_dpbf16_ps(acc[r][c], qp, kt[c]);            \
      }                                                                                                \
    }                                                                                                  \
    for (int r = 0; r < GROUP; ++r)                                                                    \
      for (int c = 0; c < count; ++c)                                                                  \
        _mm512_storeu_ps(scores + r * padded + (first + c) * TILE, _mm512_mul_ps(acc[r][c], scale16)); \
  } while (0)

static void score_group(const uint32_t* const q[GROUP], const uint32_t* tiles, int64_t padded, float scale,
                        float* scores) {
  __m512 scale16 = _mm512_set1_ps(scale);
  int64_t tiles_n = padded / TILE, first = 0;
  for (; first + 4 <= tiles_n; first += 4) SCORE_TILES(4);
  for (; first < tiles_n; ++first) SCORE_TILES(1);
}

/* One row's scores into bfloat16 probabilities (unnormalised, in `probs`); returns their float32 total. */
static float exponentiate(float* s, int64_t L, int64_t padded, uint16_t* probs) {
  int64_t body = L - L % TILE;
  __m512 top16 = _mm512_set1_ps(-INFINITY);
  for (int64_t i = 0; i < body; i += TILE) top16 = _mm512_max_ps(top16, _mm512_loadu_ps(s + i));
  __mmask16 tail = (__mmask16)((1u << (L - body)) - 1);
  if (body < L) top16 = _mm512_mask_max_ps(top16, tail, top16, _mm512_maskz_loadu_ps(tail, s + body));
  __m512 shift = _mm512_set1_ps(_mm512_reduce_max_ps(top16)), total16 = _mm512_setzero_ps();
  for (int64_t i = 0; i < padded; i += TILE) {
    __m512 e = exp16(_mm512_sub_ps(_mm512_loadu_ps(s + i), shift));
    if (i + TILE > L) e = _mm512_maskz_mov_ps(i < L ? tail : 0, e);
    total16 = _mm512_add_ps(total16, e);
    _mm256_storeu_si256((__m256i*)(probs + i), (__m256i)_mm512_cvtneps_pbh(e));
  }
  return _mm512_reduce_add_ps(total16);
}

/* out rows of GROUP queries: probs [GROUP][padded] bfloat16 times the value pairs, over `total`. */
static void weigh_values(const uint16_t* probs, const uint32_t* pairs, int64_t padded, const float* total,
                         uint16_t* const out[GROUP]) {
  __m512 acc[GROUP][D / TILE];
  for (int r = 0; r < GROUP; ++r)
    for (int b = 0; b < D / TILE; ++b) acc[r][b] = _mm512_setzero_ps();
  for (int64_t q = 0; q < padded / 2; ++q) {
    __m512bh vp[D / TILE];
    for (int b = 0; b < D / TILE; ++b) vp[b] = (__m512bh)_mm512_loadu_si512(pairs + q * D + b * TILE);
    for (int r = 0; r < GROUP; ++r) {
      uint32_t pair;
      memcpy(&pair, probs + r * padded + 2 * q, sizeof pair);
      __m512bh pp = (__m512bh)_mm512_set1_epi32((int)pair);
      for (int b = 0; b < D / TILE; ++b) acc[r][b] = _mm512_dpbf16_ps(acc[r][b], pp, vp[b]);
    }
  }
  for (int r = 0; r < GROUP; ++r) {
    if (out[r] == NULL) continue;
    __m512 inv = _mm512_set1_ps(1.f / total[r]);
    for (int b = 0; b < D / TILE; ++b)
      _mm256_storeu_si256((__m256i*)(out[r] + b * TILE), (__m256i)_mm512_cvtneps_pbh(_mm512_mul_ps(acc[r][b], inv)));
  }
}

/* Returns 0, or -1 where memory for the regrouped keys and values or a thread's rows could not be had. */
int encoder_attention(const uint16_t* q, const uint16_t* k, const uint16_t* v, uint16_t* out, int64_t B,
                      int64_t H, int64_t L, float scale, int threads) {
  int64_t padded = (L + TILE - 1) / TILE * TILE, heads = B * H, blocks = (L + ROWS - 1) / ROWS;
  uint32_t* tiles = aligned_alloc(64, (size_t)(heads * padded * PAIRS * 4));
  uint32_t* pairs = aligned_alloc(64, (size_t)(heads * padded * PAIRS * 4));
  if (tiles == NULL || pairs == NULL) {
    free(tiles);
    free(pairs);
    return -1;
  }
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int64_t h = 0; h < heads; ++h)
    pack_head((const uint32_t*)(k + h * L * D), v + h * L * D, L, padded, tiles + h * padded * PAIRS,
              pairs + h * padded * PAIRS);
  int failed = 0;
#pragma omp parallel num_threads(threads) reduction(| : failed)
  {
    float* scores = aligned_alloc(64, (size_t)(GROUP * padded * 4));
    uint16_t* probs = aligned_alloc(64, (size_t)(GROUP * padded * 2));
    failed = scores == NULL || probs == NULL;
#pragma omp for schedule(static) collapse(2)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t block = 0; block < blocks; ++block) {
        if (failed) continue;  // this thread's rows are left unwritten, and the call returns -1
        const uint32_t* head_tiles = tiles + h * padded * PAIRS;
        const uint32_t* head_pairs = pairs + h * padded * PAIRS;
        int64_t b = h / H, head = h % H;
        for (int64_t g = block * ROWS; g < (block + 1) * ROWS && g < L; g += GROUP) {
          const uint32_t* rows[GROUP];
          uint16_t* outs[GROUP];
          float total[GROUP];
          for (int r = 0; r < GROUP; ++r) {
            int64_t i = g + r < L ? g + r : L - 1;  // a short last group repeats its last row, not stored
            rows[r] = (const uint32_t*)(q + (h * L + i) * D);
            outs[r] = g + r < L ? out + ((b * L + i) * H + head) * D : NULL;
          }
          score_group(rows, head_tiles, padded, scale, scores);
          for (int r = 0; r < GROUP; ++r) total[r] = exponentiate(scores + r * padded, L, padded, probs + r * padded);
          weigh_values(probs, head_pairs, padded, total, outs);
        }
      }
    free(scores);
    free(probs);
  }
  free(tiles);
  free(pairs);
  return failed ? -1 : 0;
}

#else
int encoder_attention_available(void) { return 0; }

int encoder_attention(const uint16_t* q, const uint16_t* k, const uint16_t* v, uint16_t* out, int64_t B,
                      int64_t H, int64_t L, float scale, int threads) {
  (void)q, (void)k, (void)v, (void)out, (void)B, (void)H, (void)L, (void)scale, (void)threads;
  return -1;
}
#endif
