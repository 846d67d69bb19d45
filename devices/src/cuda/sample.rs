//! Argmax, top-k and sampling over logits on [`super::CudaDevice`] (`kernels/sample.cu`):
//! only ids (and the top values) come back to the host.

use cudarc::driver::PushKernelArg;
use flm_core::{Data, Error, Result, SampleState, SamplerConfig};

use super::device::CudaDevice;
use super::kernels::{Kernel, SAMPLE_THREADS};
use super::launch::{dev_err, grid, int};
use super::ROW_THREADS;

/// [`flm_core::Op::Sample`]: `sample_row`, one block over the row of logits, with a
/// scratch of the next power of two of the vocabulary's length for its sort. Every tensor
/// is read and written where it lives (the dispatch gives this device only tensors in its
/// memory; host ones would be staged), and the parameters are the generation's, so a
/// captured step replays it as is.
///
/// Errors: [`Error::Placement`] for a tensor of another device; [`Error::Device`] when an
/// allocation, a copy or the launch fails.
pub(super) fn sample(
    dev: &CudaDevice,
    config: &SamplerConfig,
    logits: &Data,
    state: &mut SampleState,
    output: &mut Data,
) -> Result<()> {
    let vocab = logits.cols();
    let n_pad = vocab.next_power_of_two();
    let x = dev.input(logits)?;
    let mut seen = dev.in_out(&mut state.seen)?;
    let mut counts = dev.in_out(&mut state.counts)?;
    let mut stream = dev.in_out(&mut state.stream)?;
    let mut out = dev.output(output)?;
    let mut keys = dev.zeros::<f32>(n_pad)?;
    let mut ids = dev.zeros::<u32>(n_pad)?;
    let (vocab_i, n_pad_i) = (int(vocab)?, int(n_pad)?);
    let inv_t = 1.0 / config.temperature;
    let greedy = i32::from(config.is_greedy());
    let top_k = int(config.top_k.min(vocab))?;
    let f = dev.function(Kernel::SampleRow)?;
    let mut b = dev.stream.launch_builder(f);
    b.arg(x.slice())
        .arg(&vocab_i)
        .arg(seen.slice())
        .arg(counts.slice())
        .arg(stream.slice())
        .arg(out.slice())
        .arg(&mut keys)
        .arg(&mut ids)
        .arg(&n_pad_i)
        .arg(&config.repeat_penalty)
        .arg(&config.presence_penalty)
        .arg(&config.frequency_penalty)
        .arg(&inv_t)
        .arg(&greedy)
        .arg(&top_k)
        .arg(&config.top_p);
    // SAFETY: the arguments match `sample_row(const float*, int, unsigned*, unsigned*,
    // unsigned*, unsigned*, float*, unsigned*, int, float, float, float, float, int, int,
    // float)`: logits, seen and counts hold vocab values (checked by the op contract),
    // stream SAMPLER_STATE_WORDS, out one, keys and ids n_pad >= vocab each.
    unsafe { b.launch(grid((1, 1, 1), SAMPLE_THREADS, 0)?) }.map_err(dev_err)?;
    for o in [seen, counts, stream, out] {
        o.finish(dev)?;
    }
    Ok(())
}

/// [`flm_core::Op::Argmax`]: only the ids come back to the host (the sampled id out).
pub(super) fn argmax(dev: &CudaDevice, input: &Data, output: &mut [u32]) -> Result<()> {
    if output.is_empty() {
        return Ok(());
    }
    let x = dev.input(input)?;
    let mut ids = dev.zeros::<u32>(output.len())?;
    let cols = int(input.cols())?;
    let f = dev.function(Kernel::ArgmaxRows)?;
    let mut b = dev.stream.launch_builder(f);
    b.arg(x.slice()).arg(&cols).arg(&mut ids);
    // SAFETY: x holds rows × cols floats and ids one value per row, as
    // `argmax_rows(const float*, int, unsigned*)` uses them.
    unsafe { b.launch(grid((output.len(), 1, 1), ROW_THREADS, 0)?) }.map_err(dev_err)?;
    dev.download(&ids, output)
}

impl CudaDevice {
    /// The `k` largest values of each row of `logits` f32 `[n, cols]` and their indices,
    /// largest first, the smaller index first on ties, computed on the GPU so that only
    /// `n · k` ids and values cross to the host (for top-k sampling). Past a row's non-NaN
    /// values the ids are `u32::MAX` and the values −∞.
    ///
    /// Errors: [`Error::InvalidArgument`] unless `0 < k <= cols`; [`Error::DType`] for
    /// non-f32 logits; [`Error::Device`] when the launch fails.
    pub fn top_k(&self, logits: &Data, k: usize) -> Result<(Vec<u32>, Vec<f32>)> {
        let (n, cols) = (logits.rows(), logits.cols());
        if k == 0 || k > cols {
            return Err(Error::InvalidArgument(format!(
                "top-k of {k} from {cols} values"
            )));
        }
        let mut ids = vec![0u32; n * k];
        let mut values = vec![0f32; n * k];
        if n == 0 {
            return Ok((ids, values));
        }
        if logits.dtype() != flm_core::DataType::F32 {
            return Err(Error::DType {
                op: "top_k",
                msg: format!("{} logits", logits.dtype()),
            });
        }
        let x = self.input(logits)?;
        let (mut ids_d, mut values_d) = (self.zeros::<u32>(n * k)?, self.zeros::<f32>(n * k)?);
        let (cols_i, k_i) = (int(cols)?, int(k)?);
        let f = self.function(Kernel::TopKRows)?;
        let mut b = self.stream.launch_builder(f);
        b.arg(x.slice())
            .arg(&cols_i)
            .arg(&k_i)
            .arg(&mut ids_d)
            .arg(&mut values_d);
        // SAFETY: x holds n × cols floats, ids and values n × k entries each, as
        // `top_k_rows(const float*, int, int, unsigned*, float*)` uses them.
        unsafe { b.launch(grid((n, 1, 1), ROW_THREADS, 0)?) }.map_err(dev_err)?;
        self.download(&ids_d, &mut ids)?;
        self.download(&values_d, &mut values)?;
        Ok((ids, values))
    }
}
