//! A model split among the ranks of a tensor-parallel group ([`flm_core::comm`]), run as
//! one: [`TensorParallel`] is rank 0's model, which every tool loads and runs as any other
//! ([`SharedModel`]), and [`serve_rank`] is what every other rank runs.
//!
//! Rank 0 does the I/O and the sampling. Before each call of its own part it broadcasts the
//! call (a [`Command`]: the instance, the token ids, the position, the head) to the other
//! ranks, which run their parts of the same call; the layers' all-reduces and the logits'
//! gather join them (see `llama/shard.rs`). Commands and collectives are issued in one
//! order on every rank: rank 0 holds one lock from a command's broadcast to the end of its
//! part, so instances on several threads take turns.
//!
//! The ranks are threads of this process ([`TensorParallel::local`], `--tp N`) or the
//! processes of an MPI job, whose ranks other than 0 call [`serve_rank`].

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;

use flm_core::comm::{Communicator, LocalGroup};
use flm_core::{Executor, KvDtype};

use crate::graph::{BatchedForward, Graph, Head, Logits, MemoryNeeds, SharedGraph};
use crate::llama::{check_forward, Llama, LlamaWeights, SharedLlama};
use crate::{Error, Model, ModelConfig, Placement, Result, SharedModel};

/// Makes a rank's executor (each rank of [`TensorParallel::local`] runs its ops on its own
/// thread pool, through its own executor).
pub type ExecutorFactory = Arc<dyn Fn() -> Result<Executor> + Send + Sync>;

/// What rank 0 asks every other rank to do.
#[derive(Debug, Clone, PartialEq)]
pub enum Command {
    /// Make instance `id` of the model (its own KV cache).
    Instance(u64),
    /// Free instance `id`.
    Drop(u64),
    /// Run instance `id` over `tokens` from `start_pos` ([`Graph::run`]).
    Run {
        /// The instance.
        id: u64,
        /// Position of the first token.
        start_pos: usize,
        /// What the pass returns.
        head: Head,
        /// The token ids.
        tokens: Vec<u32>,
    },
    /// Leave the loop of [`serve_rank`].
    Stop,
}

impl Command {
    /// Little-endian words: the kind, the instance, the position, the head, the tokens.
    fn encode(&self) -> Vec<u8> {
        let (kind, id, pos, head, tokens): (u64, u64, u64, u64, &[u32]) = match self {
            Command::Instance(id) => (0, *id, 0, 0, &[]),
            Command::Drop(id) => (1, *id, 0, 0, &[]),
            Command::Run {
                id,
                start_pos,
                head,
                tokens,
            } => {
                let head = match head {
                    Head::Logits(Logits::Last) => 0,
                    Head::Logits(Logits::All) => 1,
                    Head::Hidden => 2,
                };
                (2, *id, *start_pos as u64, head, tokens)
            }
            Command::Stop => (3, 0, 0, 0, &[]),
        };
        let mut out: Vec<u8> = [kind, id, pos, head]
            .iter()
            .flat_map(|w| w.to_le_bytes())
            .collect();
        out.extend(tokens.iter().flat_map(|t| t.to_le_bytes()));
        out
    }

    /// The command of [`Command::encode`]'s bytes.
    ///
    /// Errors: [`Error::InvalidInput`] for bytes that are not one.
    fn decode(bytes: &[u8]) -> Result<Command> {
        let bad =
            || Error::InvalidInput(format!("a command of {} bytes is malformed", bytes.len()));
        if bytes.len() < 32 || !(bytes.len() - 32).is_multiple_of(4) {
            return Err(bad());
        }
        let word = |i: usize| {
            let b: [u8; 8] = bytes[8 * i..8 * i + 8].try_into().unwrap_or_default();
            u64::from_le_bytes(b)
        };
        let (id, pos) = (word(1), usize::try_from(word(2)).map_err(|_| bad())?);
        Ok(match word(0) {
            0 => Command::Instance(id),
            1 => Command::Drop(id),
            2 => Command::Run {
                id,
                start_pos: pos,
                head: match word(3) {
                    0 => Head::Logits(Logits::Last),
                    1 => Head::Logits(Logits::All),
                    2 => Head::Hidden,
                    _ => return Err(bad()),
                },
                tokens: bytes[32..]
                    .chunks_exact(4)
                    .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                    .collect(),
            },
            3 => Command::Stop,
            _ => return Err(bad()),
        })
    }
}

/// Broadcasts `cmd` from rank 0: its length, then its bytes.
fn send(comm: &dyn Communicator, cmd: &Command) -> Result<()> {
    let mut bytes = cmd.encode();
    let mut len = (bytes.len() as u64).to_le_bytes();
    comm.broadcast(&mut len, 0)?;
    comm.broadcast(&mut bytes, 0)?;
    Ok(())
}

/// Receives the next command of rank 0 ([`send`]).
fn receive(comm: &dyn Communicator) -> Result<Command> {
    let mut len = [0u8; 8];
    comm.broadcast(&mut len, 0)?;
    let len = usize::try_from(u64::from_le_bytes(len))
        .map_err(|_| Error::InvalidInput("a command longer than memory".into()))?;
    let mut bytes = vec![0u8; len];
    comm.broadcast(&mut bytes, 0)?;
    Command::decode(&bytes)
}

/// The loop of a rank other than 0: runs its part (`model`, built by
/// [`SharedLlama::shard`]) of each command rank 0 sends, with `exec`, until
/// [`Command::Stop`]. A failure ends the group ([`Communicator::abort`]) so that no rank
/// waits for this one.
///
/// Errors: the first failure, after ending the group.
pub fn serve_rank(model: Arc<SharedLlama>, comm: &dyn Communicator, exec: &Executor) -> Result<()> {
    let mut instances: Vec<(u64, Llama)> = Vec::new();
    let mut step = || -> Result<bool> {
        match receive(comm)? {
            Command::Instance(id) => instances.push((id, Llama::with_model(Arc::clone(&model))?)),
            Command::Drop(id) => instances.retain(|(i, _)| *i != id),
            Command::Run {
                id,
                start_pos,
                head,
                tokens,
            } => {
                let (_, llama) = instances
                    .iter_mut()
                    .find(|(i, _)| *i == id)
                    .ok_or_else(|| Error::State(format!("no instance {id} on this rank")))?;
                llama.run(exec, &tokens, start_pos, head)?;
            }
            Command::Stop => return Ok(false),
        }
        Ok(true)
    };
    loop {
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(&mut step)) {
            Ok(Ok(true)) => {}
            Ok(Ok(false)) => return Ok(()),
            Ok(Err(e)) => {
                comm.abort(&e.to_string());
                return Err(e);
            }
            Err(_) => {
                comm.abort("panicked");
                return Err(Error::State(format!("rank {} panicked", comm.rank())));
            }
        }
    }
}

/// Rank 0's end of a tensor-parallel model (see the module docs): the configuration of
/// the whole model, rank 0's part, and the other ranks' threads when they are in this
/// process.
pub struct TensorParallel {
    config: ModelConfig,
    rank0: Arc<SharedLlama>,
    comm: Arc<dyn Communicator>,
    /// The next instance's id; held from a command's broadcast to the end of rank 0's part.
    turn: Mutex<u64>,
    /// Rank 0's thread pool, as large as every other rank's.
    pool: rayon::ThreadPool,
    /// The other ranks' threads ([`TensorParallel::local`]).
    workers: Vec<JoinHandle<Result<()>>>,
}

/// A thread pool of `threads` threads for a rank.
fn pool(threads: usize) -> Result<rayon::ThreadPool> {
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads.max(1))
        .build()
        .map_err(|e| Error::Config(format!("cannot start a rank's threads: {e}")))
}

impl TensorParallel {
    /// The model `config` with `weights` split among `ranks` threads of this process (an
    /// in-process [`LocalGroup`]), each running its part on its own pool of
    /// `threads_per_rank` threads through an executor of `executor`, with KV caches of
    /// `kv_dtype`.
    ///
    /// Errors: those of [`SharedLlama::shard`] (a model that does not split among `ranks`),
    /// [`Error::InvalidInput`] for no ranks, the executor's errors.
    pub fn local(
        config: &ModelConfig,
        weights: &LlamaWeights,
        ranks: usize,
        threads_per_rank: usize,
        kv_dtype: KvDtype,
        executor: ExecutorFactory,
    ) -> Result<SharedModel> {
        if ranks == 0 {
            return Err(Error::InvalidInput("--tp needs at least one rank".into()));
        }
        let mut parts = Vec::new();
        for comm in LocalGroup::new(ranks)? {
            let comm: Arc<dyn Communicator> = Arc::new(comm);
            let part = SharedLlama::shard(config, weights, Arc::clone(&comm))?;
            parts.push((Arc::new(part.with_kv_dtype(kv_dtype)), comm));
        }
        let mut parts = parts.into_iter();
        let (rank0, comm) = parts
            .next()
            .ok_or_else(|| Error::State("no rank 0".into()))?;
        let mut workers = Vec::new();
        for (part, comm) in parts {
            let executor = Arc::clone(&executor);
            let pool = pool(threads_per_rank)?;
            workers.push(std::thread::spawn(move || {
                pool.install(|| {
                    let exec = executor().inspect_err(|e| comm.abort(&e.to_string()))?;
                    serve_rank(part, &*comm, &exec)
                })
            }));
        }
        Ok(SharedModel::from_graph(Arc::new(TensorParallel {
            config: config.clone(),
            rank0,
            comm,
            turn: Mutex::new(0),
            pool: pool(threads_per_rank)?,
            workers,
        })))
    }

    /// Rank 0's end of a group whose other ranks run [`serve_rank`] elsewhere (an MPI job):
    /// `rank0` is its part, built by [`SharedLlama::shard`] over `comm`, of the model
    /// `config`, run on a pool of `threads` threads.
    ///
    /// Errors: a pool that cannot start.
    pub fn over(
        config: &ModelConfig,
        rank0: SharedLlama,
        comm: Arc<dyn Communicator>,
        threads: usize,
    ) -> Result<SharedModel> {
        Ok(SharedModel::from_graph(Arc::new(TensorParallel {
            config: config.clone(),
            rank0: Arc::new(rank0),
            comm,
            turn: Mutex::new(0),
            pool: pool(threads)?,
            workers: Vec::new(),
        })))
    }

    /// The time rank 0 has spent in collectives (waiting for the other ranks included).
    pub fn time_in_collectives(&self) -> std::time::Duration {
        self.comm.time_in_collectives()
    }

    /// The number of ranks.
    pub fn ranks(&self) -> usize {
        self.comm.world_size()
    }

    /// Rank 0's turn: the lock every command and rank 0's part of it run under.
    fn turn(&self) -> MutexGuard<'_, u64> {
        self.turn.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Drop for TensorParallel {
    /// Stops the other ranks and waits for this process's.
    fn drop(&mut self) {
        {
            let _turn = self.turn();
            // A group that already failed has nobody to stop.
            let _ = send(&*self.comm, &Command::Stop);
        }
        for worker in self.workers.drain(..) {
            let _ = worker.join();
        }
    }
}

/// The error of what a tensor-parallel model does not do.
fn unsupported(what: &str) -> Error {
    Error::Config(format!("a tensor-parallel model does not {what} yet"))
}

impl SharedGraph for TensorParallel {
    fn config(&self) -> &ModelConfig {
        &self.config
    }

    fn instance(self: Arc<Self>) -> Result<Model> {
        let mut turn = self.turn();
        let id = *turn;
        *turn += 1;
        send(&*self.comm, &Command::Instance(id))?;
        let inner = Llama::with_model(Arc::clone(&self.rank0))?;
        drop(turn);
        Ok(Model::from_graph(TpInstance {
            model: self,
            id,
            inner,
        }))
    }

    fn kv_dtype(&self) -> KvDtype {
        self.rank0.kv_dtype()
    }

    fn with_kv_dtype(self: Arc<Self>, kv_dtype: KvDtype) -> Result<SharedModel> {
        if kv_dtype == self.kv_dtype() {
            return Ok(SharedModel::from_graph(self));
        }
        Err(unsupported("change its KV cache dtype after the split"))
    }

    fn batch(self: Arc<Self>, _rows: usize) -> Result<Box<dyn BatchedForward>> {
        Err(unsupported("run the serving engine's batches"))
    }

    fn memory_needs(&self) -> Result<MemoryNeeds> {
        Err(unsupported("place layers on a GPU"))
    }

    fn place(self: Arc<Self>, _exec: &Executor, _placement: Placement) -> Result<SharedModel> {
        Err(unsupported("place layers on a GPU"))
    }
}

/// An instance of a [`TensorParallel`] model: rank 0's instance, and the id of the other
/// ranks' instances of it.
struct TpInstance {
    model: Arc<TensorParallel>,
    id: u64,
    inner: Llama,
}

impl Graph for TpInstance {
    fn config(&self) -> &ModelConfig {
        &self.model.config
    }

    fn shared(&self) -> SharedModel {
        SharedModel::from_graph(Arc::clone(&self.model) as Arc<dyn SharedGraph>)
    }

    fn run(
        &mut self,
        exec: &Executor,
        tokens: &[u32],
        start_pos: usize,
        head: Head,
    ) -> Result<&[f32]> {
        // Refused here, before any rank is asked, so that no rank fails alone.
        check_forward(&self.model.config, tokens, start_pos)?;
        let model = &*self.model;
        let _turn = model.turn();
        let cmd = Command::Run {
            id: self.id,
            start_pos,
            head,
            tokens: tokens.to_vec(),
        };
        send(&*model.comm, &cmd)?;
        let inner = &mut self.inner;
        model
            .pool
            .install(|| inner.run(exec, tokens, start_pos, head))
            .inspect_err(|e| model.comm.abort(&e.to_string()))
    }
}

impl Drop for TpInstance {
    fn drop(&mut self) {
        let _turn = self.model.turn();
        let _ = send(&*self.model.comm, &Command::Drop(self.id));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_survive_their_bytes() {
        let cmds = [
            Command::Instance(7),
            Command::Drop(u64::MAX),
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
            Command::Stop,
        ];
        for cmd in cmds {
            assert_eq!(Command::decode(&cmd.encode()).unwrap(), cmd);
        }
        assert!(Command::decode(&[0; 31]).is_err());
        assert!(Command::decode(&[9; 32]).is_err());
    }
}
