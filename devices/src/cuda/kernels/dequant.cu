// Quantised weights dequantised into f16 rows, for the prefill GEMM (flm_core::Op::Linear
// with more than GEMV_MAX_ROWS input rows): the rows [row0, row0 + rows) of an int8, int4
// or K-quant weight in the .flm row layout (row_bytes bytes each; the layouts in
// prelude.cuh), or of an int8/int4 one in the GPU GEMV layout, become `rows` f16 rows of
// `in` values, which cuBLAS then multiplies on tensor cores. Each weight is read once per op
// this way, not once per input row as in qgemv.cu.
//
// `kind` 0: int8; 1: int4 with groups of `group` and minimum `form` (int4_min); 2: K-quant
// `kq` (dequant_k); 3 and 4: int8 and int4 in the GPU GEMV layout of
// flm_devices::gemv_layout (codes of `row_bytes` bytes per row, the f32 scales or the
// group parameters from byte `params` on; dequant_packed). One thread per output value,
// consecutive threads along a row, so the f16 writes coalesce; a value is rounded to f16
// once, to nearest even.

// Value c of row r of an int8 (`kind` 3) or int4 (`kind` 4) weight in the GPU GEMV layout
// (codes of `row_bytes` bytes per row, then from byte `params` the f32 scale of each row or
// kp / group parameters per row: f16 d, or the pair (f16 d, f16 v) unless `form` is 1).
__device__ __forceinline__ float dequant_packed(const unsigned char* w, long r, int c,
                                               long row_bytes, long params, int kind,
                                               int padded, int group, int form) {
    if (kind == 3) {
        return ((const float*)(w + params))[r] * (float)(signed char)w[r * row_bytes + c];
    }
    int j = c & 31;
    unsigned char byte = w[r * row_bytes + (c >> 5) * 16 + (j & 15)];
    int q = j < 16 ? (byte & 15) : (byte >> 4);
    float2 dm = packed_int4_params(w + params, r * (padded / group) + c / group, form);
    return dm.x * (float)q + dm.y;
}

extern "C" __global__ void dequant_f16_rows(const unsigned char* w, f16_bits* out, int in,
                                            long row_bytes, int row0, int rows, int kind,
                                            int padded, int group, int form, int kq,
                                            long params) {
    long total = (long)rows * in;
    for (long i = (long)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (long)gridDim.x * blockDim.x) {
        long r = i / in;
        int c = (int)(i - r * in);
        const unsigned char* row = w + (row0 + r) * row_bytes;
        float v = kind == 0   ? dequant_i8(row, c)
                  : kind == 1 ? dequant_i4(row, c, padded, group, form)
                  : kind == 2 ? dequant_k(row, c, kq)
                              : dequant_packed(w, row0 + r, c, row_bytes, params, kind,
                                               padded, group, form);
        out[i] = f32_to_f16(v);
    }
}
