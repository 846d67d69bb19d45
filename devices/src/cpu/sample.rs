//! [`flm_core::Op::Sample`] on the CPU: [`flm_core::sample_tensors`] over the tensors'
//! host bytes (host memory, or a [`crate::SimDevice`]'s).

use flm_core::{Data, Result, SampleState, SamplerConfig};

/// `tensor`'s i32 elements as `u32` words (ids, flags, counts, stream words).
fn words(tensor: &mut Data) -> Result<&mut [u32]> {
    Ok(bytemuck::cast_slice_mut(tensor.bytes_mut()?))
}

/// Samples from `logits` into `output`, updating `state` (see [`flm_core::Op::Sample`]).
///
/// Errors: those of [`flm_core::sample_tensors`]; [`flm_core::Error::ReadOnly`] for a
/// mapped tensor.
pub(super) fn sample(
    config: &SamplerConfig,
    logits: &Data,
    state: &mut SampleState,
    output: &mut Data,
) -> Result<()> {
    let id = flm_core::sample_tensors(
        config,
        logits.as_f32()?,
        words(&mut state.seen)?,
        words(&mut state.counts)?,
        words(&mut state.stream)?,
    )?;
    words(output)?[0] = id;
    Ok(())
}
