// Quantised weights dequantised into f16 rows, for the prefill GEMM (flm_core::Op::Linear
// with more than GEMV_MAX_ROWS input rows): the rows [row0, row0 + rows) of an int8 or int4
// weight in the GPU GEMV layout of flm_devices::gemv_layout (the layout they have in GPU
// memory), or of a weight in rows of ggml's blocks of `row_bytes` bytes (the K-quants,
// Q5_0, Q8_0, IQ4_NL, IQ4_XS, MXFP4; dequant_value in prelude.cuh), become `rows` f16 rows of
// `in` values, which cuBLAS then multiplies on tensor cores. Each weight is read once per
// op this way, not once per input row as in qgemv.cu. One thread per output value,
// consecutive threads along a row, so the f16 writes coalesce; a value is rounded to f16
// once, to nearest even.

extern "C" __global__ void dequant_f16_rows(const unsigned char* w, f16_bits* out, int in,
                                            int row0, int rows, long row_bytes, int ld,
                                            int group, int form, int gq, long params) {
    long total = (long)rows * in;
    for (long i = (long)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (long)gridDim.x * blockDim.x) {
        long r = i / in;
        int c = (int)(i - r * in);
        float v = dequant_value(w, row0 + r, c, row_bytes, ld, group, form, gq, params);
        out[i] = f32_to_f16(v);
    }
}
