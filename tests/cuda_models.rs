//! stories260K on the CUDA device against the CPU device (issue 7's acceptance checks):
//! greedy decoding gives the same tokens with f32 and f16 weights, and with int8 and int4
//! weights the teacher-forced top-1 token agrees with the CPU's at >= 99% of positions.
//! Skipped with a message where no CUDA GPU is usable.
#![cfg(feature = "cuda")]

use flm_core::{DataType, Executor};
use flm_devices::cuda::CudaDevice;
use flm_devices::CpuDevice;
use flm_models::import;
use flm_models::llama::{Llama, Logits};
use flm_tests::{cpu_executor, data, greedy_on, ids, stories_reference, weights_in};

/// The CUDA device first, the CPU for the ops it leaves (as `--device cuda` runs).
fn gpu_executor() -> Option<Executor> {
    match CudaDevice::new(0) {
        Ok(gpu) => Some(Executor::with_profiling(
            vec![Box::new(gpu), Box::new(CpuDevice::new().unwrap())],
            false,
        )),
        Err(why) => {
            eprintln!("skipped: no CUDA GPU ({why})");
            None
        }
    }
}

/// stories260K with its matrices in `dtype` (norm gains stay f32, as `flm convert` keeps
/// them).
fn model(dtype: DataType) -> Llama {
    let ckpt = import::load(&data("hf-stories260K")).unwrap();
    let weights = weights_in(&ckpt.weights().unwrap(), |_, shape| {
        if shape.len() == 2 {
            dtype
        } else {
            DataType::F32
        }
    });
    Llama::new(ckpt.config.clone(), weights).unwrap()
}

fn prompt() -> Vec<u32> {
    ids(&stories_reference()["logits_file"]["input_ids"])
}

#[test]
fn greedy_tokens_equal_the_cpu_in_f32_and_f16() {
    let Some(gpu) = gpu_executor() else { return };
    let cpu = cpu_executor();
    for dtype in [DataType::F32, DataType::F16] {
        let want = greedy_on(&cpu, &mut model(dtype), &prompt(), 200);
        let got = greedy_on(&gpu, &mut model(dtype), &prompt(), 200);
        assert_eq!(got, want, "{dtype}");
    }
}

#[test]
fn int8_and_int4_top1_agree_with_the_cpu_on_99_percent_of_positions() {
    let Some(gpu) = gpu_executor() else { return };
    let cpu = cpu_executor();
    // A text the model writes itself (greedy, f32 on the CPU), then teacher-forced.
    let mut text = prompt();
    text.extend(greedy_on(&cpu, &mut model(DataType::F32), &prompt(), 300));
    for dtype in [DataType::I8, DataType::I4G32, DataType::I4SymG32] {
        let mut cpu_model = model(dtype);
        let vocab = cpu_model.config().vocab_size;
        let want = cpu_model.forward(&cpu, &text, 0, Logits::All).unwrap();
        let mut gpu_model = model(dtype);
        let got = gpu_model.forward(&gpu, &text, 0, Logits::All).unwrap();
        let same = want
            .chunks(vocab)
            .zip(got.chunks(vocab))
            .filter(|(a, b)| flm_core::argmax(a) == flm_core::argmax(b))
            .count();
        let positions = text.len();
        assert!(
            same * 100 >= positions * 99,
            "{dtype}: top-1 agrees on {same} of {positions} positions"
        );
    }
}
