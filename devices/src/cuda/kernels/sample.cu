// Token choice on the device, so only the chosen ids (and, for top-k, k values) cross to
// the host. Order: larger value first, the smaller index first on ties (the first maximum,
// as flm_core::Op::Argmax); NaN values are never chosen.

// (v, i) comes before (w, j) in the order above.
__device__ __forceinline__ bool before(float v, int i, float w, int j) {
    return v > w || (v == w && i < j);
}

// The best (value, index) of the block, among elements strictly after (after_v, after_i)
// (pass +inf, -1 for the overall best). Index -1 when none.
__device__ void block_best(const float* x, int cols, float after_v, int after_i, float* out_v,
                           int* out_i) {
    __shared__ float sv[32];
    __shared__ int si[32];
    float bv = -INFINITY;
    int bi = -1;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {
        float v = x[c];
        if (v == v && before(after_v, after_i, v, c) && (bi < 0 || before(v, c, bv, bi))) {
            bv = v;
            bi = c;
        }
    }
    for (int o = 16; o > 0; o >>= 1) {
        float ov = __shfl_xor_sync(0xffffffffu, bv, o);
        int oi = __shfl_xor_sync(0xffffffffu, bi, o);
        if (oi >= 0 && (bi < 0 || before(ov, oi, bv, bi))) {
            bv = ov;
            bi = oi;
        }
    }
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    __syncthreads();
    if (lane == 0) {
        sv[warp] = bv;
        si[warp] = bi;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < warps; w++) {
            if (si[w] >= 0 && (bi < 0 || before(sv[w], si[w], bv, bi))) {
                bv = sv[w];
                bi = si[w];
            }
        }
        *out_v = bv;
        *out_i = bi;
    }
    __syncthreads();
}

// out[r] = index of the first maximum of row r (0 for a row of NaNs); one block per row.
extern "C" __global__ void argmax_rows(const float* x, int cols, unsigned int* out) {
    __shared__ float v;
    __shared__ int i;
    block_best(x + (long)blockIdx.x * cols, cols, INFINITY, -1, &v, &i);
    if (threadIdx.x == 0) out[blockIdx.x] = i < 0 ? 0u : (unsigned int)i;
}

// The k best of row r in order (k passes, each taking the best after the previous one):
// ids[r, j], values[r, j]; index 0xffffffff and -inf past the row's non-NaN values.
extern "C" __global__ void top_k_rows(const float* x, int cols, int k, unsigned int* ids,
                                      float* values) {
    __shared__ float v;
    __shared__ int i;
    const float* row = x + (long)blockIdx.x * cols;
    float after_v = INFINITY;
    int after_i = -1;
    for (int j = 0; j < k; j++) {
        block_best(row, cols, after_v, after_i, &v, &i);
        if (i < 0) {
            for (int r = j + threadIdx.x; r < k; r += blockDim.x) {
                ids[(long)blockIdx.x * k + r] = 0xffffffffu;
                values[(long)blockIdx.x * k + r] = -INFINITY;
            }
            return;
        }
        if (threadIdx.x == 0) {
            ids[(long)blockIdx.x * k + j] = (unsigned int)i;
            values[(long)blockIdx.x * k + j] = v;
        }
        after_v = v;
        after_i = i;
    }
}
