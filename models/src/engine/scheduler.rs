//! The scheduler thread of the [`super::Engine`]: admission, preemption, the batched step
//! and the delivery of events (see the module docs of [`super`]).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, TryRecvError};
use std::sync::{Arc, Mutex};

use flm_core::{log_softmax_top, Constraint, Executor, PagedKvCache, Sampler};

use super::prefix::PrefixCache;
use super::{EngineConfig, EngineStats, Event, Finish, FinishReason, OnEvent};
use crate::{BatchSeq, BatchedForward};

/// A request as the scheduler receives it (validated by [`super::Engine::submit`]).
pub(super) struct Pending {
    pub prompt: Vec<u32>,
    pub sampler: Sampler,
    pub max_tokens: usize,
    /// Stop and end-of-sequence ids.
    pub stop: Vec<u32>,
    pub logprobs: Option<usize>,
    pub constraint: Option<Constraint>,
    pub cancel: Option<Arc<AtomicBool>>,
    pub on_event: OnEvent,
}

/// A request being served: waiting or running.
struct Seq {
    /// Prompt, then the generated tokens.
    tokens: Vec<u32>,
    prompt_len: usize,
    sampler: Sampler,
    max_tokens: usize,
    stop: Vec<u32>,
    logprobs: Option<usize>,
    constraint: Option<Constraint>,
    cancel: Option<Arc<AtomicBool>>,
    on_event: OnEvent,
    /// Its block table.
    blocks: Vec<u32>,
    /// Leading tokens whose keys and values are in its blocks.
    cached: usize,
    /// Tokens of this step (set when it is scheduled).
    chunk: usize,
}

impl Seq {
    fn generated(&self) -> usize {
        self.tokens.len() - self.prompt_len
    }

    fn cancelled(&self) -> bool {
        self.cancel
            .as_ref()
            .is_some_and(|c| c.load(Ordering::Relaxed))
    }
}

/// What ended a sequence after a step.
enum Outcome {
    Continue,
    Finished(FinishReason),
    Cancelled,
}

pub(super) struct Scheduler {
    batch: Box<dyn BatchedForward>,
    exec: Executor,
    kv: PagedKvCache,
    prefill_budget: usize,
    step_budget: Option<usize>,
    stats: Arc<Mutex<EngineStats>>,
    queued: Arc<AtomicUsize>,
    waiting: VecDeque<Seq>,
    /// In order of admission.
    running: Vec<Seq>,
    counters: EngineStats,
    /// The prefix cache; `None` with a p-tuning prefix, which shifts every
    /// token's cache position.
    prefixes: Option<PrefixCache>,
    /// Requests that ended this step, told after the counters are published (so that a
    /// caller who sees `Finished` sees the blocks freed in [`super::Engine::stats`]).
    ended: Vec<(OnEvent, Finish)>,
}

impl Scheduler {
    /// The scheduler of an engine of `config` over `batch` and its KV pool `kv`, reporting
    /// into `stats` and `queued`, which the engine shares.
    pub(super) fn new(
        batch: Box<dyn BatchedForward>,
        exec: Executor,
        kv: PagedKvCache,
        config: &EngineConfig,
        stats: Arc<Mutex<EngineStats>>,
        queued: Arc<AtomicUsize>,
    ) -> Scheduler {
        let (batch_pre, block_size) = (batch.config().pre_seq_len, kv.block_size());
        let counters = EngineStats {
            total_blocks: kv.allocator().total(),
            block_size: kv.block_size(),
            ..EngineStats::default()
        };
        Scheduler {
            batch,
            exec,
            kv,
            prefill_budget: config.max_batch_prefill_tokens,
            step_budget: config.max_batch_tokens,
            stats,
            queued,
            waiting: VecDeque::new(),
            running: Vec::new(),
            counters,
            prefixes: (batch_pre == 0).then(|| PrefixCache::new(block_size)),
            ended: Vec::new(),
        }
    }

    /// Serves requests from `receiver` until its sender is dropped, then cancels what is
    /// left.
    pub(super) fn run(mut self, receiver: Receiver<Pending>) {
        'serve: loop {
            if self.running.is_empty() && self.waiting.is_empty() {
                match receiver.recv() {
                    Ok(p) => self.enqueue(p),
                    Err(_) => break 'serve,
                }
            }
            loop {
                match receiver.try_recv() {
                    Ok(p) => self.enqueue(p),
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) => break 'serve,
                }
            }
            self.step();
            self.publish();
        }
        let left: Vec<Seq> = self
            .running
            .drain(..)
            .chain(self.waiting.drain(..))
            .collect();
        for seq in left {
            self.finish(seq, FinishReason::Cancelled);
        }
        self.publish();
    }

    fn enqueue(&mut self, p: Pending) {
        let mut seq = Seq {
            prompt_len: p.prompt.len(),
            tokens: p.prompt,
            sampler: p.sampler,
            max_tokens: p.max_tokens,
            stop: p.stop,
            logprobs: p.logprobs,
            constraint: p.constraint,
            cancel: p.cancel,
            on_event: p.on_event,
            blocks: Vec::new(),
            cached: 0,
            chunk: 0,
        };
        if seq.max_tokens == 0 {
            self.queued.fetch_sub(1, Ordering::SeqCst);
            seq.prompt_len = seq.tokens.len();
            self.finish(seq, FinishReason::Length);
            return;
        }
        self.waiting.push_back(seq);
    }

    /// Publishes the counters for [`super::Engine::stats`], then tells the requests that
    /// ended.
    fn publish(&mut self) {
        self.counters.waiting = self.waiting.len();
        self.counters.running = self.running.len();
        self.counters.free_blocks = self.available_blocks();
        self.counters.cached_blocks = self.prefixes.as_ref().map_or(0, PrefixCache::len);
        {
            let mut stats = match self.stats.lock() {
                Ok(s) => s,
                Err(poisoned) => poisoned.into_inner(),
            };
            *stats = self.counters.clone();
        }
        for (mut on_event, finish) in self.ended.drain(..) {
            let _ = on_event(Event::Finished(finish));
        }
    }

    /// Gives `seq`'s blocks back.
    fn free_blocks(&mut self, seq: &mut Seq) {
        for b in seq.blocks.drain(..) {
            // Every block of a table was allocated to it: releasing cannot fail. A block
            // of the prefix cache keeps the cache's reference.
            let _ = self.kv.allocator_mut().release(b);
        }
        seq.cached = 0;
    }

    /// Frees `seq`; its callback is told how it ended at the next [`Scheduler::publish`].
    fn finish(&mut self, mut seq: Seq, reason: FinishReason) {
        self.free_blocks(&mut seq);
        self.counters.finished_requests += 1;
        let finish = Finish {
            reason,
            prompt_tokens: seq.prompt_len,
            completion_tokens: seq.generated(),
        };
        self.ended.push((seq.on_event, finish));
    }

    /// Takes a free block, evicting the least recently used cached prefix block when none
    /// is free.
    fn alloc_block(&mut self) -> Option<u32> {
        if self.kv.allocator().free() == 0 {
            if let Some(p) = &mut self.prefixes {
                p.evict(1, self.kv.allocator_mut());
            }
        }
        self.kv.allocator_mut().alloc()
    }

    /// Blocks that can be had now: free ones and cached prefix blocks no sequence uses.
    fn available_blocks(&self) -> usize {
        let alloc = self.kv.allocator();
        alloc.free() + self.prefixes.as_ref().map_or(0, |p| p.evictable(alloc))
    }

    /// Makes sure running sequence `i` has blocks up to cache position `end` (exclusive),
    /// preempting the latest admitted sequences when the pool is empty. Returns false when
    /// `i` itself was preempted (or cannot grow any more).
    fn grow(&mut self, i: usize, end: usize) -> bool {
        let pre = self.batch.config().pre_seq_len;
        while self.running[i].blocks.len() * self.kv.block_size() < pre + end {
            if let Some(b) = self.alloc_block() {
                self.running[i].blocks.push(b);
                continue;
            }
            let victim = self.running.len() - 1;
            let mut seq = self.running.remove(victim);
            self.free_blocks(&mut seq);
            self.counters.preemptions += 1;
            self.queued.fetch_add(1, Ordering::SeqCst);
            self.waiting.push_front(seq);
            if victim == i {
                return false;
            }
        }
        true
    }

    /// Ends the sequences, running or waiting, whose request was cancelled by its flag.
    fn drop_cancelled(&mut self) {
        let (cancelled, running): (Vec<Seq>, Vec<Seq>) = std::mem::take(&mut self.running)
            .into_iter()
            .partition(Seq::cancelled);
        self.running = running;
        let (waiting, kept): (VecDeque<Seq>, VecDeque<Seq>) = std::mem::take(&mut self.waiting)
            .into_iter()
            .partition(Seq::cancelled);
        self.waiting = kept;
        self.queued.fetch_sub(waiting.len(), Ordering::SeqCst);
        for seq in cancelled.into_iter().chain(waiting) {
            self.finish(seq, FinishReason::Cancelled);
        }
    }

    /// One scheduling step and one batched forward pass.
    fn step(&mut self) {
        self.drop_cancelled();
        // Decoding sequences first: one slot each, preempting from the back if needed.
        let mut i = 0;
        while i < self.running.len() {
            let (len, cached) = (self.running[i].tokens.len(), self.running[i].cached);
            if len - cached == 1 && !self.grow(i, len) {
                continue;
            }
            i += 1;
        }
        // Prefill chunks of running sequences, then admissions, within the budget.
        let decoding = self
            .running
            .iter()
            .filter(|s| s.tokens.len() - s.cached == 1)
            .count();
        let mut budget = self.step_budget.map_or(self.prefill_budget, |step| {
            self.prefill_budget
                .min(step.saturating_sub(decoding).max(1))
        });
        for seq in &mut self.running {
            let pending = seq.tokens.len() - seq.cached;
            seq.chunk = if pending == 1 {
                1
            } else {
                let chunk = pending.min(budget);
                budget -= chunk;
                chunk
            };
        }
        self.admit(&mut budget);
        if self.running.iter().all(|s| s.chunk == 0) {
            return;
        }
        self.forward();
    }

    /// Admits waiting sequences in order while the budget and the free blocks allow their
    /// whole prompt (plus the p-tuning prefix), taking the blocks of a cached prefix
    /// instead of computing it again and evicting unused cached blocks when too few are free.
    fn admit(&mut self, budget: &mut usize) {
        let pre = self.batch.config().pre_seq_len;
        let bs = self.kv.block_size();
        while *budget > 0 {
            let Some(seq) = self.waiting.front() else {
                break;
            };
            // At least the last token is computed, for its logits.
            let max_shared = (seq.tokens.len() - 1) / bs;
            let blocks = self.kv.blocks_for(pre + seq.tokens.len());
            let shared = self
                .prefixes
                .as_mut()
                .map_or_else(Vec::new, |p| p.lookup(&seq.tokens, max_shared));
            // Registered blocks are allocated (the cache owns them): retaining cannot fail.
            for &b in &shared {
                let _ = self.kv.allocator_mut().retain(b);
            }
            let need = blocks - shared.len();
            if need > self.available_blocks() {
                for &b in &shared {
                    let _ = self.kv.allocator_mut().release(b);
                }
                break;
            }
            let Some(mut seq) = self.waiting.pop_front() else {
                break;
            };
            self.queued.fetch_sub(1, Ordering::SeqCst);
            seq.cached = shared.len() * bs;
            if !shared.is_empty() {
                self.counters.prefix_cache_hits += 1;
            }
            self.counters.prefix_cached_tokens += seq.cached as u64;
            seq.blocks = shared;
            let short = need.saturating_sub(self.kv.allocator().free());
            if let Some(p) = &mut self.prefixes {
                p.evict(short, self.kv.allocator_mut());
            }
            for _ in 0..need {
                if let Some(b) = self.kv.allocator_mut().alloc() {
                    seq.blocks.push(b);
                }
            }
            if seq.generated() == 0 {
                self.counters.prompt_tokens += seq.prompt_len as u64;
            }
            if let Err(e) = self
                .batch
                .write_prefix(&self.exec, &mut self.kv, &seq.blocks)
            {
                self.finish(seq, FinishReason::Error(e.to_string()));
                continue;
            }
            seq.chunk = (seq.tokens.len() - seq.cached).min(*budget);
            *budget -= seq.chunk;
            self.running.push(seq);
        }
    }

    /// The batched forward pass of the scheduled chunks, sampling and events.
    fn forward(&mut self) {
        let seqs: Vec<BatchSeq<'_>> = self
            .running
            .iter()
            .filter(|s| s.chunk > 0)
            .map(|s| BatchSeq {
                tokens: &s.tokens[s.cached..s.cached + s.chunk],
                start_pos: s.cached,
                blocks: &s.blocks,
            })
            .collect();
        let vocab = self.batch.config().vocab_size;
        let max_seq = self.batch.config().max_seq_len;
        let logits = match self.batch.forward(&self.exec, &mut self.kv, &seqs) {
            Ok(l) => l.to_vec(),
            Err(e) => {
                let msg = e.to_string();
                let failed: Vec<Seq> = self.running.drain(..).collect();
                for seq in failed {
                    self.finish(seq, FinishReason::Error(msg.clone()));
                }
                return;
            }
        };
        let running = std::mem::take(&mut self.running);
        let mut row = 0;
        for mut seq in running {
            if seq.chunk == 0 {
                self.running.push(seq);
                continue;
            }
            seq.cached += seq.chunk;
            seq.chunk = 0;
            if let Some(p) = &mut self.prefixes {
                p.register(
                    &seq.blocks,
                    &seq.tokens,
                    seq.cached,
                    self.kv.allocator_mut(),
                );
            }
            let logits = &logits[row * vocab..][..vocab];
            row += 1;
            if seq.cached < seq.tokens.len() {
                self.running.push(seq);
                continue;
            }
            match self.sample(&mut seq, logits, max_seq) {
                Outcome::Continue => self.running.push(seq),
                Outcome::Finished(reason) => self.finish(seq, reason),
                Outcome::Cancelled => {
                    self.free_blocks(&mut seq);
                    self.counters.finished_requests += 1;
                }
            }
        }
    }

    /// Samples `seq`'s next token from `logits` and delivers it.
    fn sample(&mut self, seq: &mut Seq, logits: &[f32], max_seq: usize) -> Outcome {
        let generated = &seq.tokens[seq.prompt_len..];
        let masked;
        let allowed = match &seq.constraint {
            // A reply that is a whole word no token extends ends (only an empty one can be
            // one here: the others end when their last token is taken).
            Some(c) if c.finished() => return Outcome::Finished(FinishReason::Stop),
            Some(c) => {
                masked = {
                    let mut l = logits.to_vec();
                    if c.mask(&mut l, &seq.stop) == 0 {
                        let e = format!(
                            "no token continues the reply within its constraint after {} tokens",
                            generated.len()
                        );
                        return Outcome::Finished(FinishReason::Constraint(e));
                    }
                    l
                };
                &masked[..]
            }
            None => logits,
        };
        let next = match seq
            .sampler
            .sample_with_output(allowed, &seq.tokens, generated)
        {
            Ok(t) => t,
            Err(e) => return Outcome::Finished(FinishReason::Error(e.to_string())),
        };
        if seq.stop.contains(&next) {
            return Outcome::Finished(FinishReason::Stop);
        }
        if let Some(c) = &mut seq.constraint {
            if let Err(e) = c.advance(next) {
                return Outcome::Finished(FinishReason::Error(e.to_string()));
            }
        }
        let logprobs = match seq.logprobs.map(|k| log_softmax_top(logits, next, k)) {
            None => None,
            Some(Ok(l)) => Some(l),
            Some(Err(e)) => return Outcome::Finished(FinishReason::Error(e.to_string())),
        };
        seq.tokens.push(next);
        self.counters.generated_tokens += 1;
        if (seq.on_event)(Event::Token(next, logprobs)).is_break() {
            return Outcome::Cancelled;
        }
        if seq.constraint.as_ref().is_some_and(Constraint::finished) {
            return Outcome::Finished(FinishReason::Stop);
        }
        let pool = self.kv.allocator().total() * self.kv.block_size();
        let pre = self.batch.config().pre_seq_len;
        if seq.generated() >= seq.max_tokens
            || seq.tokens.len() >= max_seq
            || pre + seq.tokens.len() >= pool
        {
            return Outcome::Finished(FinishReason::Length);
        }
        Outcome::Continue
    }
}
