// Attention of many query rows over the KV cache (flm_core::Op::Attention in prefill), as
// FlashAttention-2 (Dao 2023, "FlashAttention-2: Faster Attention with Better Parallelism
// and Work Partitioning", algorithm 1): block (q tile, head) takes FA_BR query rows, one
// warp per 16 of them, and walks the cache in tiles of FA_BC keys. Per tile, S = Q K^T and
// O += P V are tensor-core products (PTX mma.sync m16n8k16, f16 operands, f32
// accumulation); the softmax is online: each row keeps its running maximum m and sum l,
// and when a tile raises m the accumulated O and l are rescaled by e^(m_old - m_new).
// O / l is written at the end. The S accumulators become the A operand of P V in
// registers (the m16n8k16 C and A fragments hold the same rows and columns), so P never
// goes through shared memory.
//
// Masks and scores as attn_partial (attention.cu): row i is at position p = start_pos + i
// (start_pos in device memory), sees keys [lo, hi) with hi = max(p + 1, bidirectional) (the
// GLM prefix is bidirectional) and lo = max(0, p + 1 - window) when window > 0, else 0;
// s = q . k * scale, then cap * tanh(s / cap) when softcap > 0, then + slope_h * t (ALiBi);
// query head h reads KV head h / (n_heads / n_kv_heads) (GQA). q, k and v are rounded to
// f16 for the tensor cores, and so are the probabilities P (l sums them in f32).
//
// Shared memory (static): the K tile, FA_BC rows of D + 8 halves, and the V tile
// transposed, D rows of FA_BC + 8 halves (the 8 halves of padding spread a fragment's
// 32-bit loads over the banks): 35,840 bytes for D = 128.

#define FA_BR 64
#define FA_BC 64
#define FA_THREADS 128

// A cache element as f16 bits for the tensor cores. The element type of the cache is this
// one switch: an f16 cache adds the overload that passes its bits through, and its
// FLASH_ATTN instantiations below.
__device__ __forceinline__ f16_bits cache_to_f16(float v) { return f32_to_f16(v); }

// Two f32 values as an f16x2 register, the first in the low half (the lower column of an
// mma fragment).
__device__ __forceinline__ unsigned int pack_f16x2(float lo, float hi) {
    return (unsigned int)f32_to_f16(lo) | ((unsigned int)f32_to_f16(hi) << 16);
}

// c += a b for one m16n8k16 tile: a the 16x16 row-major A fragment (4 f16x2 registers),
// b the 16x8 column-major B fragment (2), c the 16x8 f32 accumulator (4). PTX ISA,
// "Matrix Fragments for mma.m16n8k16 with floating point type": with g = lane / 4 and
// t = lane % 4, a[0] holds A[g][2t, 2t+1], a[1] A[g+8][2t, 2t+1], a[2] A[g][2t+8, 2t+9],
// a[3] A[g+8][2t+8, 2t+9]; b[0] B[2t, 2t+1][g], b[1] B[2t+8, 2t+9][g]; c[0], c[1]
// C[g][2t, 2t+1] and c[2], c[3] C[g+8][2t, 2t+1].
__device__ __forceinline__ void mma_16816(float* c, const unsigned int* a,
                                          const unsigned int* b) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// Values c, c + 1 of query row `row` (of `n`; zero beyond) as an f16x2 register.
__device__ __forceinline__ unsigned int load_q2(const float* qh, long stride, int row, int n,
                                                int c) {
    if (row >= n) return 0u;
    const float* r = qh + (long)row * stride + c;
    return pack_f16x2(r[0], r[1]);
}

template <typename T, int D>
__device__ void flash_attn(const float* q, const T* cache_k, const T* cache_v,
                           const unsigned int* start_pos, int n, int n_heads, int n_kv_heads,
                           float scale, float softcap, const float* alibi_slopes,
                           int bidirectional, int window, float* out) {
    constexpr int KP = D + 8;
    constexpr int VP = FA_BC + 8;
    constexpr int NT = FA_BC / 8;  // n8 tiles of S
    constexpr int DT = D / 8;      // n8 tiles of O
    __shared__ __align__(16) f16_bits ks[FA_BC * KP];
    __shared__ __align__(16) f16_bits vt[D * VP];
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int g = lane >> 2, t4 = lane & 3;
    int h = blockIdx.y;
    int kvh = h / (n_heads / n_kv_heads);
    long start = start_pos[0];
    // The last query tiles see the most keys under a causal mask: they are scheduled first,
    // so that the short tiles fill the tail of the grid (as FlashAttention-2 orders them).
    int row0 = (gridDim.x - 1 - blockIdx.x) * FA_BR;
    int wrow = row0 + warp * 16;
    long kv_cols = (long)n_kv_heads * D;
    // The keys any row of the block sees: lo of its first row to hi of its last.
    int last = (row0 + FA_BR < n ? row0 + FA_BR : n) - 1;
    long p_first = start + row0, p_last = start + last;
    long hi = p_last + 1 > bidirectional ? p_last + 1 : bidirectional;
    long lo = window > 0 && p_first + 1 - window > 0 ? p_first + 1 - window : 0;
    // This thread's two rows (g and g + 8 of the warp's 16): their positions and key ranges.
    long pos[2] = {start + wrow + g, start + wrow + g + 8};
    long row_lo[2], row_hi[2];
    #pragma unroll
    for (int r = 0; r < 2; r++) {
        long see = pos[r] + 1 > bidirectional ? pos[r] + 1 : bidirectional;
        row_hi[r] = see < hi ? see : hi;
        row_lo[r] = window > 0 && pos[r] + 1 - window > 0 ? pos[r] + 1 - window : 0;
    }
    float slope = alibi_slopes ? alibi_slopes[h] : 0.0f;

    const float* qh = q + (long)h * D;
    long q_stride = (long)n_heads * D;
    unsigned int qa[D / 16][4];
    #pragma unroll
    for (int kc = 0; kc < D / 16; kc++) {
        int c = kc * 16 + 2 * t4;
        qa[kc][0] = load_q2(qh, q_stride, wrow + g, n, c);
        qa[kc][1] = load_q2(qh, q_stride, wrow + g + 8, n, c);
        qa[kc][2] = load_q2(qh, q_stride, wrow + g, n, c + 8);
        qa[kc][3] = load_q2(qh, q_stride, wrow + g + 8, n, c + 8);
    }
    float o[DT][4];
    #pragma unroll
    for (int dt = 0; dt < DT; dt++) o[dt][0] = o[dt][1] = o[dt][2] = o[dt][3] = 0.0f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};

    for (long t0 = lo; t0 < hi; t0 += FA_BC) {
        // Every warp is done with the previous tile before it is overwritten.
        __syncthreads();
        for (int i = threadIdx.x; i < FA_BC * D; i += FA_THREADS) {
            int j = i / D, d = i % D;
            long t = t0 + j;
            long at = t * kv_cols + (long)kvh * D + d;
            f16_bits kv[2] = {0, 0};
            if (t < hi) {
                kv[0] = cache_to_f16(cache_k[at]);
                kv[1] = cache_to_f16(cache_v[at]);
            }
            ks[j * KP + d] = kv[0];
            vt[d * VP + j] = kv[1];
        }
        __syncthreads();

        float s[NT][4];
        #pragma unroll
        for (int nt = 0; nt < NT; nt++) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
        #pragma unroll
        for (int kc = 0; kc < D / 16; kc++) {
            #pragma unroll
            for (int nt = 0; nt < NT; nt++) {
                const f16_bits* kr = ks + (nt * 8 + g) * KP + kc * 16 + 2 * t4;
                unsigned int b[2] = {*(const unsigned int*)kr, *(const unsigned int*)(kr + 8)};
                mma_16816(s[nt], qa[kc], b);
            }
        }

        float mx[2] = {-INFINITY, -INFINITY};
        #pragma unroll
        for (int nt = 0; nt < NT; nt++) {
            #pragma unroll
            for (int e = 0; e < 4; e++) {
                int r = e >> 1;
                long t = t0 + nt * 8 + 2 * t4 + (e & 1);
                float sc = s[nt][e] * scale;
                if (softcap > 0.0f) sc = softcap * tanhf(sc / softcap);
                sc += slope * (float)t;
                s[nt][e] = t >= row_lo[r] && t < row_hi[r] ? sc : -INFINITY;
                mx[r] = fmaxf(mx[r], s[nt][e]);
            }
        }
        float alpha[2];
        #pragma unroll
        for (int r = 0; r < 2; r++) {
            // The four lanes of a quad hold the same row.
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
            float m_new = fmaxf(m[r], mx[r]);
            // A row that has seen no key yet keeps m = -inf: subtract 0 so that e^(-inf) = 0
            // rather than e^(-inf + inf) = NaN.
            float m_use = m_new == -INFINITY ? 0.0f : m_new;
            alpha[r] = expf(m[r] - m_use);
            m[r] = m_new;
            l[r] *= alpha[r];
        }
        #pragma unroll
        for (int nt = 0; nt < NT; nt++) {
            #pragma unroll
            for (int e = 0; e < 4; e++) {
                int r = e >> 1;
                float m_use = m[r] == -INFINITY ? 0.0f : m[r];
                s[nt][e] = expf(s[nt][e] - m_use);
                l[r] += s[nt][e];
            }
        }
        #pragma unroll
        for (int dt = 0; dt < DT; dt++) {
            o[dt][0] *= alpha[0];
            o[dt][1] *= alpha[0];
            o[dt][2] *= alpha[1];
            o[dt][3] *= alpha[1];
        }
        #pragma unroll
        for (int j = 0; j < FA_BC / 16; j++) {
            unsigned int pa[4] = {pack_f16x2(s[2 * j][0], s[2 * j][1]),
                                  pack_f16x2(s[2 * j][2], s[2 * j][3]),
                                  pack_f16x2(s[2 * j + 1][0], s[2 * j + 1][1]),
                                  pack_f16x2(s[2 * j + 1][2], s[2 * j + 1][3])};
            #pragma unroll
            for (int dt = 0; dt < DT; dt++) {
                const f16_bits* vr = vt + (dt * 8 + g) * VP + j * 16 + 2 * t4;
                unsigned int b[2] = {*(const unsigned int*)vr, *(const unsigned int*)(vr + 8)};
                mma_16816(o[dt], pa, b);
            }
        }
    }

    #pragma unroll
    for (int r = 0; r < 2; r++) {
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
    }
    #pragma unroll
    for (int dt = 0; dt < DT; dt++) {
        #pragma unroll
        for (int e = 0; e < 4; e++) {
            int r = e >> 1, row = wrow + g + 8 * r;
            if (row < n) {
                int d = dt * 8 + 2 * t4 + (e & 1);
                out[((long)row * n_heads + h) * D + d] = l[r] > 0.0f ? o[dt][e] / l[r] : 0.0f;
            }
        }
    }
}

// One kernel per cache element type and head dimension; the grid is
// (ceil(n / FA_BR), n_heads) blocks of FA_THREADS threads.
#define FLASH_ATTN(NAME, T, D)                                                             \
    extern "C" __global__ void __launch_bounds__(FA_THREADS)                               \
        NAME(const float* q, const T* cache_k, const T* cache_v,                           \
             const unsigned int* start_pos, int n, int n_heads, int n_kv_heads,            \
             float scale, float softcap, const float* alibi_slopes, int bidirectional,     \
             int window, float* out) {                                                     \
        flash_attn<T, D>(q, cache_k, cache_v, start_pos, n, n_heads, n_kv_heads, scale,    \
                         softcap, alibi_slopes, bidirectional, window, out);               \
    }

FLASH_ATTN(flash_attn_f32_d64, float, 64)
FLASH_ATTN(flash_attn_f32_d128, float, 128)
