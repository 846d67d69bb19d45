// Embedding lookup (flm_core::Op::Embedding): out[r, :] = table[tokens[r], :] as f32, one
// block per row. The token ids are in device memory, so a captured CUDA graph reads the
// ids of each step; an id >= vocab writes zeros and sets *bad (checked by the host).

// Row blockIdx.x of `out`: value(t, i) for each column i of token t, or zeros and *bad
// for an id >= vocab.
template <typename Value>
__device__ void embedding_row(const unsigned int* tokens, float* out, int dim,
                              unsigned int vocab, int* bad, Value value) {
    unsigned int t = tokens[blockIdx.x];
    float* o = out + (long)blockIdx.x * dim;
    if (t >= vocab) {
        if (threadIdx.x == 0) *bad = 1;
        for (int i = threadIdx.x; i < dim; i += blockDim.x) o[i] = 0.0f;
        return;
    }
    for (int i = threadIdx.x; i < dim; i += blockDim.x) o[i] = value((long)t, i);
}

template <int W>
__device__ void embedding_float(const void* table, const unsigned int* tokens, float* out,
                                int dim, unsigned int vocab, int* bad) {
    embedding_row(tokens, out, dim, vocab, bad,
                  [=](long t, int i) { return load_w<W>(table, t * dim + i); });
}

#define EMBED(SUFFIX, W)                                                                    \
    extern "C" __global__ void embedding_##SUFFIX(const void* table,                        \
                                                  const unsigned int* tokens, float* out,   \
                                                  int dim, unsigned int vocab, int* bad) {  \
        embedding_float<W>(table, tokens, out, dim, vocab, bad);                            \
    }

EMBED(f32, 0)
EMBED(f16, 1)
EMBED(bf16, 2)

// Quantised tables, as dequant_value in prelude.cuh reads them: int8/int4 in the GPU GEMV
// layout (`gq` 0; `group` 0 for int8, else the int4 group size, `form` its minimum), rows
// of ggml's blocks of `row_bytes` bytes (`gq` 1-8, gq_* in prelude.cuh).
extern "C" __global__ void embedding_quant(const unsigned char* table,
                                           const unsigned int* tokens, float* out, int dim,
                                           unsigned int vocab, long row_bytes, int ld,
                                           int group, int form, int gq, long params,
                                           int* bad) {
    embedding_row(tokens, out, dim, vocab, bad, [=](long t, int i) {
        return dequant_value(table, t, i, row_bytes, ld, group, form, gq, params);
    });
}
