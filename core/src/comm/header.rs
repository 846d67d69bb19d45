//! The header exchange that opens every collective of a backend whose ranks do not share
//! memory (MPI, NCCL): each rank all-gathers a [`Header`] (which collective, its length,
//! its root, whether its own arguments are valid), and every rank checks the same headers
//! with [`agree`], so every rank takes the same decision: all go on to move the data, or
//! all return the same [`Error::Collective`](crate::Error::Collective). A mismatch thus
//! never reaches the transport, which would truncate, read past a buffer or wait forever.

use super::failed;
use crate::Result;

/// [`Communicator::all_reduce_sum`](super::Communicator::all_reduce_sum).
pub const ALL_REDUCE: u64 = 1;
/// [`Communicator::all_gather`](super::Communicator::all_gather).
pub const ALL_GATHER: u64 = 2;
/// [`Communicator::broadcast`](super::Communicator::broadcast).
pub const BROADCAST: u64 = 3;
/// [`Communicator::barrier`](super::Communicator::barrier).
pub const BARRIER: u64 = 4;
/// A GPU backend's all-reduce of device memory, which moves its data by another path than
/// [`ALL_REDUCE`], so that the two must not pair up.
pub const DEVICE_ALL_REDUCE: u64 = 5;

/// A header: the collective (one of the constants above), the length of the operand
/// (elements), the root (0 where the collective has none), and 1 when this rank's own
/// arguments are invalid (0 otherwise).
pub type Header = [u64; 4];

/// The name of collective `kind` in an error.
pub fn name(kind: u64) -> &'static str {
    match kind {
        ALL_REDUCE => "all-reduce",
        ALL_GATHER => "all-gather",
        BROADCAST => "broadcast",
        BARRIER => "barrier",
        DEVICE_ALL_REDUCE => "device all-reduce",
        _ => "an unknown collective",
    }
}

/// What every rank decides from the headers of all ranks (`headers[r]` is rank `r`'s),
/// found at rank `me`: the common length, or the error every rank returns.
///
/// Errors: [`crate::Error::Collective`] naming `me` when the ranks called different
/// collectives, named different roots or passed different lengths, or when the length
/// does not fit a `usize`; naming the rank whose arguments are invalid, when one is.
pub fn agree(headers: &[Header], me: usize) -> Result<usize> {
    let Some(&[kind, len, root, _]) = headers.get(me) else {
        return Err(failed(me, "no header of this rank"));
    };
    let what = name(kind);
    if let Some(other) = headers.iter().position(|h| h[0] != kind) {
        return Err(failed(
            me,
            format!(
                "the ranks called different collectives: rank {me} {what}, rank {other} {}",
                name(headers[other][0])
            ),
        ));
    }
    if let Some(bad) = headers.iter().position(|h| h[3] != 0) {
        let why = match kind {
            ALL_GATHER => "its output is not world_size times its input",
            DEVICE_ALL_REDUCE => "its operand is not on the group's GPU",
            _ => "its root is not a rank",
        };
        return Err(failed(bad, format!("{what}: {why}")));
    }
    if headers.iter().any(|h| h[2] != root) {
        let roots: Vec<u64> = headers.iter().map(|h| h[2]).collect();
        return Err(failed(
            me,
            format!("{what}: the ranks named roots {roots:?}, not one"),
        ));
    }
    if headers.iter().any(|h| h[1] != len) {
        let lens: Vec<u64> = headers.iter().map(|h| h[1]).collect();
        return Err(failed(
            me,
            format!("{what}: the ranks passed {lens:?} elements, not one length"),
        ));
    }
    usize::try_from(len).map_err(|_| failed(me, format!("{what}: {len} elements")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn agreeing_headers_give_the_length() {
        let h = [[ALL_REDUCE, 7, 0, 0]; 3];
        assert_eq!(agree(&h, 1).unwrap(), 7);
    }

    #[test]
    fn every_disagreement_is_an_error() {
        let err = |h: &[Header], me| agree(h, me).unwrap_err().to_string();
        let kinds = [[ALL_REDUCE, 4, 0, 0], [BARRIER, 0, 0, 0]];
        assert_eq!(
            err(&kinds, 0),
            "rank 0: the ranks called different collectives: rank 0 all-reduce, rank 1 barrier"
        );
        let lens = [[ALL_REDUCE, 3, 0, 0], [ALL_REDUCE, 4, 0, 0]];
        assert_eq!(
            err(&lens, 1),
            "rank 1: all-reduce: the ranks passed [3, 4] elements, not one length"
        );
        let gather = [[ALL_GATHER, 2, 0, 0], [ALL_GATHER, 2, 0, 1]];
        assert_eq!(
            err(&gather, 0),
            "rank 1: all-gather: its output is not world_size times its input"
        );
        let roots = [[BROADCAST, 2, 0, 0], [BROADCAST, 2, 1, 0]];
        assert_eq!(
            err(&roots, 0),
            "rank 0: broadcast: the ranks named roots [0, 1], not one"
        );
        let device = [[DEVICE_ALL_REDUCE, 2, 0, 1], [DEVICE_ALL_REDUCE, 2, 0, 0]];
        assert_eq!(
            err(&device, 1),
            "rank 0: device all-reduce: its operand is not on the group's GPU"
        );
        assert_eq!(err(&[], 0), "rank 0: no header of this rank");
    }
}
