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

// ggml's blocks as flm keeps them (the dtypes of flm_core::Format::Ggml; layouts in
// flm_core::ggml and flm_core::blocks), `gq` the code of kernels.rs's GgmlBlocks. Every
// type is runs of 32 values, one or eight to a block; value l of run r of a block is
// s.x * gq_code(r, l) - s.y, s = gq_run_scales(r): the K-quants' (flm_core::kquant), Q8_0's
// d q, Q5_0's d (q - 16), and the 4-bit lookup types' scale times one of 16 int8 levels
// (IQ4_NL d K[q], IQ4_XS d (sc_r - 32) K[q], MXFP4 2^(e - 128) E[q] with the E2M1 values
// doubled, as ggml's ggml_e8m0_to_fp32_half and kvalues_mxfp4 give them).
#define GQ_Q4_K 1
#define GQ_Q5_K 2
#define GQ_Q6_K 3
#define GQ_Q8_0 4
#define GQ_IQ4_NL 5
#define GQ_IQ4_XS 6
#define GQ_MXFP4 7
#define GQ_Q5_0 8

// (values, bytes) of a block of type gq (flm_core::ggml::GgmlType::block_len, block_bytes).
__device__ __forceinline__ int2 gq_block(int gq) {
    switch (gq) {
    case GQ_Q4_K: return make_int2(256, 144);
    case GQ_Q5_K: return make_int2(256, 176);
    case GQ_Q6_K: return make_int2(256, 210);
    case GQ_Q8_0: return make_int2(32, 34);
    case GQ_IQ4_NL: return make_int2(32, 18);
    case GQ_IQ4_XS: return make_int2(256, 136);
    case GQ_MXFP4: return make_int2(32, 17);
    case GQ_Q5_0: return make_int2(32, 22);
    }
    // The host passes only the codes above (kernels.rs's GgmlBlocks).
    __builtin_unreachable();
}

// ggml's 16 int8 levels of IQ4_NL and IQ4_XS (kvalues_iq4nl, flm_core::blocks::IQ4_LEVELS)
// and of MXFP4 (kvalues_mxfp4, flm_core::blocks::MXFP4_LEVELS), packed little-endian into
// four words each.
#define IQ4_LEVEL_WORDS 0xbfad9881u, 0xf6eaddcfu, 0x26190d01u, 0x71594535u
#define MXFP4_LEVEL_WORDS 0x03020100u, 0x0c080604u, 0xfdfeff00u, 0xf4f8fafcu

// Entry q (0-15) of a 16-entry int8 table packed into t0-t3, picked in registers by byte
// permutes (as ggml's CUDA get_int_from_table_16): a table in memory would serialise the
// lanes of a warp, whose codes differ.
__device__ __forceinline__ int lut16(unsigned int t0, unsigned int t1, unsigned int t2,
                                     unsigned int t3, int q) {
    unsigned int lo = __byte_perm(t0, t1, q & 7), hi = __byte_perm(t2, t3, q & 7);
    return (int)(signed char)((q < 8 ? lo : hi) & 0xffu);
}

// Code l of 32 stored as nibbles in 16 bytes: value l in the low nibble of byte l, value
// l + 16 in the high one (ggml's IQ4_NL, IQ4_XS and MXFP4 runs).
__device__ __forceinline__ int nibble32(const unsigned char* qs, int l) {
    return l < 16 ? (qs[l] & 15) : (qs[l - 16] >> 4);
}

// An f16 read a byte at a time, which assumes no alignment of the block it sits in.
__device__ __forceinline__ float f16_at(const unsigned char* p) {
    return f16_to_f32((f16_bits)(p[0] | (p[1] << 8)));
}

// 2^(e - 128), exactly (subnormal for e < 2): ggml's ggml_e8m0_to_fp32_half, half the E8M0
// scale, which MXFP4's doubled levels make whole again (flm_core::blocks::e8m0_half).
__device__ __forceinline__ float e8m0_half(unsigned int e) {
    return __uint_as_float(e < 2 ? 0x00200000u << e : (e - 1) << 23);
}

// The multiplier and subtrahend of run r of block b: (d sc_r, dmin m_r) for Q4_K/Q5_K
// (ggml's get_scale_min_k4), (d, 0) for Q6_K (whose scale is per 16 values: gq_code folds
// it in), the run's scale and 0 for the others.
__device__ __forceinline__ float2 gq_run_scales(const unsigned char* b, int gq, int r) {
    switch (gq) {
    case GQ_Q6_K: return make_float2(f16_at(b + 208), 0.0f);
    case GQ_Q8_0:
    case GQ_Q5_0:
    case GQ_IQ4_NL: return make_float2(f16_at(b), 0.0f);
    case GQ_IQ4_XS: {
        int low = (b[4 + r / 2] >> (4 * (r & 1))) & 15;
        int high = ((b[2] | (b[3] << 8)) >> (2 * r)) & 3;
        return make_float2(f16_at(b) * (float)((low | (high << 4)) - 32), 0.0f);
    }
    case GQ_MXFP4: return make_float2(e8m0_half(b[0]), 0.0f);
    }
    // Q4_K and Q5_K.
    const unsigned char* s = b + 4;
    int sc, m;
    if (r < 4) {
        sc = s[r] & 63;
        m = s[r + 4] & 63;
    } else {
        sc = (s[r + 4] & 15) | ((s[r - 4] >> 6) << 4);
        m = (s[r + 4] >> 4) | ((s[r] >> 6) << 4);
    }
    return make_float2(f16_at(b) * (float)sc, f16_at(b + 2) * (float)m);
}

// Code l of run r of block b, an exact integer: q for Q4_K/Q5_K, sc (q - 32) for Q6_K, the
// int8 q for Q8_0, q - 16 for Q5_0 (bit 4 of code l in bit l of the u32 at byte 2, read a
// byte at a time), the level of q for the 4-bit lookup types.
__device__ __forceinline__ float gq_code(const unsigned char* b, int gq, int r, int l) {
    switch (gq) {
    case GQ_Q6_K: {
        int half = r >> 2, t = r & 3;
        int low = (b[half * 64 + (t & 1) * 32 + l] >> (4 * (t >> 1))) & 15;
        int high = (b[128 + half * 32 + l] >> (2 * t)) & 3;
        int sc = (signed char)b[192 + (r * 32 + l) / 16];
        return (float)(sc * ((low | (high << 4)) - 32));
    }
    case GQ_Q8_0: return (float)(signed char)b[2 + l];
    case GQ_Q5_0: {
        int high = (b[2 + l / 8] >> (l % 8)) & 1;
        return (float)((nibble32(b + 6, l) | (high << 4)) - 16);
    }
    case GQ_IQ4_NL: return (float)lut16(IQ4_LEVEL_WORDS, nibble32(b + 2, l));
    case GQ_IQ4_XS: return (float)lut16(IQ4_LEVEL_WORDS, nibble32(b + 8 + 16 * r, l));
    case GQ_MXFP4: return (float)lut16(MXFP4_LEVEL_WORDS, nibble32(b + 1, l));
    }
    // Q4_K and Q5_K.
    const unsigned char* qs = b + (gq == GQ_Q5_K ? 48 : 16);
    int q = (qs[(r >> 1) * 32 + l] >> (4 * (r & 1))) & 15;
    if (gq == GQ_Q5_K) q |= ((b[16 + l] >> r) & 1) << 4;
    return (float)q;
}

// The block holding run j (counted from the row's start) of a row of ggml blocks, and the
// run's index r in it.
__device__ __forceinline__ const unsigned char* gq_run_block(const unsigned char* row, int gq,
                                                             int j, int* r) {
    int2 blk = gq_block(gq);
    int runs = blk.x / 32;
    *r = j % runs;
    return row + (long)(j / runs) * blk.y;
}

// Value i of a row of ggml blocks.
__device__ __forceinline__ float dequant_ggml(const unsigned char* row, int i, int gq) {
    int r;
    const unsigned char* b = gq_run_block(row, gq, i / 32, &r);
    float2 s = gq_run_scales(b, gq, r);
    return s.x * gq_code(b, gq, r, i % 32) - s.y;
}

// Value c of row r of a quantised weight as the prefill and the embedding read it: rows of
// ggml blocks of `row_bytes` bytes (`gq` 1-8, dequant_ggml), or an int8/int4 weight in the
// GPU GEMV layout (`gq` 0, dequant_packed).
__device__ __forceinline__ float dequant_value(const unsigned char* w, long r, int c,
                                              long row_bytes, int ld, int group, int form,
                                              int gq, long params) {
    return gq ? dequant_ggml(w + r * row_bytes, c, gq)
              : dequant_packed(w, r, c, ld, params, group, form);
}
