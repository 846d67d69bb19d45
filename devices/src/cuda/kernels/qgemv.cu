// Dequantise-GEMV for int8, int4 and K-quant weights kept in the .flm row layout (flm_core::quant):
// out[n, o] = sum_i x[n, i] * w_hat[o, i] (+ bias[o]), the decode product of
// flm_core::Op::Linear for K-quant weights and for int8/int4 weights that live in GPU
// memory (placed there by the executor in their .flm layout; host ones are repacked for
// gemv.cu). One warp per output row, QGEMV_ROWS rows per block; grid.y walks the input
// rows, which re-reads the weights once per row: the decode product (prefill dequantises
// the weights to f16 for cuBLAS instead, dequant.cu).
//
// Unlike the CPU kernels, the activations stay f32 (no int8 activation blocks): each
// weight is dequantised and multiplied in f32, which is at least as accurate.

#define QGEMV_ROWS 4

// int8, per output channel: row = f32 scale s, then `padded` codes; w_hat = s * q.
extern "C" __global__ void qgemv_i8(const unsigned char* w, const float* x, const float* bias,
                                    float* out, int in, int out_features, int padded) {
    int lane = threadIdx.x & 31;
    int o = blockIdx.x * QGEMV_ROWS + (threadIdx.x >> 5);
    if (o >= out_features) return;
    long row_bytes = (long)padded + 4;
    const unsigned char* row = w + (long)o * row_bytes;
    const signed char* q = (const signed char*)(row + 4);
    const float* xr = x + (long)blockIdx.y * in;
    float acc = 0.0f;
    // Four codes per 32-bit load: the codes start 4 bytes into a row of 4 + 32k bytes.
    for (int i = lane * 4; i < in; i += 128) {
        int packed = *(const int*)(q + i);
        #pragma unroll
        for (int k = 0; k < 4; k++) {
            if (i + k < in) acc += (float)(signed char)(packed >> (8 * k)) * xr[i + k];
        }
    }
    acc = warp_sum(acc);
    if (lane == 0) {
        float s = *(const float*)row;
        out[(long)blockIdx.y * out_features + o] = acc * s + (bias ? bias[o] : 0.0f);
    }
}

// int4, group-wise (groups of `group` values, a multiple of 32), with the minimum m of
// each group as `form` gives it (int4_min in prelude.cuh): per group,
// sum_i (d q_i + m) x_i = d * sum_i q_i x_i + m * sum_i x_i. Lane l takes the runs of 32
// values l, l + 32, ...: 16 bytes of codes each, as four 32-bit words (runs sit at 16-byte
// offsets from the row start, which is 4-byte aligned in rows with stored minimums or zero
// points and 2-byte aligned in symmetric ones: those whose row size is not a multiple of 4 read 16-bit halves).
extern "C" __global__ void qgemv_i4(const unsigned char* w, const float* x, const float* bias,
                                    float* out, int in, int out_features, int padded,
                                    int group, int form) {
    int lane = threadIdx.x & 31;
    int o = blockIdx.x * QGEMV_ROWS + (threadIdx.x >> 5);
    if (o >= out_features) return;
    int groups = padded / group;
    long row_bytes = (long)groups * ((form == 1 ? 2 : 4) + group / 2);
    const unsigned char* row = w + (long)o * row_bytes;
    const f16_bits* d = (const f16_bits*)(row + padded / 2);
    const float* xr = x + (long)blockIdx.y * in;
    float acc = 0.0f;
    bool aligned = (row_bytes & 3) == 0;
    for (int run = lane; run * 32 < in; run += 32) {
        const unsigned int* codes = (const unsigned int*)(row + run * 16);
        const unsigned short* halves = (const unsigned short*)(row + run * 16);
        float qx = 0.0f, sx = 0.0f;
        #pragma unroll
        for (int word = 0; word < 4; word++) {
            unsigned int c = aligned ? codes[word]
                                     : (unsigned int)halves[2 * word] |
                                           ((unsigned int)halves[2 * word + 1] << 16);
            #pragma unroll
            for (int k = 0; k < 4; k++) {
                int j = word * 4 + k;
                unsigned int byte = (c >> (8 * k)) & 255u;
                int lo = run * 32 + j, hi = lo + 16;
                if (lo < in) {
                    qx += (float)(byte & 15u) * xr[lo];
                    sx += xr[lo];
                }
                if (hi < in) {
                    qx += (float)(byte >> 4) * xr[hi];
                    sx += xr[hi];
                }
            }
        }
        int gi = run * 32 / group;
        float scale = f16_to_f32(d[gi]);
        acc += scale * qx + int4_min(d, groups, gi, scale, form) * sx;
    }
    acc = warp_sum(acc);
    if (lane == 0) out[(long)blockIdx.y * out_features + o] = acc + (bias ? bias[o] : 0.0f);
}

// K-quants (`kq` 1: Q4_K, 2: Q5_K, 3: Q6_K; `blocks` super-blocks of 256 values per row):
// lane l takes 8 values of each super-block, those of run l / 4 from (l % 4) * 8, with the
// run's scales read once; f32 activations as in qgemv_i4.
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
