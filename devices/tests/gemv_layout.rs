//! The GPU GEMV layout (`flm_devices::gemv_layout`): a weight repacked for the CUDA decode
//! kernels and read back by walking the packed layout gives the weights that
//! `Data::to_f32_vec` dequantises from the .flm bytes, bit for bit, for every dtype with a
//! layout and odd shapes (columns not a multiple of the group or of 8, any row count).

use flm_core::{Data, DataType};
use flm_devices::gemv_layout::{has_layout, GemvLayout};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

#[test]
fn packed_weights_dequantise_to_the_flm_weights_exactly() {
    let mut rng = StdRng::seed_from_u64(34);
    let dtypes: Vec<DataType> = DataType::VALUES
        .into_iter()
        .filter(|&d| has_layout(d))
        .collect();
    assert_eq!(dtypes.len(), 12, "f16, bf16, int8 and nine int4 dtypes");
    for dtype in dtypes {
        for (m, k) in [(1, 8), (3, 333), (5, 1000), (7, 129), (4, 4096), (2, 31)] {
            let v: Vec<f32> = (0..m * k).map(|_| rng.random_range(-2.0..2.0)).collect();
            let w = Data::from_f32(&[m, k], &v)
                .unwrap()
                .to_dtype(dtype)
                .unwrap();
            let layout = GemvLayout::new(dtype, m, k).unwrap();
            let packed = layout.pack(w.bytes().unwrap()).unwrap();
            assert_eq!(packed.len(), layout.bytes);
            assert_eq!(layout.ld % 8, 0, "{dtype}: rows of whole 16-byte loads");
            assert_eq!(layout.params_offset % 16, 0, "{dtype}: aligned parameters");
            let got = layout.dequantize(&packed).unwrap();
            let want = w.to_f32_vec().unwrap();
            let same = got
                .iter()
                .zip(&want)
                .all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(same, "{dtype} [{m}, {k}]: packed weights differ");
            if layout.is_identity() {
                assert_eq!(&packed[..], w.bytes().unwrap(), "{dtype}: identity layout");
            }
        }
    }
}

#[test]
fn rows_are_16_byte_aligned_and_quantised_layouts_keep_the_flm_size() {
    for dtype in DataType::VALUES.into_iter().filter(|&d| has_layout(d)) {
        let layout = GemvLayout::new(dtype, 11008, 4095).unwrap();
        let row_bytes = match dtype {
            DataType::F16 | DataType::BF16 => 2 * layout.ld,
            _ if dtype.group_size().is_some() => layout.ld / 2,
            _ => layout.ld,
        };
        assert_eq!(row_bytes % 16, 0, "{dtype}");
        if dtype.is_quantized() {
            let flm = flm_core::quant::row_bytes(dtype, 4095).unwrap() * 11008;
            assert_eq!(layout.bytes, flm, "{dtype}");
        }
    }
}

#[test]
fn bad_sizes_are_errors() {
    let layout = GemvLayout::new(DataType::I4G32, 3, 40).unwrap();
    assert!(layout.pack(&[0u8; 7]).is_err());
    assert!(layout.dequantize(&[0u8; 7]).is_err());
    assert!(GemvLayout::new(DataType::F32, 3, 40).is_err());
    assert!(GemvLayout::new(DataType::Q4K, 3, 256).is_err());
    assert!(GemvLayout::new(DataType::I8, usize::MAX / 2, 1 << 20).is_err());
}
