// Attention over the KV cache (flm_core::Op::Attention), split over the sequence as in
// flash-decoding (Dao et al. 2023, "Flash-Decoding for long-context inference"): block
// (head, row, chunk) computes, for the cache positions of its chunk that the row sees, the
// chunk's score maximum m_c, the sum l_c = sum_t e^(s_t - m_c) and the unnormalised output
// o_c = sum_t e^(s_t - m_c) v_t; attn_combine then merges the chunks exactly:
// out = sum_c e^(m_c - M) o_c / sum_c e^(m_c - M) l_c with M = max_c m_c.
//
// Scores s_t = q . k_t * scale, soft-capped as cap * tanh(s_t / cap) when softcap > 0
// (Gemma 2), (+ slope_h * t with ALiBi); query head h reads KV head
// h / (n_heads / n_kv_heads) (GQA). Row i is at position p = start_pos + i with start_pos
// read from device memory (a captured decode graph stays valid as the position moves); it
// sees positions [lo, hi) with hi = max(p + 1, bidirectional) and lo = max(0, p + 1 - window)
// when window > 0, else 0. The grid covers every chunk of the cache; chunks outside
// [lo, hi) write m_c = -inf, l_c = 0 and cost one early exit.
//
// Shared memory: ATTN_CHUNK scores + head_dim query values + 32 floats of scratch.

#define ATTN_CHUNK 256

extern "C" __global__ void attn_partial(const float* q, const float* cache_k,
                                        const float* cache_v, const unsigned int* start_pos,
                                        int n_heads, int n_kv_heads, int head_dim, float scale,
                                        float softcap, const float* alibi_slopes,
                                        int bidirectional,
                                        int window, float* part_m, float* part_l,
                                        float* part_o) {
    extern __shared__ float smem[];
    float* scores = smem;
    float* qs = smem + ATTN_CHUNK;
    float* scratch = qs + head_dim;
    int h = blockIdx.x, row = blockIdx.y, chunk = blockIdx.z, chunks = gridDim.z;
    int kvh = h / (n_heads / n_kv_heads);
    long p = (long)start_pos[0] + row;
    long hi = p + 1 > bidirectional ? p + 1 : bidirectional;
    long lo = window > 0 && p + 1 - window > 0 ? p + 1 - window : 0;
    long t0 = (long)chunk * ATTN_CHUNK;
    long a = t0 > lo ? t0 : lo;
    long b = t0 + ATTN_CHUNK < hi ? t0 + ATTN_CHUNK : hi;
    long part = ((long)row * n_heads + h) * chunks + chunk;
    float* o = part_o + part * head_dim;
    if (a >= b) {
        flash_empty_part(part_m, part_l, o, part, head_dim);
        return;
    }
    const float* qr = q + ((long)row * n_heads + h) * head_dim;
    for (int d = threadIdx.x; d < head_dim; d += blockDim.x) qs[d] = qr[d];
    __syncthreads();
    long kv_cols = (long)n_kv_heads * head_dim;
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    float slope = alibi_slopes ? alibi_slopes[h] : 0.0f;
    for (long t = a + warp; t < b; t += warps) {
        const float* k = cache_k + t * kv_cols + (long)kvh * head_dim;
        float s = 0.0f;
        for (int d = lane; d < head_dim; d += 32) s += qs[d] * k[d];
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
    for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
        const float* v = cache_v + (long)kvh * head_dim + d;
        float acc = 0.0f;
        for (long t = a; t < b; t++) acc += scores[t - t0] * v[t * kv_cols];
        o[d] = acc;
    }
    if (threadIdx.x == 0) {
        part_m[part] = mx;
        part_l[part] = l;
    }
}

// One block per (head, row): merges the chunks of attn_partial into out[row, h, :].
extern "C" __global__ void attn_combine(const float* part_m, const float* part_l,
                                        const float* part_o, int n_heads, int head_dim,
                                        int chunks, float* out) {
    int h = blockIdx.x, row = blockIdx.y;
    long base = ((long)row * n_heads + h) * chunks;
    float mx = -INFINITY;
    for (int c = 0; c < chunks; c++) mx = fmaxf(mx, part_m[base + c]);
    float l = 0.0f;
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
