// Attention over a paged KV pool (flm_core::Op::PagedAttention; Kwon et al. 2023, vLLM's
// PagedAttention) and the scatter of new key/value rows into its slots
// (flm_core::Op::ScatterRows; vLLM's reshape_and_cache).
//
// The pool of a layer is [n_blocks * block_size, n_kv_heads * head_dim]; cache position t
// of a row lives in pool row table[t / block_size] * block_size + t % block_size, the table
// being the row's sequence's block table. The row metadata are read from device memory,
// three u32 arrays: row_pos[row] (the row's cache position p), row_table[row] (where its
// sequence's table starts in `tables`) and `tables` (every sequence's table, one after the
// other), so a captured decode graph stays valid while positions and tables change.
//
// paged_attn_partial is attention.cu's attn_partial over that mapping, split over the
// context as flash-decoding does (Dao et al. 2023): block (head, row, chunk) computes, for
// the positions [lo, hi) of its chunk that the row sees (hi = p + 1, lo = p + 1 - window
// with a sliding window, else 0), the chunk's score maximum m_c, the sum
// l_c = sum_t e^(s_t - m_c) and the unnormalised output o_c = sum_t e^(s_t - m_c) v_t; the
// chunks are then merged exactly by attention.cu's attn_combine (same partial layout), which
// also adds the attention sinks, if any. The
// grid covers the longest row's chunks; a shorter row's chunks beyond its position write
// m_c = -inf, l_c = 0 and exit.
//
// Scores: s_t = q . k_t * scale, soft-capped as cap * tanh(s_t / cap) when softcap > 0,
// + slope_h * t with ALiBi; query head h reads KV head h / (n_heads / n_kv_heads) (GQA).
// With multi-head latent attention's decoupled RoPE part (rope_dim > 0, as in
// attention.cu), s_t = (q . k_t + q_rope . k_rope_t) * scale, k_rope_t in pool_rope; values
// are v_dim wide.
//
// The pool's element type is the template parameter KV (kv_to_f32 / kv_from_f32): each
// instantiation is one extern "C" pair below, f32 and f16 (rounded to nearest even as it
// is stored, widened exactly as it is read).
//
// Shared memory of paged_attn_partial: PAGED_CHUNK scores, PAGED_CHUNK pool rows (the
// table lookups of the key pass, reused by the value pass), head_dim + rope_dim query
// values and 32 floats of scratch.

#define PAGED_CHUNK 256

template <typename KV>
__device__ void paged_attn_partial(const float* q, const KV* pool_k, const KV* pool_v,
                                   const float* q_rope, const KV* pool_rope,
                                   const unsigned int* row_pos,
                                   const unsigned int* row_table,
                                   const unsigned int* tables, int block_size, int n_heads,
                                   int n_kv_heads, int head_dim, int rope_dim, int v_dim,
                                   float scale, float softcap, const float* alibi_slopes,
                                   int window, float* part_m, float* part_l, float* part_o) {
    extern __shared__ float smem[];
    float* scores = smem;
    long* slots = (long*)(smem + PAGED_CHUNK);
    float* qs = (float*)(slots + PAGED_CHUNK);
    float* qrs = qs + head_dim;
    float* scratch = qrs + rope_dim;
    int h = blockIdx.x, row = blockIdx.y, chunk = blockIdx.z, chunks = gridDim.z;
    int kvh = h / (n_heads / n_kv_heads);
    long p = (long)row_pos[row];
    long hi = p + 1;
    long lo = window > 0 && p + 1 - window > 0 ? p + 1 - window : 0;
    long t0 = (long)chunk * PAGED_CHUNK;
    long a = t0 > lo ? t0 : lo;
    long b = t0 + PAGED_CHUNK < hi ? t0 + PAGED_CHUNK : hi;
    long part = ((long)row * n_heads + h) * chunks + chunk;
    float* o = part_o + part * v_dim;
    if (a >= b) {
        flash_empty_part(part_m, part_l, o, part, v_dim);
        return;
    }
    const unsigned int* table = tables + row_table[row];
    const float* qr = q + ((long)row * n_heads + h) * head_dim;
    for (int d = threadIdx.x; d < head_dim; d += blockDim.x) qs[d] = qr[d];
    const float* qrr = q_rope + ((long)row * n_heads + h) * rope_dim;
    for (int d = threadIdx.x; d < rope_dim; d += blockDim.x) qrs[d] = qrr[d];
    __syncthreads();
    long kv_cols = (long)n_kv_heads * head_dim;
    long rope_cols = (long)n_kv_heads * rope_dim;
    long v_cols = (long)n_kv_heads * v_dim;
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    float slope = alibi_slopes ? alibi_slopes[h] : 0.0f;
    for (long t = a + warp; t < b; t += warps) {
        long slot = (long)table[t / block_size] * block_size + t % block_size;
        const KV* k = pool_k + slot * kv_cols + (long)kvh * head_dim;
        float s = 0.0f;
        for (int d = lane; d < head_dim; d += 32) s += qs[d] * kv_to_f32(k[d]);
        const KV* kr = pool_rope + slot * rope_cols + (long)kvh * rope_dim;
        for (int d = lane; d < rope_dim; d += 32) s += qrs[d] * kv_to_f32(kr[d]);
        s = warp_sum(s);
        if (lane == 0) {
            float sc = s * scale;
            if (softcap > 0.0f) sc = softcap * tanhf(sc / softcap);
            scores[t - t0] = sc + slope * (float)t;
            slots[t - t0] = slot;
        }
    }
    __syncthreads();
    float l;
    float mx = flash_chunk_softmax(scores + (a - t0), b - a, scratch, &l);
    __syncthreads();
    for (int d = threadIdx.x; d < v_dim; d += blockDim.x) {
        const KV* v = pool_v + (long)kvh * v_dim + d;
        float acc = 0.0f;
        for (long t = a; t < b; t++) acc += scores[t - t0] * kv_to_f32(v[slots[t - t0] * v_cols]);
        o[d] = acc;
    }
    if (threadIdx.x == 0) {
        part_m[part] = mx;
        part_l[part] = l;
    }
}

// dst[rows[r], :] = src[r, :] for r < n_rows: one block per source row.
template <typename KV>
__device__ void scatter_rows(const float* src, const unsigned int* rows, KV* dst, int cols) {
    long r = blockIdx.x;
    const float* s = src + r * cols;
    KV* d = dst + (long)rows[r] * cols;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) kv_from_f32(d + c, s[c]);
}

#define PAGED(SUFFIX, KV)                                                                  \
    extern "C" __global__ void paged_attn_partial_##SUFFIX(                                \
        const float* q, const KV* pool_k, const KV* pool_v, const float* q_rope,           \
        const KV* pool_rope, const unsigned int* row_pos, const unsigned int* row_table,   \
        const unsigned int* tables, int block_size, int n_heads, int n_kv_heads,           \
        int head_dim, int rope_dim, int v_dim, float scale, float softcap,                 \
        const float* alibi_slopes, int window, float* part_m, float* part_l,               \
        float* part_o) {                                                                   \
        paged_attn_partial<KV>(q, pool_k, pool_v, q_rope, pool_rope, row_pos, row_table,   \
                               tables, block_size, n_heads, n_kv_heads, head_dim,          \
                               rope_dim, v_dim, scale, softcap, alibi_slopes, window,      \
                               part_m, part_l, part_o);                                    \
    }                                                                                      \
    extern "C" __global__ void scatter_rows_##SUFFIX(const float* src,                     \
                                                     const unsigned int* rows, KV* dst,    \
                                                     int cols) {                           \
        scatter_rows<KV>(src, rows, dst, cols);                                            \
    }

PAGED(f32, float)
PAGED(f16, f16_bits)
