//! The benchmarks' weights and activations: deterministic values, in the layouts the
//! model graphs give the CPU.

use flm_core::{panels, Data, DataType};

/// A weight in the layout the model graphs give the CPU (int8 in panels, packed at load).
pub fn weight(m: usize, k: usize, dtype: DataType) -> Data {
    let values: Vec<f32> = (0..m * k)
        .map(|i| ((i as u64 * 2_654_435_761) % 2001) as f32 / 1000.0 - 1.0)
        .collect();
    let w = Data::from_f32(&[m, k], &values)
        .and_then(|w| w.to_dtype(dtype))
        .expect("weight");
    if panels::has_panels(dtype) {
        w.to_panels().expect("panels")
    } else {
        w
    }
}

/// f32 `[n, k]` of small deterministic values.
pub fn input(n: usize, k: usize) -> Data {
    let values: Vec<f32> = (0..n * k).map(|i| (i % 17) as f32 - 8.0).collect();
    Data::from_f32(&[n, k], &values).expect("input")
}

/// The input `[n, k]` and the output `[n, m]` of a Linear.
pub fn operands(n: usize, m: usize, k: usize) -> (Data, Data) {
    (
        input(n, k),
        Data::zeros(DataType::F32, &[n, m]).expect("output"),
    )
}
