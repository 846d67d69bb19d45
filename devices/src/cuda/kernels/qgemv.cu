// Dequantise-GEMV for weights in rows of ggml's blocks (the K-quants, Q5_0, Q8_0, IQ4_NL,
// IQ4_XS, MXFP4; gq_* in prelude.cuh): out[n, o] = sum_i x[n, i] * w_hat[o, i] (+ bias[o]), the
// decode product of flm_core::Op::Linear for them (int8/int4 weights take gemv.cu, over the
// GPU GEMV layout). One warp per output row, QGEMV_ROWS rows per block; grid.y walks the
// input rows, which re-reads the weights once per row: the decode product (prefill
// dequantises the weights to f16 for cuBLAS instead, dequant.cu). Each warp sums one input
// row against one weight row alone, so a row's output never depends on the other rows (the
// device's batch invariance).
//
// Unlike the CPU kernels, the activations stay f32 (no int8 activation blocks): each
// weight is dequantised and multiplied in f32, which is at least as accurate.

#define QGEMV_ROWS 4

// `GQ` the block type, `row_bytes` the bytes of a row of `in` values (padded to whole
// blocks). The warp takes 256 values (8 runs of 32) at a time: lane l takes 8 values of
// run l / 4, from (l % 4) * 8, with the run's scales read once; per run,
// sum_i (a q_i - b) x_i = a * sum_i q_i x_i - b * sum_i x_i. One instance per type, so
// that each unpacks only its own blocks (a kernel taking the type at run time holds the
// registers of every type's unpacking: 64 against 32-40).
template <int GQ>
__device__ void qgemv_ggml(const unsigned char* w, const float* x, const float* bias,
                           float* out, int in, int out_features, long row_bytes) {
    int lane = threadIdx.x & 31;
    int o = blockIdx.x * QGEMV_ROWS + (threadIdx.x >> 5);
    if (o >= out_features) return;
    const unsigned char* row = w + (long)o * row_bytes;
    const float* xr = x + (long)blockIdx.y * in;
    int l0 = (lane & 3) * 8;
    float acc = 0.0f;
    for (int j = lane >> 2; j * 32 + l0 < in; j += 8) {
        int r;
        const unsigned char* b = gq_run_block(row, GQ, j, &r);
        int base = j * 32 + l0;
        float2 sc = gq_run_scales(b, GQ, r);
        float qx = 0.0f, sx = 0.0f;
        #pragma unroll
        for (int k = 0; k < 8; k++) {
            if (base + k < in) {
                qx += gq_code(b, GQ, r, l0 + k) * xr[base + k];
                sx += xr[base + k];
            }
        }
        acc += sc.x * qx - sc.y * sx;
    }
    acc = warp_sum(acc);
    if (lane == 0) out[(long)blockIdx.y * out_features + o] = acc + (bias ? bias[o] : 0.0f);
}

#define QGEMV(SUFFIX, GQ)                                                                   \
    extern "C" __global__ void qgemv_##SUFFIX(const unsigned char* w, const float* x,       \
                                              const float* bias, float* out, int in,        \
                                              int out_features, long row_bytes) {           \
        qgemv_ggml<GQ>(w, x, bias, out, in, out_features, row_bytes);                       \
    }

QGEMV(q4_k, GQ_Q4_K)
QGEMV(q5_k, GQ_Q5_K)
QGEMV(q6_k, GQ_Q6_K)
QGEMV(q8_0, GQ_Q8_0)
QGEMV(iq4_nl, GQ_IQ4_NL)
QGEMV(iq4_xs, GQ_IQ4_XS)
QGEMV(mxfp4, GQ_MXFP4)
QGEMV(q5_0, GQ_Q5_0)

// out[r, o] += bias[o]: the bias of a cuBLAS product.
extern "C" __global__ void add_bias(float* out, const float* bias, int out_features, long n) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] += bias[i % out_features];
}
