// Token choice on the device, so only the chosen ids (and, for top-k, k values) cross to
// the host. Order: larger value first, the smaller index first on ties (the first maximum,
// as flm_core::Op::Argmax); NaN values are never chosen.

// (v, i) comes before (w, j) in the order above.
__device__ __forceinline__ bool before(float v, int i, float w, int j) {
    return v > w || (v == w && i < j);
}

// Reduces each thread's best (bv, bi) (index -1 for none) over the block, in the order
// above; the result is thread 0's. Every thread of the block must call it.
__device__ void reduce_best(float* bv, int* bi) {
    __shared__ float sv[32];
    __shared__ int si[32];
    for (int o = 16; o > 0; o >>= 1) {
        float ov = __shfl_xor_sync(0xffffffffu, *bv, o);
        int oi = __shfl_xor_sync(0xffffffffu, *bi, o);
        if (oi >= 0 && (*bi < 0 || before(ov, oi, *bv, *bi))) {
            *bv = ov;
            *bi = oi;
        }
    }
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    __syncthreads();
    if (lane == 0) {
        sv[warp] = *bv;
        si[warp] = *bi;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < warps; w++) {
            if (si[w] >= 0 && (*bi < 0 || before(sv[w], si[w], *bv, *bi))) {
                *bv = sv[w];
                *bi = si[w];
            }
        }
    }
}

// The best (value, index) of the block, among elements strictly after (after_v, after_i)
// (pass +inf, -1 for the overall best). Index -1 when none.
__device__ void block_best(const float* x, int cols, float after_v, int after_i, float* out_v,
                           int* out_i) {
    float bv = -INFINITY;
    int bi = -1;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {
        float v = x[c];
        if (v == v && before(after_v, after_i, v, c) && (bi < 0 || before(v, c, bv, bi))) {
            bv = v;
            bi = c;
        }
    }
    reduce_best(&bv, &bi);
    if (threadIdx.x == 0) {
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

// ---- flm_core::Op::Sample: flm_core::sample_tensors on the GPU, one block of
// SAMPLE_THREADS threads. Every operation on the host's path is written with the
// round-to-nearest intrinsics, so that NVRTC contracts none of them into an FMA; the sums
// run in the host's order on one thread. Where it may still differ from the host: expf
// (CUDA's is within 2 ulp, the host's libm within 1), so a draw that falls within a few
// ulp of a boundary between two candidates may pick the neighbour.

#define SAMPLE_THREADS 1024

// One ChaCha quarter round (Bernstein 2008).
__device__ __forceinline__ void chacha_quarter(unsigned* x, int a, int b, int c, int d) {
    x[a] += x[b]; x[d] = __funnelshift_l(x[d] ^ x[a], x[d] ^ x[a], 16);
    x[c] += x[d]; x[b] = __funnelshift_l(x[b] ^ x[c], x[b] ^ x[c], 12);
    x[a] += x[b]; x[d] = __funnelshift_l(x[d] ^ x[a], x[d] ^ x[a], 8);
    x[c] += x[d]; x[b] = __funnelshift_l(x[b] ^ x[c], x[b] ^ x[c], 7);
}

// Word `pos` of the ChaCha8 stream under `key` (flm_core::chacha8_word: rand_chacha's
// ChaCha8Rng, 64-bit block counter, nonce 0).
__device__ unsigned chacha8_word(const unsigned* key, unsigned long long pos) {
    unsigned long long block = pos >> 4;
    unsigned in[16] = {0x61707865u, 0x3320646eu, 0x79622d32u, 0x6b206574u,
                       key[0], key[1], key[2], key[3], key[4], key[5], key[6], key[7],
                       (unsigned)block, (unsigned)(block >> 32), 0u, 0u};
    unsigned x[16];
    for (int i = 0; i < 16; i++) x[i] = in[i];
    for (int r = 0; r < 4; r++) {
        chacha_quarter(x, 0, 4, 8, 12);
        chacha_quarter(x, 1, 5, 9, 13);
        chacha_quarter(x, 2, 6, 10, 14);
        chacha_quarter(x, 3, 7, 11, 15);
        chacha_quarter(x, 0, 5, 10, 15);
        chacha_quarter(x, 1, 6, 11, 12);
        chacha_quarter(x, 2, 7, 8, 13);
        chacha_quarter(x, 3, 4, 9, 14);
    }
    int w = (int)(pos & 15);
    return x[w] + in[w];
}

// The repetition penalty (CTRL) and the presence and frequency penalties (OpenAI) of one
// logit, as flm_core's repetition_penalised and count_penalised.
__device__ __forceinline__ float penalised(float l, unsigned seen, unsigned count, float rp,
                                           float presence, float frequency) {
    if (seen != 0u && rp != 1.0f) l = l > 0.0f ? __fdiv_rn(l, rp) : __fmul_rn(l, rp);
    if ((presence != 0.0f || frequency != 0.0f) && count > 0u)
        l = __fsub_rn(l, __fadd_rn(__fmul_rn(__uint2float_rn(count), frequency), presence));
    return l;
}

// Whether candidate (a, ia) sorts before (b, ib): the larger scaled logit first, the lower
// id first on ties. The slots of NaN logits and the padding past the vocabulary have id
// 0xffffffff and sort after every candidate.
__device__ __forceinline__ bool sorts_before(float a, unsigned ia, float b, unsigned ib) {
    if (ia == 0xffffffffu) return false;
    if (ib == 0xffffffffu) return true;
    return a > b || (a == b && ia < ib);
}

// One block: penalties, then argmax (greedy) or temperature, a bitonic sort of every
// candidate (larger scaled logit first, the lower id first on ties; Batcher 1968) in the
// scratch keys/ids of n_pad (a power of two >= vocab) slots, top-k, softmax, top-p and the
// draw, as flm_core::sample_tensors. Writes out[0] (0xffffffff when every logit is NaN),
// then marks the id in seen, counts it and advances the stream.
extern "C" __global__ void sample_row(const float* logits, int vocab, unsigned* seen,
                                      unsigned* counts, unsigned* state, unsigned* out,
                                      float* keys, unsigned* ids, int n_pad, float rp,
                                      float presence, float frequency, float inv_t, int greedy,
                                      int top_k, float top_p) {
    __shared__ int n_valid;
    __shared__ int chosen;
    int t = threadIdx.x;
    if (t == 0) n_valid = 0;
    __syncthreads();
    float bv = -INFINITY;
    int bi = -1, valid = 0;
    for (int c = t; c < n_pad; c += blockDim.x) {
        float l = __int_as_float(0x7fffffff);
        if (c < vocab) l = penalised(logits[c], seen[c], counts[c], rp, presence, frequency);
        if (greedy) {
            // flm_core::argmax: the first maximum; NaN and -inf never win.
            if (l > bv) {
                bv = l;
                bi = c;
            }
            if (l == l) valid++;
        } else if (l == l) {
            keys[c] = __fmul_rn(l, inv_t);
            ids[c] = (unsigned)c;
            valid++;
        } else {
            keys[c] = -INFINITY;
            ids[c] = 0xffffffffu;
        }
    }
    if (greedy) {
        atomicAdd(&n_valid, valid);
        reduce_best(&bv, &bi);
        __syncthreads();
        // As flm_core::sample_tensors: all-NaN logits are an error, all -inf picks id 0.
        if (t == 0) chosen = n_valid == 0 ? -1 : (bi < 0 ? 0 : bi);
    } else {
        atomicAdd(&n_valid, valid);
        __syncthreads();
        // Bitonic sort into the order above: each step compares disjoint pairs (i, i ^ j).
        for (int k = 2; k <= n_pad; k <<= 1) {
            for (int j = k >> 1; j > 0; j >>= 1) {
                for (int i = t; i < n_pad; i += blockDim.x) {
                    int p = i ^ j;
                    if (p > i) {
                        float a = keys[i], b = keys[p];
                        unsigned ia = ids[i], ib = ids[p];
                        bool first = (i & k) == 0;
                        bool swap = first ? sorts_before(b, ib, a, ia) : sorts_before(a, ia, b, ib);
                        if (swap) {
                            keys[i] = b;
                            keys[p] = a;
                            ids[i] = ib;
                            ids[p] = ia;
                        }
                    }
                }
                __syncthreads();
            }
        }
        int n = n_valid;
        int kept = top_k > 0 && top_k < n ? top_k : n;
        if (n > 0) {
            // exp in parallel (each value on its own, as the host computes it).
            float max = keys[0];
            __syncthreads();
            for (int i = t; i < kept; i += blockDim.x) keys[i] = expf(__fsub_rn(keys[i], max));
            __syncthreads();
        }
        if (t == 0) {
            if (n == 0) {
                chosen = -1;
            } else {
                float sum = 0.0f;
                for (int i = 0; i < kept; i++) sum = __fadd_rn(sum, keys[i]);
                float cumulative = 0.0f;
                int keep = kept;
                for (int i = 0; i < kept; i++) {
                    keys[i] = __fdiv_rn(keys[i], sum);
                    cumulative = __fadd_rn(cumulative, keys[i]);
                    if (cumulative >= top_p) {
                        keep = i + 1;
                        break;
                    }
                }
                float total = 0.0f;
                for (int i = 0; i < keep; i++) total = __fadd_rn(total, keys[i]);
                unsigned long long pos =
                    (unsigned long long)state[8] | ((unsigned long long)state[9] << 32);
                unsigned word = chacha8_word(state, pos);
                pos += 1;
                state[8] = (unsigned)pos;
                state[9] = (unsigned)(pos >> 32);
                // rand 0.9's random::<f32>(): the 24 high bits times 2^-24.
                float r = __fmul_rn(__fmul_rn(__uint2float_rn(word >> 8), 5.9604644775390625e-8f),
                                    total);
                // flm_core's pick: the first id whose cumulative weight exceeds r, else the
                // last of positive weight.
                float acc = 0.0f;
                int last = 0;
                chosen = -2;
                for (int i = 0; i < keep; i++) {
                    float w = keys[i];
                    if (w > 0.0f) {
                        acc = __fadd_rn(acc, w);
                        last = (int)ids[i];
                        if (r < acc) {
                            chosen = last;
                            break;
                        }
                    }
                }
                if (chosen == -2) chosen = last;
            }
        }
    }
    if (t == 0) {
        if (chosen < 0) {
            out[0] = 0xffffffffu;
        } else {
            out[0] = (unsigned)chosen;
            seen[chosen] = 1u;
            if (counts[chosen] != 0xffffffffu) counts[chosen] += 1u;
        }
    }
}
