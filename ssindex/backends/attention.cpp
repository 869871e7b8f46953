// Bidirectional bf16 attention for encoders with short sequences and small heads, on AMX
// tiles or, without them, in AVX512-BF16 registers (ssindex/backends/attention.py says
// why and when it runs).
//
// One task per (sequence, head), over its L real tokens only (padding is on the right):
// scores of 16 queries at a time, a softmax over whole rows in AVX-512, then P.V. Keys
// and values are packed once per task into the pair layout (VNNI) that tdpbf16ps and
// vdpbf16ps both read. Head sizes 32 and 64, sequences up to 512 tokens.
#include <immintrin.h>
#include <stdint.h>
#include <string.h>
#include <math.h>
#include <omp.h>
#include <unistd.h>
#include <sys/syscall.h>

struct TileConfig {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
};

enum { MAXS = 512, MAXD = 64, SROW = MAXS + 16 };

struct Scratch {
    uint16_t kp[MAXS * MAXD];        // K as VNNI pairs, per 16-key block and 32-dim slice
    uint16_t vp[MAXS * MAXD];        // V as VNNI pairs, per 32-key block and 16-dim slice
    uint16_t qpad[16 * MAXD];        // the last, partial block of queries
    float sc[16 * SROW];             // one block of query rows' scores
    uint16_t pb[16 * SROW];          // their softmax numerators in bf16
    float ob[16 * MAXD];             // one block of query rows' outputs
};

// A 16x16 matrix of 32-bit words, transposed in registers
static inline void transpose16(__m512i r[16]) {
    __m512i t[16];
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
    }
    for (int i = 0; i < 16; i += 4) {
        r[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
        r[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
        r[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
        r[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
    }
    for (int i = 0; i < 4; ++i) {
        t[i] = _mm512_shuffle_i32x4(r[i], r[i + 4], 0x88);
        t[i + 4] = _mm512_shuffle_i32x4(r[i], r[i + 4], 0xdd);
        t[i + 8] = _mm512_shuffle_i32x4(r[i + 8], r[i + 12], 0x88);
        t[i + 12] = _mm512_shuffle_i32x4(r[i + 8], r[i + 12], 0xdd);
    }
    for (int i = 0; i < 4; ++i) {
        r[i] = _mm512_shuffle_i32x4(t[i], t[i + 8], 0x88);
        r[i + 8] = _mm512_shuffle_i32x4(t[i], t[i + 8], 0xdd);
        r[i + 4] = _mm512_shuffle_i32x4(t[i + 4], t[i + 12], 0x88);
        r[i + 12] = _mm512_shuffle_i32x4(t[i + 4], t[i + 12], 0xdd);
    }
}

// K (L x D, token stride ts) -> kp[(jb/16)][dk][pair p (16)][key (16)][2]: each 16 keys'
// 32-dim slice is a 16x16 matrix of bf16 pairs, transposed
static void pack_k(const uint16_t* k, int64_t ts, int L, int D, uint16_t* kp) {
    const int L16 = (L + 15) & ~15, DK = D / 32;
    __m512i r[16];
    for (int jb = 0; jb < L16; jb += 16)
        for (int dk = 0; dk < DK; ++dk) {
            for (int jj = 0; jj < 16; ++jj)
                r[jj] = jb + jj < L ? _mm512_loadu_si512(k + (jb + jj) * ts + dk * 32)
                                    : _mm512_setzero_si512();
            transpose16(r);
            uint16_t* dst = kp + ((size_t)(jb / 16) * DK + dk) * 512;
            for (int p = 0; p < 16; ++p) _mm512_storeu_si512(dst + p * 32, r[p]);
        }
}

// V (L x D) -> vp[(kb/32)][dc][key pair (16)][dim (16)][2]
static void pack_v(const uint16_t* v, int64_t ts, int L, int D, uint16_t* vp) {
    const int L32 = (L + 31) & ~31, DC = D / 16;
    __m512i lo = _mm512_set_epi16(47,15,46,14,45,13,44,12,43,11,42,10,41,9,40,8,39,7,38,6,37,5,36,4,35,3,34,2,33,1,32,0);
    __m512i hi = _mm512_add_epi16(lo, _mm512_set1_epi16(16));
    for (int j = 0; j < L32; j += 2) {
        const int kb = j / 32, pr = (j % 32) / 2;
        for (int d0 = 0; d0 < D; d0 += 32) {
            __m512i a = j < L ? _mm512_loadu_si512(v + j * ts + d0) : _mm512_setzero_si512();
            __m512i b = j + 1 < L ? _mm512_loadu_si512(v + (j + 1) * ts + d0) : _mm512_setzero_si512();
            const int dc = d0 / 16;
            _mm512_storeu_si512(vp + (((size_t)kb * DC + dc) * 16 + pr) * 32, _mm512_permutex2var_epi16(a, lo, b));
            _mm512_storeu_si512(vp + (((size_t)kb * DC + dc + 1) * 16 + pr) * 32, _mm512_permutex2var_epi16(a, hi, b));
        }
    }
}

// 2^x for x <= 0 to bf16's precision: 2^f for f in [-0.5, 0.5] by its degree-3 Taylor
// polynomial (relative error under 6e-4, against the 2e-3 of rounding to bf16), scaled
// by 2^round(x), which reaches zero far below -126
static inline __m512 exp2_neg(__m512 x) {
    const __m512 n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m512 f = _mm512_sub_ps(x, n);
    __m512 p = _mm512_fmadd_ps(_mm512_set1_ps(5.5504109e-2f), f, _mm512_set1_ps(2.4022651e-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.9314718e-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, n);
}

static inline __mmask16 first(int n) {
    return n >= 16 ? (__mmask16)0xFFFF : n > 0 ? (__mmask16)((1u << n) - 1) : (__mmask16)0;
}

#define SCORES(T, K) do { _tile_zero(T); _tile_loadd(K, kb, 64); _tile_dpbf16ps(T, 0, K); \
    if (DK == 2) { _tile_loadd(K, kb + 512, 64); _tile_dpbf16ps(T, 6, K); } } while (0)

// A bf16 pair (two adjacent elements) broadcast to every 32-bit lane, as vdpbf16ps takes it
static inline __m512bh pair_of(const uint16_t* at) {
    int32_t pair;
    memcpy(&pair, at, 4);
    return (__m512bh)_mm512_set1_epi32(pair);
}

// Without tiles: each 16-key block of packed K holds, per dimension pair, one register
// of the 16 keys' pairs; vdpbf16ps takes it against a query's pair broadcast. Eight
// query rows by NB blocks of keys keep 8 x NB sums in flight, enough to hide its latency.
template <int D, int NB>
static inline void scores_block(const uint16_t* qb, int64_t qs, const uint16_t* kp, int jb,
                                float* sc) {
    constexpr int DK = D / 32;
    for (int r0 = 0; r0 < 16; r0 += 8) {
        __m512 acc[8][NB];
        for (int r = 0; r < 8; ++r)
            for (int n = 0; n < NB; ++n) acc[r][n] = _mm512_setzero_ps();
        for (int dk = 0; dk < DK; ++dk)
            for (int p = 0; p < 16; ++p) {
                __m512bh keys[NB];
                for (int n = 0; n < NB; ++n)
                    keys[n] = (__m512bh)_mm512_loadu_si512(
                        kp + ((size_t)(jb / 16 + n) * DK + dk) * 512 + p * 32);
                for (int r = 0; r < 8; ++r) {
                    const __m512bh query = pair_of(qb + (r0 + r) * qs + dk * 32 + 2 * p);
                    for (int n = 0; n < NB; ++n) acc[r][n] = _mm512_dpbf16_ps(acc[r][n], keys[n], query);
                }
            }
        for (int r = 0; r < 8; ++r)
            for (int n = 0; n < NB; ++n) _mm512_storeu_ps(sc + (r0 + r) * SROW + jb + n * 16, acc[r][n]);
    }
}

// P.V without tiles: per key pair, the values' register for each 16 dimensions against
// the row's two numerators broadcast; R rows x D/16 slices = 16 sums in flight
template <int D>
static void pv_registers(const uint16_t* pb, const uint16_t* vp, int L32, int rows, float* ob) {
    constexpr int DC = D / 16, R = 256 / D;
    for (int r0 = 0; r0 < rows; r0 += R) {
        __m512 acc[R][DC];
        for (int r = 0; r < R; ++r)
            for (int c = 0; c < DC; ++c) acc[r][c] = _mm512_setzero_ps();
        for (int kb = 0; kb < L32; kb += 32) {
            const uint16_t* vb = vp + (size_t)(kb / 32) * DC * 512;
            for (int pr = 0; pr < 16; ++pr) {
                __m512bh values[DC];
                for (int c = 0; c < DC; ++c) values[c] = (__m512bh)_mm512_loadu_si512(vb + (c * 16 + pr) * 32);
                for (int r = 0; r < R; ++r) {
                    const __m512bh numerators = pair_of(pb + (r0 + r) * SROW + kb + 2 * pr);
                    for (int c = 0; c < DC; ++c) acc[r][c] = _mm512_dpbf16_ps(acc[r][c], values[c], numerators);
                }
            }
        }
        for (int r = 0; r < R; ++r)
            for (int c = 0; c < DC; ++c) _mm512_storeu_ps(ob + (r0 + r) * D + c * 16, acc[r][c]);
    }
}

template <int D, bool TILES>
static void attend_one(const uint16_t* q, const uint16_t* k, const uint16_t* v, uint16_t* out,
                       int64_t ts, int64_t os, int S, int L, float scale, Scratch* w) {
    const int L16 = (L + 15) & ~15, L32 = (L + 31) & ~31;
    constexpr int DK = D / 32, DC = D / 16;
    pack_k(k, ts, L, D, w->kp);
    pack_v(v, ts, L, D, w->vp);
    const __m512 vscale = _mm512_set1_ps(scale * 1.44269504088896341f);
    for (int i0 = 0; i0 < L; i0 += 16) {
        const int rows = L - i0 < 16 ? L - i0 : 16;
        const uint16_t* qb = q + i0 * ts;
        int64_t qs = ts;
        if (rows < 16) {
            memset(w->qpad, 0, sizeof(w->qpad));
            for (int r = 0; r < rows; ++r) memcpy(w->qpad + r * D, q + (i0 + r) * ts, D * 2);
            qb = w->qpad; qs = D;
        }
        if constexpr (TILES) {
            // scores: tiles 0 and 6 = the queries' dimension slices; 1 and 4 = key blocks; 2
            // and 7 = two blocks of scores, so one block's product runs while the other's is stored
            _tile_loadd(0, qb, qs * 2);
            if (DK == 2) _tile_loadd(6, qb + 32, qs * 2);
            int jb = 0;
            for (; jb + 16 < L16; jb += 32) {
                const uint16_t* kb = w->kp + (size_t)(jb / 16) * DK * 512;
                SCORES(2, 1);
                kb += DK * 512;
                SCORES(7, 4);
                _tile_stored(2, w->sc + jb, SROW * 4);
                _tile_stored(7, w->sc + jb + 16, SROW * 4);
            }
            if (jb < L16) {
                const uint16_t* kb = w->kp + (size_t)(jb / 16) * DK * 512;
                SCORES(2, 1);
                _tile_stored(2, w->sc + jb, SROW * 4);
            }
        } else {
            int jb = 0;
            for (; jb + 16 < L16; jb += 32) scores_block<D, 2>(qb, qs, w->kp, jb, w->sc);
            if (jb < L16) scores_block<D, 1>(qb, qs, w->kp, jb, w->sc);
        }
        // softmax numerators over the L real keys, in base 2; only the last block is masked
        float inv[16], top[16];
        const int full = L & ~31;
        for (int r = 0; r < rows; ++r) {  // every row's maximum first: no row waits on its own
            const float* s = w->sc + r * SROW;
            __m512 mx = _mm512_set1_ps(-INFINITY);
            int j = 0;
            for (; j + 16 <= L; j += 16) mx = _mm512_max_ps(mx, _mm512_loadu_ps(s + j));
            if (j < L) mx = _mm512_mask_max_ps(mx, first(L - j), mx, _mm512_loadu_ps(s + j));
            top[r] = _mm512_reduce_max_ps(mx);
        }
        for (int r = 0; r < rows; ++r) {
            const float* s = w->sc + r * SROW;
            const __m512 shift = _mm512_mul_ps(_mm512_set1_ps(top[r]), vscale);
            __m512 sum = _mm512_setzero_ps();
            uint16_t* p = w->pb + r * SROW;
            for (int j = 0; j < full; j += 32) {
                const __m512 e0 = exp2_neg(_mm512_fmsub_ps(_mm512_loadu_ps(s + j), vscale, shift));
                const __m512 e1 = exp2_neg(_mm512_fmsub_ps(_mm512_loadu_ps(s + j + 16), vscale, shift));
                sum = _mm512_add_ps(sum, _mm512_add_ps(e0, e1));
                _mm512_storeu_si512(p + j, (__m512i)_mm512_cvtne2ps_pbh(e1, e0));
            }
            if (full < L) {
                const __mmask16 m0 = first(L - full), m1 = first(L - full - 16);
                const __m512 e0 = _mm512_maskz_mov_ps(m0, exp2_neg(_mm512_fmsub_ps(_mm512_loadu_ps(s + full), vscale, shift)));
                const __m512 e1 = _mm512_maskz_mov_ps(m1, exp2_neg(_mm512_fmsub_ps(_mm512_loadu_ps(s + full + 16), vscale, shift)));
                sum = _mm512_add_ps(sum, _mm512_add_ps(e0, e1));
                _mm512_storeu_si512(p + full, (__m512i)_mm512_cvtne2ps_pbh(e1, e0));
            }
            inv[r] = 1.0f / _mm512_reduce_add_ps(sum);
        }
        for (int r = rows; r < 16; ++r) memset(w->pb + r * SROW, 0, L32 * 2);
        if constexpr (TILES) {
            // P V: tile 0 = 32 keys' numerators, tile 1 = their values, 4.. = output slices
            _tile_zero(4); _tile_zero(5);
            if (DC == 4) { _tile_zero(6); _tile_zero(7); }
            for (int kb = 0; kb < L32; kb += 32) {
                const uint16_t* vb = w->vp + (size_t)(kb / 32) * DC * 512;
                _tile_loadd(0, w->pb + kb, SROW * 2);
                _tile_loadd(1, vb, 64); _tile_dpbf16ps(4, 0, 1);
                _tile_loadd(2, vb + 512, 64); _tile_dpbf16ps(5, 0, 2);
                if (DC == 4) {
                    _tile_loadd(1, vb + 1024, 64); _tile_dpbf16ps(6, 0, 1);
                    _tile_loadd(2, vb + 1536, 64); _tile_dpbf16ps(7, 0, 2);
                }
            }
            _tile_stored(4, w->ob, D * 4);
            _tile_stored(5, w->ob + 16, D * 4);
            if (DC == 4) { _tile_stored(6, w->ob + 32, D * 4); _tile_stored(7, w->ob + 48, D * 4); }
        } else {
            pv_registers<D>(w->pb, w->vp, L32, rows, w->ob);
        }
        for (int r = 0; r < rows; ++r) {
            const __m512 f = _mm512_set1_ps(inv[r]);
            uint16_t* dst = out + (size_t)(i0 + r) * os;
            for (int c = 0; c < DC; c += 2) {
                const __m512 a = _mm512_mul_ps(_mm512_loadu_ps(w->ob + r * D + c * 16), f);
                const __m512 b = _mm512_mul_ps(_mm512_loadu_ps(w->ob + r * D + c * 16 + 16), f);
                _mm512_storeu_si512(dst + c * 16, (__m512i)_mm512_cvtne2ps_pbh(b, a));
            }
        }
    }
    for (int i = L; i < S; ++i) memset(out + (size_t)i * os, 0, D * 2);
}

extern "C" int ssindex_amx_init(void) {
    // Linux grants AMX tile data per process on request (ARCH_REQ_XCOMP_PERM, XTILEDATA)
    return (int)syscall(SYS_arch_prctl, 0x1023, 18);
}

// tiles: 1 on a CPU with AMX, whose tile state ssindex_amx_init has been granted; 0 runs
// the same attention in AVX512-BF16 registers. Returns 0, or before reading a row 1 for
// heads or sequences it cannot take, 2 for a length outside 0..S (attention.py says which)
extern "C" int ssindex_attend(const uint16_t* q, const uint16_t* k, const uint16_t* v, uint16_t* out,
                              const int64_t* lengths, int B, int S, int H, int D,
                              int64_t bs, int64_t ts, float scale, int tiles) {
    if ((D != 32 && D != 64) || S > MAXS) return 1;
    for (int b = 0; b < B; ++b)  // a length past its sequence would read past its rows
        if (lengths[b] < 0 || lengths[b] > S) return 2;
    // a thread takes every head of a sequence in turn where there are sequences enough to
    // share: a token's heads sit side by side, so one core reads whole runs of its lines.
    // Against a head at a time, which split each run between cores: 1.04-1.5x on AMX
    // tiles, 1.01-1.24x in registers (the same Xeon); 4 heads a time gained half as much
    const int heads_per_task = B >= 2 * omp_get_max_threads() ? H : 1;
    #pragma omp parallel
    {
        if (tiles) {
            TileConfig cfg;
            memset(&cfg, 0, sizeof cfg);
            cfg.palette = 1;
            for (int t = 0; t < 8; ++t) { cfg.colsb[t] = 64; cfg.rows[t] = 16; }
            _tile_loadconfig(&cfg);
        }
        alignas(64) static thread_local Scratch scratch;  // each thread's, kept
        Scratch* w = &scratch;
        #pragma omp for schedule(dynamic, heads_per_task)
        for (int t = 0; t < B * H; ++t) {
            const int b = t / H, h = t % H;
            const int L = (int)lengths[b];
            const int64_t off = (int64_t)b * bs + (int64_t)h * D;
            const int64_t ooff = ((int64_t)b * S * H + h) * D;
            const int64_t os = (int64_t)H * D;
            if (tiles) {
                if (D == 32) attend_one<32, true>(q + off, k + off, v + off, out + ooff, ts, os, S, L, scale, w);
                else attend_one<64, true>(q + off, k + off, v + off, out + ooff, ts, os, S, L, scale, w);
            } else {
                if (D == 32) attend_one<32, false>(q + off, k + off, v + off, out + ooff, ts, os, S, L, scale, w);
                else attend_one<64, false>(q + off, k + off, v + off, out + ooff, ts, os, S, L, scale, w);
            }
        }
        if (tiles) _tile_release();
    }
    return 0;
}
