// Element-wise ops on f32 activations (flm_core::Op::SiluMul, GeluMul, Gelu, SoftCap, Add,
// Scale), one
// thread per element, and the f32 -> f16 / bf16 conversions of activations before a cuBLAS
// GEMM on f16 / bf16 weights.

// SwiGLU gate (Shazeer 2020): out = silu(gate) * up, silu(x) = x / (1 + e^-x).
extern "C" __global__ void silu_mul(const float* gate, const float* up, float* out, long n) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        float g = gate[i];
        out[i] = g / (1.0f + expf(-g)) * up[i];
    }
}

// GELU, tanh approximation (Hendrycks & Gimpel 2016), in place.
extern "C" __global__ void gelu(float* x, long n) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        float v = x[i];
        x[i] = 0.5f * v * (1.0f + tanhf(0.7978845608028654f * (v + 0.044715f * v * v * v)));
    }
}

// GeGLU gate: out = gelu(gate) * up, GELU in the tanh approximation (as gelu below).
extern "C" __global__ void gelu_mul(const float* gate, const float* up, float* out, long n) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        float g = gate[i];
        float t = tanhf(0.7978845608028654f * (g + 0.044715f * g * g * g));
        out[i] = 0.5f * g * (1.0f + t) * up[i];
    }
}

// Soft-capping in place (Gemma 2): x = cap * tanh(x / cap).
extern "C" __global__ void soft_cap(float* x, float cap, long n) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = cap * tanhf(x[i] / cap);
}

// x += y.
extern "C" __global__ void add(float* x, const float* y, long n) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] += y[i];
}

// x *= alpha.
extern "C" __global__ void scale(float* x, float alpha, long n) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] *= alpha;
}

// out = f16(x), round to nearest even.
extern "C" __global__ void f32_to_f16_rows(const float* x, f16_bits* out, long n) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = f32_to_f16(x[i]);
}

// out = bf16(x), round to nearest even (as the `half` crate rounds); NaN stays a quiet NaN.
extern "C" __global__ void f32_to_bf16_rows(const float* x, bf16_bits* out, long n) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        unsigned int u = __float_as_uint(x[i]);
        if ((u & 0x7fffffffu) > 0x7f800000u) out[i] = (bf16_bits)((u >> 16) | 0x40u);
        else out[i] = (bf16_bits)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
    }
}

// out[r, j] = x[r, perm[j]] for rows of k floats: the input of a Linear whose weight's input
// channels are permuted (flm_core::Data::input_perm, act-order GPTQ). perm is checked on the
// host when attached to a host weight; an index outside 0..k (only possible for one attached
// in device memory) reads nothing and gives 0.
extern "C" __global__ void gather_cols(const float* x, const int* perm, float* out, int k,
                                       long n) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        long row = i / k;
        int p = perm[i - row * k];
        out[i] = (p >= 0 && p < k) ? x[row * k + p] : 0.0f;
    }
}

// dst[r, dst_col0 + c] = src[r, src_col0 + c] for the n rows and `cols` columns of a block
// of two f32 matrices with rows of src_ld and dst_ld values (total = n * cols): one head's
// columns gathered out of, or written back into, a row of all heads
// (flm_core::Op::HeadLinear).
extern "C" __global__ void copy_cols(const float* src, int src_ld, int src_col0, float* dst,
                                     int dst_ld, int dst_col0, int cols, long total) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < total) {
        long r = i / cols;
        int c = (int)(i - r * cols);
        dst[r * dst_ld + dst_col0 + c] = src[r * src_ld + src_col0 + c];
    }
}

// dst[row0 + r, :] = src[r, :] for r < n_rows, rows of `cols` values, with row0 = *dst_row
// read from device memory (flm_core::Op::CopyRows of a step's keys and values into the KV
// cache: a captured decode graph writes each step at its own row). The host checks the row
// before each replay; rows that would pass dst_rows are not written. An f16 cache
// (copy_rows_at_f16) rounds to nearest even (kv_from_f32).

template <typename T>
__device__ void copy_rows_at_t(const float* src, T* dst, const unsigned int* dst_row, int cols,
                               int n_rows, unsigned int dst_rows) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    long n = (long)n_rows * cols;
    unsigned int row0 = dst_row[0];
    if (i < n && row0 <= dst_rows && (unsigned long)n_rows <= (unsigned long)(dst_rows - row0)) {
        kv_from_f32(dst + (long)row0 * cols + i, src[i]);
    }
}

extern "C" __global__ void copy_rows_at(const float* src, float* dst,
                                        const unsigned int* dst_row, int cols, int n_rows,
                                        unsigned int dst_rows) {
    copy_rows_at_t(src, dst, dst_row, cols, n_rows, dst_rows);
}

extern "C" __global__ void copy_rows_at_f16(const float* src, f16_bits* dst,
                                            const unsigned int* dst_row, int cols, int n_rows,
                                            unsigned int dst_rows) {
    copy_rows_at_t(src, dst, dst_row, cols, n_rows, dst_rows);
}
