// Attention over the KV cache (flm_core::Op::Attention), split over the sequence as in
// flash-decoding (Dao et al. 2023, "Flash-Decoding for long-context inference"): block
// (head, row, chunk) computes, for the cache positions of its chunk that the row sees, the
// chunk's score maximum m_c, the sum l_c = sum_t e^(s_t - m_c) and the unnormalised output
// o_c = sum_t e^(s_t - m_c) v_t; attn_combine then merges the chunks exactly:
// out = sum_c e^(m_c - M) o_c / sum_c e^(m_c - M) l_c with M = max_c m_c. With attention
// sinks (gpt-oss, flm_core::AttentionOperands::sinks) M also covers the head's sink, and
// e^(sink - M) joins the denominator.
//
// Scores s_t = q . k_t * scale, soft-capped as cap * tanh(s_t / cap) when softcap > 0
// (Gemma 2), (+ slope_h * t with ALiBi); query head h reads KV head
// h / (n_heads / n_kv_heads) (GQA). Row i is at position p = start_pos + i with start_pos
// read from device memory (a captured decode graph stays valid as the position moves); it
// sees positions [lo, hi) with hi = max(p + 1, bidirectional) and lo = max(0, p + 1 - window)
// when window > 0, else 0. The grid covers every chunk of the cache; chunks outside
// [lo, hi) write m_c = -inf, l_c = 0 and cost one early exit.
//
// Multi-head latent attention (flm_core::DecoupledRope; DeepSeek-V2, section 2.1.3) adds a
// second part to every query head (q_rope, rope_dim values) and KV head (cache_rope): the
// score is (q . k_t + q_rope . k_rope_t) * scale. Values are v_dim wide, which may differ
// from head_dim. rope_dim is 0 (and q_rope, cache_rope null) for plain attention.
//
// The cache holds f32 (attn_partial) or f16 (attn_partial_f16, flm_core::KvDtype::F16)
// keys and values, widened exactly to f32 as they are read (load_w); everything else is f32.
//
// Shared memory: ATTN_CHUNK scores + head_dim + rope_dim query values + 32 floats of
// scratch.

#define ATTN_CHUNK 256

// The body of attn_partial over a cache of element type W (0: f32, 1: f16; see load_w).
template <int W>
__device__ void attn_partial_w(const float* q, const void* cache_k, const void* cache_v,
                               const float* q_rope, const void* cache_rope,
                               const unsigned int* start_pos, int n_heads, int n_kv_heads,
                               int head_dim, int rope_dim, int v_dim, float scale,
                               float softcap, const float* alibi_slopes, int bidirectional,
                               int window, float* part_m, float* part_l, float* part_o) {
    extern __shared__ float smem[];
    float* scores = smem;
    float* qs = smem + ATTN_CHUNK;
    float* qrs = qs + head_dim;
    float* scratch = qrs + rope_dim;
    int h = blockIdx.x, row = blockIdx.y, chunk = blockIdx.z, chunks = gridDim.z;
    int kvh = h / (n_heads / n_kv_heads);
    long p = (long)start_pos[0] + row;
    long hi = p + 1 > bidirectional ? p + 1 : bidirectional;
    long lo = window > 0 && p + 1 - window > 0 ? p + 1 - window : 0;
    long t0 = (long)chunk * ATTN_CHUNK;
    long a = t0 > lo ? t0 : lo;
    long b = t0 + ATTN_CHUNK < hi ? t0 + ATTN_CHUNK : hi;
    long part = ((long)row * n_heads + h) * chunks + chunk;
    float* o = part_o + part * v_dim;
    if (a >= b) {
        flash_empty_part(part_m, part_l, o, part, v_dim);
        return;
    }
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
        long k = t * kv_cols + (long)kvh * head_dim;
        float s = 0.0f;
        for (int d = lane; d < head_dim; d += 32) s += qs[d] * load_w<W>(cache_k, k + d);
        long kr = t * rope_cols + (long)kvh * rope_dim;
        for (int d = lane; d < rope_dim; d += 32) s += qrs[d] * load_w<W>(cache_rope, kr + d);
        s = warp_sum(s);
        if (lane == 0) {
            float sc = s * scale;
            if (softcap > 0.0f) sc = softcap * tanhf(sc / softcap);
            scores[t - t0] = sc + slope * (float)t;
        }
    }
    __syncthreads();
    float l;
    float mx = flash_chunk_softmax(scores + (a - t0), b - a, scratch, &l);
    __syncthreads();
    for (int d = threadIdx.x; d < v_dim; d += blockDim.x) {
        long v = (long)kvh * v_dim + d;
        float acc = 0.0f;
        for (long t = a; t < b; t++) acc += scores[t - t0] * load_w<W>(cache_v, v + t * v_cols);
        o[d] = acc;
    }
    if (threadIdx.x == 0) {
        part_m[part] = mx;
        part_l[part] = l;
    }
}

// Block (head, row, chunk) over a cache of element type W: attn_partial (f32) and
// attn_partial_f16 (f16).
#define ATTN_PARTIAL(NAME, W)                                                              \
    extern "C" __global__ void NAME(const float* q, const void* cache_k, const void* cache_v, \
                                    const float* q_rope, const void* cache_rope,           \
                                    const unsigned int* start_pos, int n_heads,            \
                                    int n_kv_heads, int head_dim, int rope_dim, int v_dim, \
                                    float scale, float softcap, const float* alibi_slopes, \
                                    int bidirectional, int window, float* part_m,          \
                                    float* part_l, float* part_o) {                        \
        attn_partial_w<W>(q, cache_k, cache_v, q_rope, cache_rope, start_pos, n_heads,     \
                          n_kv_heads, head_dim, rope_dim, v_dim, scale, softcap,           \
                          alibi_slopes, bidirectional, window, part_m, part_l, part_o);    \
    }
ATTN_PARTIAL(attn_partial, 0)
ATTN_PARTIAL(attn_partial_f16, 1)

// One block per (head, row): merges the chunks of attn_partial into out[row, h, :], head_dim
// being the value width; sinks is n_heads floats, or null without sinks.
extern "C" __global__ void attn_combine(const float* part_m, const float* part_l,
                                        const float* part_o, const float* sinks, int n_heads,
                                        int head_dim, int chunks, float* out) {
    int h = blockIdx.x, row = blockIdx.y;
    long base = ((long)row * n_heads + h) * chunks;
    float mx = sinks ? sinks[h] : -INFINITY;
    for (int c = 0; c < chunks; c++) mx = fmaxf(mx, part_m[base + c]);
    float l = sinks ? expf(sinks[h] - mx) : 0.0f;
    for (int c = 0; c < chunks; c++) {
        float m = part_m[base + c];
        if (m > -INFINITY) l += expf(m - mx) * part_l[base + c];
    }
    float* o = out + ((long)row * n_heads + h) * head_dim;
    for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
        float acc = 0.0f;
        for (int c = 0; c < chunks; c++) {
            float m = part_m[base + c];
            if (m > -INFINITY) acc += expf(m - mx) * part_o[(base + c) * head_dim + d];
        }
        o[d] = l > 0.0f ? acc / l : 0.0f;
    }
}
