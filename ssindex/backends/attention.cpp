// Bidirectional bf16 attention on AMX tiles, for encoders with short sequences and
// small heads (ssindex/backends/attention.py says why and when it runs).
//
// One task per (sequence, head), over its L real tokens only (padding is on the right):
// scores of 16 queries at a time in tiles, a softmax over whole rows in AVX-512, then
// P.V in tiles. Keys and values are packed once per task into the pair layout
// (VNNI) that tdpbf16ps reads. Head sizes 32 and 64, sequences up to 512 tokens.
#include <immintrin.h>
#include <stdint.h>
#include <string.h>
#include <math.h>
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

// K (L x D, token stride ts) -> kp[(jb/16)][dk][pair p (16)][key (16)][2]
static void pack_k(const uint16_t* k, int64_t ts, int L, int D, uint16_t* kp) {
    const int L16 = (L + 15) & ~15, DK = D / 32;
    for (int jb = 0; jb < L16; jb += 16)
        for (int dk = 0; dk < DK; ++dk) {
            uint32_t* dst = (uint32_t*)(kp + ((size_t)(jb / 16) * DK + dk) * 512);
            for (int jj = 0; jj < 16; ++jj) {
                const int j = jb + jj;
                if (j < L) {
                    const uint32_t* src = (const uint32_t*)(k + j * ts + dk * 32);
                    for (int p = 0; p < 16; ++p) dst[p * 16 + jj] = src[p];
                } else {
                    for (int p = 0; p < 16; ++p) dst[p * 16 + jj] = 0;
                }
            }
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

// 2^x for x <= 0, to bf16's precision: 2^f for f in [-0.5, 0.5] by its degree-4 Taylor
// polynomial (relative error under 5e-5, against bf16's 4e-3), scaled by 2^round(x)
static inline __m512 exp2_neg(__m512 x) {
    x = _mm512_max_ps(x, _mm512_set1_ps(-126.0f));
    const __m512 n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m512 f = _mm512_sub_ps(x, n);
    __m512 p = _mm512_set1_ps(9.6181291e-3f);
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.5504109e-2f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.4022651e-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.9314718e-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, n);
}

static inline __mmask16 first(int n) {
    return n >= 16 ? (__mmask16)0xFFFF : n > 0 ? (__mmask16)((1u << n) - 1) : (__mmask16)0;
}

#define SCORES(T, K) do { _tile_zero(T); _tile_loadd(K, kb, 64); _tile_dpbf16ps(T, 0, K); \
    if (DK == 2) { _tile_loadd(K, kb + 512, 64); _tile_dpbf16ps(T, 6, K); } } while (0)

template <int D>
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
        // scores: tiles 0 and 6 = the queries' dimension slices; 1 and 4 = key blocks;
        // 2 and 7 = two blocks of scores, so one block's product runs while the other's is stored
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
        // softmax numerators over the L real keys, in base 2
        float inv[16];
        for (int r = 0; r < rows; ++r) {
            float* s = w->sc + r * SROW;
            __m512 mx = _mm512_set1_ps(-INFINITY);
            for (int j = 0; j < L16; j += 16)
                mx = _mm512_mask_max_ps(mx, first(L - j), mx, _mm512_loadu_ps(s + j));
            const __m512 shift = _mm512_mul_ps(_mm512_set1_ps(_mm512_reduce_max_ps(mx)), vscale);
            __m512 sum = _mm512_setzero_ps();
            uint16_t* p = w->pb + r * SROW;
            for (int j = 0; j < L32; j += 32) {
                const __mmask16 m0 = first(L - j), m1 = first(L - j - 16);
                const __m512 e0 = _mm512_maskz_mov_ps(m0, exp2_neg(_mm512_fmsub_ps(_mm512_loadu_ps(s + j), vscale, shift)));
                const __m512 e1 = _mm512_maskz_mov_ps(m1, exp2_neg(_mm512_fmsub_ps(_mm512_loadu_ps(s + j + 16), vscale, shift)));
                sum = _mm512_add_ps(sum, _mm512_add_ps(e0, e1));
                _mm512_storeu_si512(p + j, (__m512i)_mm512_cvtne2ps_pbh(e1, e0));
            }
            inv[r] = 1.0f / _mm512_reduce_add_ps(sum);
        }
        for (int r = rows; r < 16; ++r) memset(w->pb + r * SROW, 0, L32 * 2);
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

extern "C" int ssindex_attend(const uint16_t* q, const uint16_t* k, const uint16_t* v, uint16_t* out,
                              const int64_t* lengths, int B, int S, int H, int D,
                              int64_t bs, int64_t ts, float scale) {
    if ((D != 32 && D != 64) || S > MAXS) return 1;
    #pragma omp parallel
    {
        TileConfig cfg;
        memset(&cfg, 0, sizeof cfg);
        cfg.palette = 1;
        for (int t = 0; t < 8; ++t) { cfg.colsb[t] = 64; cfg.rows[t] = 16; }
        _tile_loadconfig(&cfg);
        alignas(64) static thread_local Scratch scratch;  // each thread's, kept
        Scratch* w = &scratch;
        #pragma omp for schedule(dynamic, 1)
        for (int t = 0; t < B * H; ++t) {
            const int b = t / H, h = t % H;
            const int L = (int)lengths[b];
            const int64_t off = (int64_t)b * bs + (int64_t)h * D;
            const int64_t ooff = ((int64_t)b * S * H + h) * D;
            if (D == 32) attend_one<32>(q + off, k + off, v + off, out + ooff, ts, (int64_t)H * D, S, L, scale, w);
            else attend_one<64>(q + off, k + off, v + off, out + ooff, ts, (int64_t)H * D, S, L, scale, w);
        }
        _tile_release();
    }
    return 0;
}
