// Prepended to every kernel source of devices/src/cuda/kernels (see kernels.rs): the
// conversions and reductions the kernels share. No headers, so NVRTC needs no include path.

// math.h is not included, so its INFINITY is defined here (the f32 +inf bit pattern).
#define INFINITY __int_as_float(0x7f800000)

typedef unsigned short f16_bits;
typedef unsigned short bf16_bits;

// IEEE half to float, exact (the PTX conversion the hardware provides).
__device__ __forceinline__ float f16_to_f32(f16_bits h) {
    float f;
    asm("{ .reg .b16 t; mov.b16 t, %1; cvt.f32.f16 %0, t; }" : "=f"(f) : "h"(h));
    return f;
}

// float to IEEE half, round to nearest even (as the `half` crate rounds).
__device__ __forceinline__ f16_bits f32_to_f16(float f) {
    f16_bits h;
    asm("{ .reg .b16 t; cvt.rn.f16.f32 t, %1; mov.b16 %0, t; }" : "=h"(h) : "f"(f));
    return h;
}

// bfloat16 to float: the upper half of the f32 bits, exact.
__device__ __forceinline__ float bf16_to_f32(bf16_bits h) {
    return __uint_as_float(((unsigned int)h) << 16);
}

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// The maximum (MAX) or the sum over the block (blockDim.x a multiple of 32, at most 1024);
// every thread gets it. `scratch` holds 32 floats of shared memory.
template <bool MAX>
__device__ float block_reduce(float v, float* scratch) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    v = MAX ? warp_max(v) : warp_sum(v);
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = lane < warps ? scratch[lane] : (MAX ? -INFINITY : 0.0f);
    return MAX ? warp_max(v) : warp_sum(v);
}

__device__ float block_sum(float v, float* scratch) { return block_reduce<false>(v, scratch); }

__device__ float block_max(float v, float* scratch) { return block_reduce<true>(v, scratch); }

// The flash-decoding chunks of attention.cu and paged_attention.cu (Dao et al. 2023): a
// chunk the row sees nothing of writes m = -inf, l = 0 and a zero output, which the
// combine skips.
__device__ void flash_empty_part(float* part_m, float* part_l, float* o, long part,
                                 int head_dim) {
    if (threadIdx.x == 0) {
        part_m[part] = -INFINITY;
        part_l[part] = 0.0f;
    }
    for (int d = threadIdx.x; d < head_dim; d += blockDim.x) o[d] = 0.0f;
}

// The softmax numerator of a chunk's `count` scores in shared memory, over the block:
// each score s becomes e^(s - m) with m their maximum; returns m and sets *l to the sum.
__device__ float flash_chunk_softmax(float* scores, long count, float* scratch, float* l) {
    float mx = -INFINITY;
    for (long i = threadIdx.x; i < count; i += blockDim.x) mx = fmaxf(mx, scores[i]);
    mx = block_max(mx, scratch);
    float sum = 0.0f;
    for (long i = threadIdx.x; i < count; i += blockDim.x) {
        float e = expf(scores[i] - mx);
        scores[i] = e;
        sum += e;
    }
    *l = block_sum(sum, scratch);
    return mx;
}

// Element `i` of a float weight vector of dtype `W` (0: f32, 1: f16, 2: bf16).
template <int W>
__device__ __forceinline__ float load_w(const void* w, long i) {
    if (W == 0) return ((const float*)w)[i];
    if (W == 1) return f16_to_f32(((const f16_bits*)w)[i]);
    return bf16_to_f32(((const bf16_bits*)w)[i]);
}

// A KV cache element (flm_core::KvDtype: f32 or f16) widened exactly to f32 as it is read,
// and an f32 value stored into one (f16: rounded to nearest even, as the CPU's `half`).
__device__ __forceinline__ float kv_to_f32(float v) { return v; }
__device__ __forceinline__ float kv_to_f32(f16_bits v) { return f16_to_f32(v); }
__device__ __forceinline__ void kv_from_f32(float* dst, float v) { *dst = v; }
__device__ __forceinline__ void kv_from_f32(f16_bits* dst, float v) { *dst = f32_to_f16(v); }

// (d, m) of group `gi` (counted over the whole weight, row by row) of an int4 weight in the
// GPU GEMV layout of flm_devices::gemv_layout, whose group parameters start at `params`: f16
// d alone (`form` 1, m = -8 d), or the pair (f16 d, f16 v) with m = v (`form` 0) or
// m = -v d (`form` 2).
__device__ __forceinline__ float2 packed_int4_params(const unsigned char* params, long gi,
                                                    int form) {
    if (form == 1) {
        float d = f16_to_f32(((const f16_bits*)params)[gi]);
        return make_float2(d, -8.0f * d);
    }
    // One 4-byte load per pair (`params` is 16-byte aligned), d in its low half.
    unsigned int pair = ((const unsigned int*)params)[gi];
    float d = f16_to_f32((f16_bits)(pair & 0xffffu)), v = f16_to_f32((f16_bits)(pair >> 16));
    return make_float2(d, form == 2 ? -(v * d) : v);
}

// Value c of row r of an int8 (`group` 0) or int4 (groups of `group`, minimum as `form`:
// 0 an f16 minimum, 1 none (int4-sym, m = -8 d), 2 an f16 zero point z, m = -z d) weight
// in the GPU GEMV layout of flm_devices::gemv_layout, the layout int8/int4 tensors have in
// GPU memory: `ld` codes per row (one byte each for int8; for int4, in each run of 32 values
// byte i holds value i in its low nibble and value i + 16 in its high nibble), then from
// byte `params` the f32 scale of each row (int8) or its ld / group parameters
// (packed_int4_params).
__device__ __forceinline__ float dequant_packed(const unsigned char* w, long r, int c, int ld,
                                               long params, int group, int form) {
    if (group == 0) {
        return ((const float*)(w + params))[r] * (float)(signed char)w[r * ld + c];
    }
    int j = c & 31;
    unsigned char byte = w[r * (ld / 2) + (c >> 5) * 16 + (j & 15)];
    int q = j < 16 ? (byte & 15) : (byte >> 4);
    float2 dm = packed_int4_params(w + params, r * (ld / group) + c / group, form);
    return dm.x * (float)q + dm.y;
}

// ggml's K-quant super-blocks of 256 values (flm_core::kquant, block layouts in
// flm_core::ggml), `kq` 1: Q4_K (144 bytes), 2: Q5_K (176), 3: Q6_K (210). Value `e` of
// run `r = e / 32`, `l = e % 32`: Q4_K/Q5_K (d sc_r) q - dmin m_r, Q6_K (d sc_{e/16}) (q - 32).
__device__ __forceinline__ int kq_block_bytes(int kq) {
    return kq == 1 ? 144 : (kq == 2 ? 176 : 210);
}

// The multiplier and subtrahend of run r: (d sc_r, dmin m_r) for Q4_K/Q5_K (ggml's
// get_scale_min_k4), (d, 0) for Q6_K (whose scale is per 16 values: kq_code folds it in).
__device__ __forceinline__ float2 kq_run_scales(const unsigned char* b, int kq, int r) {
    if (kq == 3) return make_float2(f16_to_f32(*(const f16_bits*)(b + 208)), 0.0f);
    const unsigned char* s = b + 4;
    int sc, m;
    if (r < 4) {
        sc = s[r] & 63;
        m = s[r + 4] & 63;
    } else {
        sc = (s[r + 4] & 15) | ((s[r - 4] >> 6) << 4);
        m = (s[r + 4] >> 4) | ((s[r] >> 6) << 4);
    }
    const f16_bits* h = (const f16_bits*)b;
    return make_float2(f16_to_f32(h[0]) * (float)sc, f16_to_f32(h[1]) * (float)m);
}

// Code l of run r: q for Q4_K/Q5_K; sc (q - 32) for Q6_K, an exact integer.
__device__ __forceinline__ float kq_code(const unsigned char* b, int kq, int r, int l) {
    if (kq == 3) {
        int half = r >> 2, t = r & 3;
        int low = (b[half * 64 + (t & 1) * 32 + l] >> (4 * (t >> 1))) & 15;
        int high = (b[128 + half * 32 + l] >> (2 * t)) & 3;
        int sc = (signed char)b[192 + (r * 32 + l) / 16];
        return (float)(sc * ((low | (high << 4)) - 32));
    }
    const unsigned char* qs = b + (kq == 2 ? 48 : 16);
    int q = (qs[(r >> 1) * 32 + l] >> (4 * (r & 1))) & 15;
    if (kq == 2) q |= ((b[16 + l] >> r) & 1) << 4;
    return (float)q;
}

// Value i of a K-quant row.
__device__ __forceinline__ float dequant_k(const unsigned char* row, int i, int kq) {
    const unsigned char* b = row + (long)(i / 256) * kq_block_bytes(kq);
    int r = (i % 256) / 32;
    float2 s = kq_run_scales(b, kq, r);
    return s.x * kq_code(b, kq, r, i % 32) - s.y;
}

// Value c of row r of a quantised weight as the prefill and the embedding read it: ggml's
// K-quant rows of `row_bytes` bytes (`kq` 1-3, dequant_k), or an int8/int4 weight in the GPU
// GEMV layout (`kq` 0, dequant_packed).
__device__ __forceinline__ float dequant_value(const unsigned char* w, long r, int c,
                                              long row_bytes, int ld, int group, int form,
                                              int kq, long params) {
    return kq ? dequant_k(w + r * row_bytes, c, kq)
              : dequant_packed(w, r, c, ld, params, group, form);
}
