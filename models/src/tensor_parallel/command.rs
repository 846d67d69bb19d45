//! The calls rank 0 broadcasts to the other ranks of a tensor-parallel model, and their
//! bytes.

use flm_core::comm::Communicator;

use crate::graph::{BatchSeq, Head, Logits};
use crate::{Error, Result};

/// One sequence of a batched step, owned (a [`BatchSeq`] sent to the other ranks).
#[derive(Debug, Clone, PartialEq)]
pub struct Seq {
    /// Its tokens of this step.
    pub tokens: Vec<u32>,
    /// Position of its first token.
    pub start_pos: usize,
    /// Its block table.
    pub blocks: Vec<u32>,
}

impl Seq {
    /// The borrowed form the batched forward pass takes.
    pub fn as_batch(&self) -> BatchSeq<'_> {
        BatchSeq {
            tokens: &self.tokens,
            start_pos: self.start_pos,
            blocks: &self.blocks,
        }
    }
}

/// What rank 0 asks every other rank to do; `id` names an instance or a batched forward
/// pass of the model on every rank.
#[derive(Debug, Clone, PartialEq)]
pub enum Command {
    /// Make instance `id` of the model (its own KV cache).
    Instance(u64),
    /// Run instance `id` over `tokens` from `start_pos` ([`crate::Graph::run`]).
    Run {
        id: u64,
        start_pos: usize,
        head: Head,
        tokens: Vec<u32>,
    },
    /// Make batched forward pass `id` for up to `rows` rows a step
    /// ([`crate::SharedGraph::batch`]).
    Batch { id: u64, rows: usize },
    /// Allocate batch `id`'s KV pool ([`crate::BatchedForward::kv_pool`]).
    Pool {
        id: u64,
        n_blocks: usize,
        block_size: usize,
    },
    /// Write the p-tuning prefix into the block table `blocks` of batch `id`'s pool.
    Prefix { id: u64, blocks: Vec<u32> },
    /// Run one step of batch `id` over `seqs` ([`crate::BatchedForward::forward`]).
    Step { id: u64, seqs: Vec<Seq> },
    /// Free instance or batch `id`.
    Drop(u64),
    /// Leave the loop of [`super::serve_rank`].
    Stop,
}

/// Little-endian words and arrays of words, in order.
#[derive(Default)]
struct Writer(Vec<u8>);

impl Writer {
    fn word(mut self, w: u64) -> Writer {
        self.0.extend(w.to_le_bytes());
        self
    }
    fn ids(mut self, ids: &[u32]) -> Writer {
        self = self.word(ids.len() as u64);
        self.0.extend(ids.iter().flat_map(|t| t.to_le_bytes()));
        self
    }
}

/// Reads what a [`Writer`] wrote; every read past the end is an error.
struct Reader<'a>(&'a [u8]);

impl Reader<'_> {
    fn bad(&self) -> Error {
        Error::InvalidInput("a tensor-parallel command is malformed".into())
    }
    fn word(&mut self) -> Result<u64> {
        let (head, rest) = self.0.split_first_chunk::<8>().ok_or_else(|| self.bad())?;
        self.0 = rest;
        Ok(u64::from_le_bytes(*head))
    }
    fn size(&mut self) -> Result<usize> {
        let w = self.word()?;
        usize::try_from(w).map_err(|_| self.bad())
    }
    fn ids(&mut self) -> Result<Vec<u32>> {
        let n = self.size()?;
        let bytes = n
            .checked_mul(4)
            .filter(|&b| b <= self.0.len())
            .ok_or_else(|| self.bad())?;
        let (ids, rest) = self.0.split_at(bytes);
        self.0 = rest;
        Ok(ids
            .chunks_exact(4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect())
    }
}

const HEADS: [Head; 3] = [
    Head::Logits(Logits::Last),
    Head::Logits(Logits::All),
    Head::Hidden,
];

impl Command {
    /// Its kind, then its fields in declaration order.
    pub(crate) fn encode(&self) -> Vec<u8> {
        let w = Writer::default();
        match self {
            Command::Instance(id) => w.word(0).word(*id),
            Command::Run {
                id,
                start_pos,
                head,
                tokens,
            } => {
                let head = HEADS.iter().position(|h| h == head).unwrap_or(0);
                w.word(1)
                    .word(*id)
                    .word(*start_pos as u64)
                    .word(head as u64)
                    .ids(tokens)
            }
            Command::Batch { id, rows } => w.word(2).word(*id).word(*rows as u64),
            Command::Pool {
                id,
                n_blocks,
                block_size,
            } => w
                .word(3)
                .word(*id)
                .word(*n_blocks as u64)
                .word(*block_size as u64),
            Command::Prefix { id, blocks } => w.word(4).word(*id).ids(blocks),
            Command::Step { id, seqs } => seqs
                .iter()
                .fold(w.word(5).word(*id).word(seqs.len() as u64), |w, s| {
                    w.ids(&s.tokens).word(s.start_pos as u64).ids(&s.blocks)
                }),
            Command::Drop(id) => w.word(6).word(*id),
            Command::Stop => w.word(7),
        }
        .0
    }

    /// The command of [`Command::encode`]'s bytes.
    ///
    /// Errors: [`Error::InvalidInput`] for bytes that are not one.
    pub(crate) fn decode(bytes: &[u8]) -> Result<Command> {
        let mut r = Reader(bytes);
        let cmd = match r.word()? {
            0 => Command::Instance(r.word()?),
            1 => Command::Run {
                id: r.word()?,
                start_pos: r.size()?,
                head: *HEADS.get(r.size()?).ok_or_else(|| r.bad())?,
                tokens: r.ids()?,
            },
            2 => Command::Batch {
                id: r.word()?,
                rows: r.size()?,
            },
            3 => Command::Pool {
                id: r.word()?,
                n_blocks: r.size()?,
                block_size: r.size()?,
            },
            4 => Command::Prefix {
                id: r.word()?,
                blocks: r.ids()?,
            },
            5 => {
                let (id, n) = (r.word()?, r.size()?);
                // Each sequence takes at least 24 bytes, which bounds `n` by the bytes.
                if n > bytes.len() / 24 {
                    return Err(r.bad());
                }
                let seqs = (0..n)
                    .map(|_| {
                        Ok(Seq {
                            tokens: r.ids()?,
                            start_pos: r.size()?,
                            blocks: r.ids()?,
                        })
                    })
                    .collect::<Result<_>>()?;
                Command::Step { id, seqs }
            }
            6 => Command::Drop(r.word()?),
            7 => Command::Stop,
            _ => return Err(r.bad()),
        };
        if !r.0.is_empty() {
            return Err(r.bad());
        }
        Ok(cmd)
    }
}

/// Broadcasts `cmd` from rank 0: its length, then its bytes.
pub(crate) fn send(comm: &dyn Communicator, cmd: &Command) -> Result<()> {
    let mut bytes = cmd.encode();
    let mut len = (bytes.len() as u64).to_le_bytes();
    comm.broadcast(&mut len, 0)?;
    comm.broadcast(&mut bytes, 0)?;
    Ok(())
}

/// Receives the next command of rank 0 ([`send`]).
pub(crate) fn receive(comm: &dyn Communicator) -> Result<Command> {
    let mut len = [0u8; 8];
    comm.broadcast(&mut len, 0)?;
    let len = usize::try_from(u64::from_le_bytes(len))
        .map_err(|_| Error::InvalidInput("a command longer than memory".into()))?;
    let mut bytes = vec![0u8; len];
    comm.broadcast(&mut bytes, 0)?;
    Command::decode(&bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_survive_their_bytes() {
        let cmds = [
            Command::Instance(7),
            Command::Run {
                id: 3,
                start_pos: 12,
                head: Head::Logits(Logits::All),
                tokens: vec![1, 2, 99_999],
            },
            Command::Run {
                id: 0,
                start_pos: 0,
                head: Head::Hidden,
                tokens: vec![],
            },
            Command::Batch { id: 1, rows: 256 },
            Command::Pool {
                id: 1,
                n_blocks: 64,
                block_size: 16,
            },
            Command::Prefix {
                id: 1,
                blocks: vec![0, 5],
            },
            Command::Step {
                id: 1,
                seqs: vec![
                    Seq {
                        tokens: vec![4, 5, 6],
                        start_pos: 0,
                        blocks: vec![2],
                    },
                    Seq {
                        tokens: vec![9],
                        start_pos: 40,
                        blocks: vec![0, 1, 3],
                    },
                ],
            },
            Command::Drop(u64::MAX),
            Command::Stop,
        ];
        for cmd in cmds {
            let bytes = cmd.encode();
            assert_eq!(Command::decode(&bytes).unwrap(), cmd);
            // Every cut of the bytes is refused, never read past.
            for cut in 0..bytes.len() {
                assert!(
                    Command::decode(&bytes[..cut]).is_err(),
                    "{cmd:?} cut at {cut}"
                );
            }
        }
        assert!(Command::decode(&[9; 8]).is_err());
        let huge = Writer::default().word(5).word(1).word(u64::MAX).0;
        assert!(Command::decode(&huge).is_err());
    }
}
