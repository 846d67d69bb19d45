// Rotary position embedding (Su et al. 2021, RoFormer), in place, as flm_core::Op::Rope,
// RopeRows and Rope2d: for a pair (a, b) at angle p * f_j, a' = a cos - b sin,
// b' = a sin + b cos, with cos/sin read from the RopeTable uploaded as
// [max_pos, rotary_dim / 2] (computed once on the host, so the angles match the CPU's).
//
// Each head of a row spans `head_span` values; the rotated part starts `offset` values into
// it and has `head_dim` values of which the first `rotary_dim` rotate (ChatGLM-6B's 2D RoPE
// is two launches, offset 0 and offset head_dim, with head_span 2 * head_dim). Pairs are
// (2j, 2j + 1) for style 0 (adjacent pairs, llama2.c) and (j, j + rotary_dim / 2) for
// style 1 (rotate-half, Hugging Face). Positions are in device memory (one per row) so a
// captured CUDA graph reads the current ones; a position >= max_pos sets *bad.
extern "C" __global__ void rope(float* x, const float* cos_t, const float* sin_t,
                                const unsigned int* positions, int n_heads, int head_span,
                                int offset, int rotary_dim, int style, unsigned int max_pos,
                                int* bad) {
    int half = rotary_dim / 2;
    unsigned int p = positions[blockIdx.x];
    if (p >= max_pos) {
        if (threadIdx.x == 0) *bad = 1;
        return;
    }
    float* row = x + (long)blockIdx.x * n_heads * head_span;
    const float* c = cos_t + (long)p * half;
    const float* s = sin_t + (long)p * half;
    for (int k = threadIdx.x; k < n_heads * half; k += blockDim.x) {
        int h = k / half, j = k % half;
        float* head = row + (long)h * head_span + offset;
        int ia = style == 0 ? 2 * j : j;
        int ib = style == 0 ? 2 * j + 1 : j + half;
        float a = head[ia], b = head[ib];
        head[ia] = a * c[j] - b * s[j];
        head[ib] = a * s[j] + b * c[j];
    }
}
