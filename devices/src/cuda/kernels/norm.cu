// RMSNorm (Zhang & Sennrich 2019) and LayerNorm (Ba et al. 2016) over rows of f32
// activations, one block per row; the gain (and LayerNorm's shift) are f32, f16 or bf16.
// Math as flm_core::Op::RmsNorm / Op::LayerNorm: the sums are taken in f32.

template <int W>
__device__ void rms_norm(const float* x, const void* w, float* y, int dim, float eps) {
    __shared__ float scratch[32];
    const float* xr = x + (long)blockIdx.x * dim;
    float* yr = y + (long)blockIdx.x * dim;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) ss += xr[i] * xr[i];
    ss = block_sum(ss, scratch);
    float inv = rsqrtf(ss / (float)dim + eps);
    for (int i = threadIdx.x; i < dim; i += blockDim.x) yr[i] = xr[i] * inv * load_w<W>(w, i);
}

template <int W>
__device__ void layer_norm(const float* x, const void* w, const void* b, float* y, int dim,
                           float eps) {
    __shared__ float scratch[32];
    const float* xr = x + (long)blockIdx.x * dim;
    float* yr = y + (long)blockIdx.x * dim;
    float s = 0.0f;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) s += xr[i];
    float mean = block_sum(s, scratch) / (float)dim;
    float v = 0.0f;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) {
        float d = xr[i] - mean;
        v += d * d;
    }
    float inv = rsqrtf(block_sum(v, scratch) / (float)dim + eps);
    for (int i = threadIdx.x; i < dim; i += blockDim.x)
        yr[i] = (xr[i] - mean) * inv * load_w<W>(w, i) + load_w<W>(b, i);
}

#define NORMS(SUFFIX, W)                                                                   \
    extern "C" __global__ void rms_norm_##SUFFIX(const float* x, const void* w, float* y,  \
                                                 int dim, float eps) {                     \
        rms_norm<W>(x, w, y, dim, eps);                                                    \
    }                                                                                      \
    extern "C" __global__ void layer_norm_##SUFFIX(const float* x, const void* w,          \
                                                   const void* b, float* y, int dim,       \
                                                   float eps) {                            \
        layer_norm<W>(x, w, b, y, dim, eps);                                               \
    }

NORMS(f32, 0)
NORMS(f16, 1)
NORMS(bf16, 2)
