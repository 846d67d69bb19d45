// Quantised weights dequantised into f16 rows, for the prefill GEMM (flm_core::Op::Linear
// with more than GEMV_MAX_ROWS input rows): the rows [row0, row0 + rows) of an int8, int4
// or K-quant weight in the .flm row layout (row_bytes bytes each; the layouts in
// prelude.cuh) become `rows` f16 rows of `in` values, which cuBLAS then multiplies on tensor
// cores. Each weight is read once per op this way, not once per input row as in qgemv.cu.
//
// `kind` 0: int8; 1: int4 with groups of `group` and minimum `form` (int4_min); 2: K-quant
// `kq` (dequant_k). One thread per output value, consecutive threads along a row, so the
// f16 writes coalesce; a value is rounded to f16 once, to nearest even.
extern "C" __global__ void dequant_f16_rows(const unsigned char* w, f16_bits* out, int in,
                                            long row_bytes, int row0, int rows, int kind,
                                            int padded, int group, int form, int kq) {
    long total = (long)rows * in;
    for (long i = (long)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (long)gridDim.x * blockDim.x) {
        long r = i / in;
        int c = (int)(i - r * in);
        const unsigned char* row = w + (row0 + r) * row_bytes;
        float v = kind == 0 ? dequant_i8(row, c)
                  : kind == 1 ? dequant_i4(row, c, padded, group, form)
                              : dequant_k(row, c, kq);
        out[i] = f32_to_f16(v);
    }
}
