// Dequantise-GEMV for K-quant weights in ggml's row layout (flm_core::kquant): out[n, o] =
// sum_i x[n, i] * w_hat[o, i] (+ bias[o]), the decode product of flm_core::Op::Linear for
// them (int8/int4 weights take gemv.cu, over the GPU GEMV layout). One warp per output
// row, QGEMV_ROWS rows per block; grid.y walks the input rows, which re-reads the weights
// once per row: the decode product (prefill dequantises the weights to f16 for cuBLAS
// instead, dequant.cu).
//
// Unlike the CPU kernels, the activations stay f32 (no int8 activation blocks): each
// weight is dequantised and multiplied in f32, which is at least as accurate.

#define QGEMV_ROWS 4

// K-quants (`kq` 1: Q4_K, 2: Q5_K, 3: Q6_K; `blocks` super-blocks of 256 values per row):
// lane l takes 8 values of each super-block, those of run l / 4 from (l % 4) * 8, with the
// run's scales read once; per run, sum_i (a q_i - b) x_i = a * sum_i q_i x_i - b * sum_i x_i.
extern "C" __global__ void qgemv_k(const unsigned char* w, const float* x, const float* bias,
                                   float* out, int in, int out_features, int blocks, int kq) {
    int lane = threadIdx.x & 31;
    int o = blockIdx.x * QGEMV_ROWS + (threadIdx.x >> 5);
    if (o >= out_features) return;
    long bb = kq_block_bytes(kq);
    const unsigned char* row = w + (long)o * blocks * bb;
    const float* xr = x + (long)blockIdx.y * in;
    int r = lane >> 2, l0 = (lane & 3) * 8;
    float acc = 0.0f;
    for (int s = 0; s < blocks; s++) {
        const unsigned char* b = row + s * bb;
        int base = s * 256 + r * 32 + l0;
        if (base >= in) break;
        float2 sc = kq_run_scales(b, kq, r);
        float qx = 0.0f, sx = 0.0f;
        #pragma unroll
        for (int k = 0; k < 8; k++) {
            if (base + k < in) {
                qx += kq_code(b, kq, r, l0 + k) * xr[base + k];
                sx += xr[base + k];
            }
        }
        acc += sc.x * qx - sc.y * sx;
    }
    acc = warp_sum(acc);
    if (lane == 0) out[(long)blockIdx.y * out_features + o] = acc + (bias ? bias[o] : 0.0f);
}

// out[r, o] += bias[o]: the bias of a cuBLAS product.
extern "C" __global__ void add_bias(float* out, const float* bias, int out_features, long n) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] += bias[i % out_features];
}
