//! Linears whose weight permutes its input channels (`Data::input_perm`, act-order GPTQ):
//! the device's gather against a scalar gather written here, `x'[r, j] = x[r, perm[j]]`,
//! fed to the same weight without a permutation; the outputs must be the same bits.

#[macro_use]
mod common;

use common::*;
use flm_core::{Data, DataType, Error, LinearPart, Op, TokenIds};
use flm_devices::cpu::PARALLEL_MIN_WORK;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;

fn random_perm(rng: &mut StdRng, k: usize) -> Data {
    let mut perm: Vec<i32> = (0..k as i32).collect();
    perm.shuffle(rng);
    let bytes: Vec<u8> = perm.iter().flat_map(|p| p.to_le_bytes()).collect();
    Data::from_bytes(DataType::I32, &[k], &bytes).unwrap()
}

/// The scalar gather: `x'[r, j] = x[r, perm[j]]`.
fn gathered(x: &[f32], perm: &Data) -> Vec<f32> {
    let perm = perm.as_i32().unwrap();
    x.chunks_exact(perm.len())
        .flat_map(|row| perm.iter().map(|&p| row[p as usize]))
        .collect()
}

fn linear(x: &Data, w: &Data, bias: Option<&Data>) -> Vec<f32> {
    let mut out = nan_output(&[x.rows(), w.rows()]);
    run(Op::Linear {
        input: x,
        weight: w,
        bias,
        output: &mut out,
    })
    .unwrap();
    out.as_f32().unwrap().to_vec()
}

fn linear_gathers_its_input(dtype: DataType) {
    let mut rng = rng(0x41);
    // Decode, a few rows, more rows than the decode kernels take (odd and padded widths),
    // and enough values for the gather to split its rows over the threads.
    const { assert!(520 * 256 >= PARALLEL_MIN_WORK) };
    for &(n, k, m) in &[(1, 256, 17), (3, 96, 8), (11, 320, 33), (520, 256, 5)] {
        let (x, xv) = random_f32(&mut rng, &[n, k], 1.0);
        let (w, _) = random_weight(&mut rng, &[m, k], dtype);
        let (b, _) = random_f32(&mut rng, &[m], 1.0);
        let perm = random_perm(&mut rng, k);
        let permuted = w.clone().with_input_perm(perm.clone()).unwrap();
        let got = linear(&x, &permuted, Some(&b));
        let x2 = f32_data(&[n, k], &gathered(&xv, &perm));
        let want = linear(&x2, &w, Some(&b));
        let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&got), bits(&want), "{dtype} n={n} k={k} m={m}");
    }
}

weight_dtype_tests!(linear_gathers_its_input);
dtype_tests!([i8: I8, i4g128: I4G128, i4sg32: I4SymG32, q4k: Q4K] linear_gathers_its_input_quantised);

fn linear_gathers_its_input_quantised(dtype: DataType) {
    linear_gathers_its_input(dtype)
}

#[test]
fn linears_with_shared_distinct_and_no_permutations() {
    let mut rng = rng(0x42);
    let (n, k) = (5, 128);
    let (x, xv) = random_f32(&mut rng, &[n, k], 1.0);
    let (p, q) = (random_perm(&mut rng, k), random_perm(&mut rng, k));
    // q and k share one permutation (equal values in two tensors, as two g_idx give it),
    // v has another, the last part none.
    let perms = [Some(&p), Some(&p.clone()), Some(&q), None];
    let weights: Vec<Data> = perms
        .iter()
        .enumerate()
        .map(|(i, perm)| {
            let (w, _) = random_weight(&mut rng, &[8 + i, k], DataType::I4SymG32);
            match perm {
                Some(perm) => w.with_input_perm((*perm).clone()).unwrap(),
                None => w,
            }
        })
        .collect();
    let mut outs: Vec<Data> = weights.iter().map(|w| nan_output(&[n, w.rows()])).collect();
    {
        let mut parts: Vec<LinearPart<'_>> = weights
            .iter()
            .zip(outs.iter_mut())
            .map(|(w, o)| LinearPart::new(w, None, o))
            .collect();
        let op = Op::Linears {
            input: &x,
            parts: &mut parts,
        };
        run(op).unwrap();
    }
    for ((w, out), perm) in weights.iter().zip(&outs).zip(perms) {
        let x2 = perm.map_or(xv.clone(), |p| gathered(&xv, p));
        let want = linear(&f32_data(&[n, k], &x2), &strip(w), None);
        assert_eq!(
            out.as_f32().unwrap(),
            &want[..],
            "part of {} rows",
            w.rows()
        );
    }
}

/// The same weight bytes without a permutation.
fn strip(w: &Data) -> Data {
    Data::from_bytes(w.dtype(), w.shape(), w.bytes().unwrap()).unwrap()
}

#[test]
fn a_permutation_must_be_one_of_the_columns() {
    let w = Data::zeros(DataType::F32, &[2, 4]).unwrap();
    let ints = |v: &[i32]| {
        let bytes: Vec<u8> = v.iter().flat_map(|p| p.to_le_bytes()).collect();
        Data::from_bytes(DataType::I32, &[v.len()], &bytes).unwrap()
    };
    let err = |perm: Data| w.clone().with_input_perm(perm).unwrap_err();
    assert!(matches!(err(ints(&[0, 1, 2])), Error::Shape { .. }));
    assert!(matches!(
        err(Data::zeros(DataType::F32, &[4]).unwrap()),
        Error::DType { .. }
    ));
    for bad in [[0, 1, 2, 4], [0, 1, 1, 3], [-1, 0, 1, 2]] {
        let msg = err(ints(&bad)).to_string();
        assert!(msg.contains("not a permutation"), "{bad:?}: {msg}");
    }
    assert!(w.clone().with_input_perm(ints(&[3, 1, 0, 2])).is_ok());
}

#[test]
fn an_embedding_table_with_permuted_columns_is_refused() {
    let mut rng = rng(0x43);
    let (table, _) = random_f32(&mut rng, &[4, 8], 1.0);
    let table = table.with_input_perm(random_perm(&mut rng, 8)).unwrap();
    let mut out = nan_output(&[1, 8]);
    let err = run(Op::Embedding {
        table: &table,
        tokens: TokenIds::Host(&[1]),
        output: &mut out,
    })
    .unwrap_err();
    assert!(
        matches!(
            err,
            Error::DType {
                op: "Embedding",
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn a_weight_moved_to_a_device_takes_its_permutation_along() {
    let sim = flm_core::Location::Device {
        name: "sim",
        ordinal: 0,
    };
    let exec = flm_core::Executor::with_profiling(
        vec![
            Box::new(flm_devices::SimDevice::new(0).unwrap()),
            Box::new(flm_devices::CpuDevice::new().unwrap()),
        ],
        false,
    );
    let mut rng = rng(0x44);
    let (n, k, m) = (2, 64, 9);
    let (x, _) = random_f32(&mut rng, &[n, k], 1.0);
    let (w, _) = random_weight(&mut rng, &[m, k], DataType::I4SymG32);
    let w = w.with_input_perm(random_perm(&mut rng, k)).unwrap();
    let on_sim = exec.to_device(&w, sim, "weights").unwrap();
    assert_eq!(on_sim.input_perm().unwrap().location(), sim);
    let x_sim = exec.to_device(&x, sim, "input").unwrap();
    let mut y_sim = exec.zeros(DataType::F32, &[n, m], sim).unwrap();
    exec.run(Op::Linear {
        input: &x_sim,
        weight: &on_sim,
        bias: None,
        output: &mut y_sim,
    })
    .unwrap();
    let y = exec.to_host(&y_sim, "output").unwrap();
    assert_eq!(y.as_f32().unwrap(), &linear(&x, &w, None)[..]);
}
