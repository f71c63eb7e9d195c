/* ei_nb.average kernel: out = ca*a + cb*b evaluated in float64 and rounded ONCE (nearest, ties to even) to the
   tensor's dtype, written over b. Build with -ffp-contract=off: a fused multiply-add rounds differently. */
#include <stdint.h>
#include <string.h>
#include <stddef.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

static inline uint64_t d2u(double x) { uint64_t u; memcpy(&u, &x, 8); return u; }
static inline double u2d(uint64_t u) { double x; memcpy(&x, &u, 8); return x; }

/* Round x once to a binary format with E exponent bits and M mantissa bits. */
static inline uint32_t round_narrow(double x, int E, int M) {
  uint64_t u = d2u(x), a = u & 0x7fffffffffffffffULL;
  uint32_t sign = (uint32_t)(u >> 63) << (E + M), inf = ((1u << E) - 1) << M;
  int B = (1 << (E - 1)) - 1;
  int64_t e = (int64_t)(a >> 52);
  if (a > 0x7ff0000000000000ULL) return sign | inf | (uint32_t)((a >> (52 - M)) & ((1u << M) - 1)) | (1u << (M - 1));
  if (e > 1023 - B) {
    uint64_t t = a - ((uint64_t)(1023 - B) << 52); int s = 52 - M;
    t = (t + ((1ULL << (s - 1)) - 1) + ((t >> s) & 1)) >> s;
    return sign | (t >= inf ? inf : (uint32_t)t);
  }
  uint64_t m = (a & 0xfffffffffffffULL) | (e ? (1ULL << 52) : 0);
  int64_t s = 1076 - B - M - e; if (s > 63) s = 63;
  return sign | (uint32_t)((m + ((1ULL << (s - 1)) - 1) + ((m >> s) & 1)) >> s);
}
static inline double dec(int kind, const uint8_t *p, size_t i) {
  if (kind == 0) { uint16_t h; memcpy(&h, p + 2*i, 2); uint32_t u = (uint32_t)h << 16; float f; memcpy(&f, &u, 4); return f; }
  if (kind == 1) { uint16_t h; memcpy(&h, p + 2*i, 2);
    uint64_t s = (uint64_t)(h >> 15) << 63; uint32_t e = (h >> 10) & 0x1f, m = h & 0x3ff;
    if (e == 0) return u2d(s | d2u((double)m * 0x1p-24));
    return u2d(s | ((uint64_t)(e == 31 ? 0x7ff : e + 1008) << 52) | ((uint64_t)m << 42)); }
  if (kind == 2) { float f; memcpy(&f, p + 4*i, 4); return f; }
  double d; memcpy(&d, p + 8*i, 8); return d;
}
static void avg_scalar(int kind, const uint8_t *a, uint8_t *bo, size_t i, size_t n, double ca, double cb, double *acc) {
  for (; i < n; i++) {
    double x = dec(kind, a, i), r = ca * x + cb * dec(kind, bo, i);
    if (acc) { acc[0] += (r - x) * (r - x); acc[1] += x * x; }
    if (kind == 0) { uint16_t o = (uint16_t)round_narrow(r, 8, 7); memcpy(bo + 2*i, &o, 2); }
    else if (kind == 1) { uint16_t o = (uint16_t)round_narrow(r, 5, 10); memcpy(bo + 2*i, &o, 2); }
    else if (kind == 2) { uint32_t o = round_narrow(r, 8, 23); memcpy(bo + 4*i, &o, 4); }
    else memcpy(bo + 8*i, &r, 8);
  }
}
static void stats_scalar(int kind, const uint8_t *a, const uint8_t *o, size_t i, size_t n, double *acc) {
  for (; i < n; i++) { double x = dec(kind, a, i), d = dec(kind, o, i) - x; acc[0] += d * d; acc[1] += x * x; }
}

#if defined(__AVX2__) && defined(__F16C__)
#define SIMD 1
/* 4 doubles -> float32 bits rounded to odd (truncated, last bit set if inexact). Rounding these to nearest-even
   in bf16 or fp16 gives the same bits as rounding the doubles once: float32 keeps >= 2 more bits everywhere. */
static inline __m128i to_odd_f32(__m256d r) {
  const __m256d absm = _mm256_castsi256_pd(_mm256_set1_epi64x(0x7fffffffffffffffLL));
  const __m256i pick = _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7);
  __m128 f = _mm256_cvtpd_ps(r);
  __m256d back = _mm256_cvtps_pd(f);
  __m256d away = _mm256_cmp_pd(_mm256_and_pd(back, absm), _mm256_and_pd(r, absm), _CMP_GT_OQ);
  __m256d inex = _mm256_cmp_pd(back, r, _CMP_NEQ_OQ);
  __m128i away32 = _mm256_castsi256_si128(_mm256_permutevar8x32_epi32(_mm256_castpd_si256(away), pick));
  __m128i inex32 = _mm256_castsi256_si128(_mm256_permutevar8x32_epi32(_mm256_castpd_si256(inex), pick));
  return _mm_or_si128(_mm_add_epi32(_mm_castps_si128(f), away32), _mm_srli_epi32(inex32, 31));
}
static inline void load8(int kind, const uint8_t *p, __m256d *lo, __m256d *hi) {
  __m256 f = kind == 0
    ? _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16))
    : _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
  *lo = _mm256_cvtps_pd(_mm256_castps256_ps128(f));
  *hi = _mm256_cvtps_pd(_mm256_extractf128_ps(f, 1));
}
static inline __m128i f32bits_to_bf16(__m256i b) {
  __m256i r = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(b, _mm256_set1_epi32(0x7fff)),
                               _mm256_and_si256(_mm256_srli_epi32(b, 16), _mm256_set1_epi32(1))), 16);
  __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(b, _mm256_set1_epi32(0x7fffffff)), _mm256_set1_epi32(0x7f800000));
  r = _mm256_blendv_epi8(r, _mm256_or_si256(_mm256_srli_epi32(b, 16), _mm256_set1_epi32(0x40)), nan);
  return _mm256_castsi256_si128(_mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0xd8));
}
static inline __m128i pack_lo32(__m256i x) {   /* the low 32 bits of each 64-bit lane */
  return _mm256_castsi256_si128(_mm256_permutevar8x32_epi32(x, _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7)));
}
/* bf16 bits of 4 doubles rounded once to nearest-even, straight from the float64 bits; lanes that are not zero
   or in bf16's normal range (subnormal, overflow, inf, NaN) are flagged in *bad and redone by to_odd_f32. */
static inline __m256i bf16_direct(__m256d r, __m256i *bad) {
  __m256i u = _mm256_castpd_si256(r), a = _mm256_and_si256(u, _mm256_set1_epi64x(0x7fffffffffffffffLL));
  __m256i zero = _mm256_cmpeq_epi64(a, _mm256_setzero_si256());
  __m256i ok = _mm256_or_si256(zero, _mm256_and_si256(_mm256_cmpgt_epi64(a, _mm256_set1_epi64x((897LL << 52) - 1)),
                                                       _mm256_cmpgt_epi64(_mm256_set1_epi64x(1151LL << 52), a)));
  *bad = _mm256_or_si256(*bad, _mm256_xor_si256(ok, _mm256_set1_epi64x(-1)));
  __m256i t = _mm256_add_epi64(_mm256_add_epi64(a, _mm256_set1_epi64x((1LL << 44) - 1)),
                               _mm256_and_si256(_mm256_srli_epi64(a, 45), _mm256_set1_epi64x(1)));
  t = _mm256_andnot_si256(zero, _mm256_sub_epi64(_mm256_srli_epi64(t, 45), _mm256_set1_epi64x(896LL << 7)));
  return _mm256_or_si256(t, _mm256_and_si256(_mm256_srli_epi64(u, 48), _mm256_set1_epi64x(0x8000)));
}
static inline void acc2(__m256d *s0, __m256d *s1, __m256d r, __m256d a) {
  __m256d d = _mm256_sub_pd(r, a);
  *s0 = _mm256_add_pd(*s0, _mm256_mul_pd(d, d)); *s1 = _mm256_add_pd(*s1, _mm256_mul_pd(a, a));
}
static inline void flush2(__m256d s0, __m256d s1, double *acc) {
  double t0[4], t1[4]; _mm256_storeu_pd(t0, s0); _mm256_storeu_pd(t1, s1);
  acc[0] += (t0[0] + t0[1]) + (t0[2] + t0[3]); acc[1] += (t1[0] + t1[1]) + (t1[2] + t1[3]);
}
/* mode 0 with AVX2; also sums (r - a)^2 and a^2 with r before its final rounding, when acc is given */
static size_t avg_simd(int kind, const uint8_t *a, uint8_t *bo, size_t n, double ca, double cb, double *acc) {
  const __m256d va = _mm256_set1_pd(ca), vb = _mm256_set1_pd(cb);
  __m256d s0 = _mm256_setzero_pd(), s1 = _mm256_setzero_pd();
  size_t i = 0;
  if (kind <= 1) {
    for (; i + 8 <= n; i += 8) {
      __m256d al, ah, bl, bh;
      load8(kind, a + 2*i, &al, &ah); load8(kind, bo + 2*i, &bl, &bh);
      __m256d rl = _mm256_add_pd(_mm256_mul_pd(va, al), _mm256_mul_pd(vb, bl));
      __m256d rh = _mm256_add_pd(_mm256_mul_pd(va, ah), _mm256_mul_pd(vb, bh));
      if (acc) { acc2(&s0, &s1, rl, al); acc2(&s0, &s1, rh, ah); }
      __m128i o = _mm_setzero_si128();
      __m256i bad = _mm256_set1_epi64x(-1);
      if (kind == 0) {
        bad = _mm256_setzero_si256();
        __m256i xl = bf16_direct(rl, &bad), xh = bf16_direct(rh, &bad);
        __m256i x32 = _mm256_set_m128i(pack_lo32(xh), pack_lo32(xl));
        o = _mm256_castsi256_si128(_mm256_permute4x64_epi64(_mm256_packus_epi32(x32, x32), 0xd8));
      }
      if (!_mm256_testz_si256(bad, bad)) {
        __m256i odd = _mm256_set_m128i(to_odd_f32(rh), to_odd_f32(rl));
        o = kind == 0 ? f32bits_to_bf16(odd)
                      : _mm256_cvtps_ph(_mm256_castsi256_ps(odd), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
      }
      _mm_storeu_si128((__m128i *)(bo + 2*i), o);
    }
  } else if (kind == 2) {
    for (; i + 4 <= n; i += 4) {
      __m256d x = _mm256_cvtps_pd(_mm_loadu_ps((const float *)(a + 4*i))), y = _mm256_cvtps_pd(_mm_loadu_ps((const float *)(bo + 4*i)));
      __m256d r = _mm256_add_pd(_mm256_mul_pd(va, x), _mm256_mul_pd(vb, y));
      if (acc) acc2(&s0, &s1, r, x);
      _mm_storeu_ps((float *)(bo + 4*i), _mm256_cvtpd_ps(r));
    }
  } else {
    for (; i + 4 <= n; i += 4) {
      __m256d x = _mm256_loadu_pd((const double *)(a + 8*i)), y = _mm256_loadu_pd((const double *)(bo + 8*i));
      __m256d r = _mm256_add_pd(_mm256_mul_pd(va, x), _mm256_mul_pd(vb, y));
      if (acc) acc2(&s0, &s1, r, x);
      _mm256_storeu_pd((double *)(bo + 8*i), r);
    }
  }
  if (acc) flush2(s0, s1, acc);
  return i;
}
/* the sums for modes 1 and 2, where out is a copy: (out - a)^2 and a^2 */
static size_t stats_simd(int kind, const uint8_t *a, const uint8_t *o, size_t n, double *acc) {
  __m256d s0 = _mm256_setzero_pd(), s1 = _mm256_setzero_pd();
  size_t i = 0;
  if (kind <= 1) {
    for (; i + 8 <= n; i += 8) {
      __m256d al, ah, ol, oh;
      load8(kind, a + 2*i, &al, &ah); load8(kind, o + 2*i, &ol, &oh);
      acc2(&s0, &s1, ol, al); acc2(&s0, &s1, oh, ah);
    }
  } else {
    for (; i + 4 <= n; i += 4) {
      __m256d x = kind == 2 ? _mm256_cvtps_pd(_mm_loadu_ps((const float *)(a + 4*i))) : _mm256_loadu_pd((const double *)(a + 8*i));
      __m256d y = kind == 2 ? _mm256_cvtps_pd(_mm_loadu_ps((const float *)(o + 4*i))) : _mm256_loadu_pd((const double *)(o + 8*i));
      acc2(&s0, &s1, y, x);
    }
  }
  flush2(s0, s1, acc);
  return i;
}
#else
#define SIMD 0
#endif

int ei_avg_simd(void) { return SIMD; }

/* kind: 0 bf16, 1 fp16, 2 fp32, 3 fp64. mode: 0 average, 1 out = a (weight 0), 2 out = b (weight 1).
   stats (optional): += sum (out - a)^2 (out before its final rounding in mode 0), += sum a^2.
   Returns 0, or -1 for a bad kind or mode. */
int ei_avg(int kind, int mode, const void *a_, void *bo_, size_t n, double ca, double cb, double *stats) {
  const uint8_t *a = (const uint8_t *)a_; uint8_t *bo = (uint8_t *)bo_;
  static const size_t isz[4] = {2, 2, 4, 8};
  if (kind < 0 || kind > 3 || mode < 0 || mode > 2) return -1;
#if defined(__x86_64__)
  unsigned int csr = _mm_getcsr();
  _mm_setcsr(0x1f80u);  /* round to nearest, all exceptions masked, no flush-to-zero, no denormals-are-zero */
#endif
  for (size_t i0 = 0; i0 < n; i0 += 4096) {
    size_t m = n - i0 < 4096 ? n - i0 : 4096, i = 0, sz = isz[kind];
    const uint8_t *pa = a + i0 * sz; uint8_t *pb = bo + i0 * sz;
    if (mode == 0) {
#if SIMD
      i = avg_simd(kind, pa, pb, m, ca, cb, stats);
#endif
      avg_scalar(kind, pa, pb, i, m, ca, cb, stats);
      continue;
    }
    if (mode == 1) memcpy(pb, pa, m * sz);
    if (stats) {
      i = 0;
#if SIMD
      i = stats_simd(kind, pa, pb, m, stats);
#endif
      stats_scalar(kind, pa, pb, i, m, stats);
    }
  }
#if defined(__x86_64__)
  _mm_setcsr(csr);
#endif
  return 0;
}
