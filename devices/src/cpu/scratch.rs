//! Per-thread scratch buffers of the CPU kernels, re-entrant by construction.
//!
//! A kernel that reuses a buffer across calls (so that decode allocates nothing once warm)
//! keeps it in a thread-local [`Slot`] and runs with [`with`], which *moves* the buffer out
//! of the slot for the duration of the call and puts it back afterwards. Nothing stays
//! borrowed while the call runs, so the call may enter a rayon parallel region: a worker
//! that waits there for its tasks steals other jobs of the pool, and one of them may be
//! another session's op that needs the same slot on the same thread. That op finds the slot
//! empty, works in a fresh buffer of its own, and puts it back; the outer call then puts
//! its own back over it. (A `RefCell` borrowed across the parallel region would fail there
//! with "already borrowed" when several sessions share one pool.)

use std::cell::Cell;
use std::thread::LocalKey;

use flm_core::{Data, DataType, Result};

/// A thread-local slot holding one reusable scratch value.
pub(crate) type Slot<T> = LocalKey<Cell<T>>;

/// Runs `f` on the scratch value of `slot`, taken out of it for the call (a default value
/// if a call further up this thread's stack holds it) and put back afterwards.
pub(crate) fn with<T: Default, R>(slot: &'static Slot<T>, f: impl FnOnce(&mut T) -> R) -> R {
    let mut scratch = slot.take();
    let result = f(&mut scratch);
    slot.set(scratch);
    result
}

/// The f32 tensor of `slot` reshaped to `shape`, allocated only when its storage is too
/// small (its contents are left as they were).
pub(crate) fn tensor<'a>(slot: &'a mut Option<Data>, shape: &[usize]) -> Result<&'a mut Data> {
    let mut kept = slot.take();
    let fits = kept.as_mut().is_some_and(|d| d.set_shape(shape).is_ok());
    let data = match kept {
        Some(data) if fits => data,
        _ => Data::zeros(DataType::F32, shape)?,
    };
    Ok(slot.insert(data))
}

/// The first `count` f32 tensors of `slots`, each reshaped to `shape` as [`tensor`] does;
/// the vector only grows.
pub(crate) fn tensors<'a>(
    slots: &'a mut Vec<Data>,
    count: usize,
    shape: &[usize],
) -> Result<&'a mut [Data]> {
    for slot in slots.iter_mut().take(count) {
        if slot.set_shape(shape).is_err() {
            *slot = Data::zeros(DataType::F32, shape)?;
        }
    }
    while slots.len() < count {
        slots.push(Data::zeros(DataType::F32, shape)?);
    }
    Ok(&mut slots[..count])
}

#[cfg(test)]
mod tests {
    use super::*;

    thread_local! {
        static SLOT: Cell<Vec<u32>> = const { Cell::new(Vec::new()) };
    }

    #[test]
    fn a_nested_call_gets_a_buffer_of_its_own_and_the_outer_one_is_kept() {
        with(&SLOT, |outer| {
            outer.extend([1, 2, 3]);
            with(&SLOT, |inner| {
                assert!(inner.is_empty(), "the nested call saw {inner:?}");
                inner.push(9);
            });
            assert_eq!(outer, &[1, 2, 3]);
        });
        with(&SLOT, |kept| assert_eq!(kept, &[1, 2, 3]));
    }
}
