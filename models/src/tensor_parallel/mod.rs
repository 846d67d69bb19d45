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

use flm_core::PagedKvCache;

use crate::graph::{BatchSeq, BatchedForward, Graph, Head, MemoryNeeds, SharedGraph};
use crate::llama::{check_forward, Llama, LlamaWeights, SharedLlama};
use crate::{Error, Model, ModelConfig, Placement, Result, SharedModel};

mod command;

use command::{receive, send};
pub use command::{Command, Seq};

/// Makes a rank's executor (each rank of [`TensorParallel::local`] runs its ops on its own
/// thread pool, through its own executor).
pub type ExecutorFactory = Arc<dyn Fn() -> Result<Executor> + Send + Sync>;

/// The loop of a rank other than 0: runs its part (`model`, built by
/// [`SharedLlama::shard`]) of each command rank 0 sends, with `exec`, until
/// [`Command::Stop`]. A failure ends the group ([`Communicator::abort`]) so that no rank
/// waits for this one.
///
/// Errors: the first failure, after ending the group.
pub fn serve_rank(model: Arc<SharedLlama>, comm: &dyn Communicator, exec: &Executor) -> Result<()> {
    let mut ranks = Served::default();
    loop {
        let step = std::panic::AssertUnwindSafe(|| ranks.serve(&model, comm, exec));
        match std::panic::catch_unwind(step) {
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

/// What a rank other than 0 holds for rank 0: instances, and batched forward passes with
/// their KV pools, by id.
#[derive(Default)]
struct Served {
    instances: Vec<(u64, Llama)>,
    batches: Vec<(u64, Box<dyn BatchedForward>, Option<PagedKvCache>)>,
}

impl Served {
    /// Runs the next command; false after [`Command::Stop`].
    fn serve(
        &mut self,
        model: &Arc<SharedLlama>,
        comm: &dyn Communicator,
        exec: &Executor,
    ) -> Result<bool> {
        let missing = |id: u64| Error::State(format!("nothing of id {id} on rank {}", comm.rank()));
        match receive(comm)? {
            Command::Instance(id) => self
                .instances
                .push((id, Llama::with_model(Arc::clone(model))?)),
            Command::Run {
                id,
                start_pos,
                head,
                tokens,
            } => {
                let (_, llama) = self
                    .instances
                    .iter_mut()
                    .find(|(i, _)| *i == id)
                    .ok_or_else(|| missing(id))?;
                llama.run(exec, &tokens, start_pos, head)?;
            }
            Command::Batch { id, rows } => {
                // As rank 0's engine requires of its own executor.
                exec.require_batch_invariance();
                self.batches
                    .push((id, Arc::clone(model).batch(rows)?, None));
            }
            Command::Pool {
                id,
                n_blocks,
                block_size,
            } => {
                let (_, batch, kv) = self.batch(id).ok_or_else(|| missing(id))?;
                *kv = Some(batch.kv_pool(exec, n_blocks, block_size)?);
            }
            Command::Prefix { id, blocks } => {
                let (_, batch, kv) = self.batch(id).ok_or_else(|| missing(id))?;
                let kv = kv.as_mut().ok_or_else(|| missing(id))?;
                batch.write_prefix(exec, kv, &blocks)?;
            }
            Command::Step { id, seqs } => {
                let (_, batch, kv) = self.batch(id).ok_or_else(|| missing(id))?;
                let kv = kv.as_mut().ok_or_else(|| missing(id))?;
                let seqs: Vec<BatchSeq<'_>> = seqs.iter().map(Seq::as_batch).collect();
                batch.forward(exec, kv, &seqs)?;
            }
            Command::Drop(id) => {
                self.instances.retain(|(i, _)| *i != id);
                self.batches.retain(|(i, ..)| *i != id);
            }
            Command::Stop => return Ok(false),
        }
        Ok(true)
    }

    fn batch(
        &mut self,
        id: u64,
    ) -> Option<&mut (u64, Box<dyn BatchedForward>, Option<PagedKvCache>)> {
        self.batches.iter_mut().find(|(i, ..)| *i == id)
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

    /// Broadcasts `cmd`, then runs `part` (rank 0's part of it) on rank 0's pool, under
    /// one turn; a failure of rank 0's part ends the group.
    fn call<R: Send>(&self, cmd: &Command, part: impl FnOnce() -> Result<R> + Send) -> Result<R> {
        let _turn = self.turn();
        send(&*self.comm, cmd)?;
        self.pool
            .install(part)
            .inspect_err(|e| self.comm.abort(&e.to_string()))
    }

    /// A new id, and the command that makes it.
    fn make<R: Send>(
        &self,
        cmd: impl FnOnce(u64) -> Command,
        part: impl FnOnce() -> Result<R> + Send,
    ) -> Result<(u64, R)> {
        let mut turn = self.turn();
        let id = *turn;
        *turn += 1;
        send(&*self.comm, &cmd(id))?;
        let made = self
            .pool
            .install(part)
            .inspect_err(|e| self.comm.abort(&e.to_string()))?;
        Ok((id, made))
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
        let rank0 = Arc::clone(&self.rank0);
        let (id, inner) = self.make(Command::Instance, || Llama::with_model(rank0))?;
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

    fn batch(self: Arc<Self>, rows: usize) -> Result<Box<dyn BatchedForward>> {
        let rank0 = Arc::clone(&self.rank0);
        let (id, inner) = self.make(|id| Command::Batch { id, rows }, || rank0.batch(rows))?;
        Ok(Box::new(TpBatch {
            model: self,
            id,
            inner,
        }))
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
        let cmd = Command::Run {
            id: self.id,
            start_pos,
            head,
            tokens: tokens.to_vec(),
        };
        let inner = &mut self.inner;
        self.model
            .call(&cmd, || inner.run(exec, tokens, start_pos, head))
    }
}

impl Drop for TpInstance {
    fn drop(&mut self) {
        let _turn = self.model.turn();
        let _ = send(&*self.model.comm, &Command::Drop(self.id));
    }
}

/// A batched forward pass of a [`TensorParallel`] model (the serving engine's): rank 0's,
/// and the id of the other ranks' passes and KV pools, which follow its block tables.
struct TpBatch {
    model: Arc<TensorParallel>,
    id: u64,
    inner: Box<dyn BatchedForward>,
}

impl BatchedForward for TpBatch {
    fn config(&self) -> &ModelConfig {
        &self.model.config
    }

    fn kv_pool(&self, exec: &Executor, n_blocks: usize, block_size: usize) -> Result<PagedKvCache> {
        let cmd = Command::Pool {
            id: self.id,
            n_blocks,
            block_size,
        };
        // An allocation, on this thread: the pass is not `Sync`, so cannot go to the pool.
        let model = &*self.model;
        let _turn = model.turn();
        send(&*model.comm, &cmd)?;
        (self.inner.kv_pool(exec, n_blocks, block_size))
            .inspect_err(|e| model.comm.abort(&e.to_string()))
    }

    fn write_prefix(
        &mut self,
        exec: &Executor,
        kv: &mut PagedKvCache,
        blocks: &[u32],
    ) -> Result<()> {
        let cmd = Command::Prefix {
            id: self.id,
            blocks: blocks.to_vec(),
        };
        let inner = &mut self.inner;
        self.model
            .call(&cmd, || inner.write_prefix(exec, kv, blocks))
    }

    fn forward(
        &mut self,
        exec: &Executor,
        kv: &mut PagedKvCache,
        seqs: &[BatchSeq<'_>],
    ) -> Result<&[f32]> {
        let owned = seqs
            .iter()
            .map(|s| Seq {
                tokens: s.tokens.to_vec(),
                start_pos: s.start_pos,
                blocks: s.blocks.to_vec(),
            })
            .collect();
        let cmd = Command::Step {
            id: self.id,
            seqs: owned,
        };
        let inner = &mut self.inner;
        self.model.call(&cmd, || inner.forward(exec, kv, seqs))
    }
}

impl Drop for TpBatch {
    fn drop(&mut self) {
        let _turn = self.model.turn();
        let _ = send(&*self.model.comm, &Command::Drop(self.id));
    }
}
