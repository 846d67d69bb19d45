//! The server-wide budget of the memory that requests can make flm hold
//! (`--max-request-memory`).
//!
//! Every completion or embeddings request reserves, before it is read, twice its body's
//! declared length (the bytes and what they parse into) and, once its prompt is tokenized,
//! an upper estimate of what its generation will hold: the prompt's ids for each of its `n`
//! choices, and per token to generate the id, its text and its share of the reply's JSON,
//! plus each log-probability alternative asked for (embeddings: their vectors). A request whose reservation exceeds the
//! whole budget is answered 413; one that does not fit beside the requests running now,
//! 429. What a request reserved is given back when it ends (its answer is sent, its
//! stream ends or its client leaves). The estimates are bounds on flm's own buffers, not a
//! measure of the allocator: the model's weights and the engine's KV pool are sized at
//! start and not counted here.
//!
//! Rendering a chat template reserves the most one render may build and emit
//! ([`RENDER_BYTES`]) while it runs, waiting for it while other requests hold the budget
//! (renders are short), so that a burst of chats is not refused; the generation's
//! reservation is then taken out of the render's ([`Budget::reserve_from`]), so that the
//! renders of the chats behind it do not refuse it either.
//!
//! Compiling a structured-output constraint reserves the most a compilation may hold
//! ([`flm_core::MAX_COMPILE_BYTES`]) while it runs, and the request then holds the
//! compiled constraint's size with its generation.
//!
//! Memory given back to the allocator is not always given back to the system. glibc's
//! malloc keeps freed pages in its arenas (one per thread that allocated, such as the
//! blocking threads that compile constraints) when live allocations sit above them; and
//! after a large block is freed it raises its mmap threshold to that block's size (up to
//! 32 MiB) and its trim threshold to twice that, so that later large blocks come from the
//! arenas too and up to 64 MiB free at the top of an arena stay there. After the probe's
//! hostile requests flm kept 36 MiB over its 18 MiB baseline. So [`tune_allocator`] fixes
//! the thresholds (blocks of 4 MiB and more are mapped on their own, and an arena keeps at
//! most 1 MiB free at its top), and glibc is asked to return the free pages inside its
//! arenas ([`trim`], `malloc_trim(0)`) after what leaves large temporaries: a constraint's
//! compilation (on its blocking thread), and, through reservations made with
//! [`Held::trimming`], a large body and a request with a constraint, once they end. The
//! same requests then leave about 3 MiB: some hundreds of KiB in each arena, and code
//! paged in.

use std::sync::Arc;

use axum::http::StatusCode;
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};

use super::error::ApiError;

/// Bytes held per prompt token and choice: the id in the request and in the engine's
/// sequence, and the rendered text it came from.
pub const PROMPT_TOKEN_BYTES: u64 = 16;

/// Bytes held per token to generate and choice: the id, its text, its JSON in the reply.
pub const TOKEN_BYTES: u64 = 64;

/// Bytes held per log-probability alternative (the chosen token's included) and token: the
/// token's text, its value and its JSON object with the token's bytes.
pub const LOGPROB_BYTES: u64 = 128;

/// Bytes held per value of an embedding: the pooled f64, the f32, its JSON number.
pub const EMBEDDING_VALUE_BYTES: u64 = 32;

/// Bytes reserved while a chat template renders: the most it may build
/// ([`flm_tokenizer::MAX_TEMPLATE_BUILT`]) and emit ([`flm_tokenizer::MAX_TEMPLATE_TEXT`]).
pub const RENDER_BYTES: u64 =
    (flm_tokenizer::MAX_TEMPLATE_BUILT + flm_tokenizer::MAX_TEMPLATE_TEXT) as u64;

/// `kib` in whole MiB, rounded up, for messages.
fn mib(kib: u64) -> u64 {
    kib.div_ceil(1024)
}

/// The budget, counted in KiB (a semaphore's permits).
pub struct Budget {
    permits: Arc<Semaphore>,
    /// Woken when a reservation is given back, for [`Budget::reserve_waiting`].
    released: Arc<Notify>,
    kib: u32,
}

/// A reservation, given back when dropped.
#[derive(Debug)]
pub struct Held {
    permit: OwnedSemaphorePermit,
    released: Arc<Notify>,
    /// [`trim`] when dropped.
    trim: bool,
}

impl Held {
    /// The same reservation, which returns the allocator's free pages to the system
    /// ([`trim`]) when it is dropped.
    pub fn trimming(mut self) -> Held {
        self.trim = true;
        self
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        // The permits go back before the waiting renders are woken to take them.
        drop(self.permit.split(self.permit.num_permits()));
        self.released.notify_waiters();
        if self.trim {
            // Off the runtime's workers: a trim takes milliseconds when arenas are large.
            match tokio::runtime::Handle::try_current() {
                Ok(runtime) => drop(runtime.spawn_blocking(trim)),
                Err(_) => trim(),
            }
        }
    }
}

/// Fixes glibc's mmap threshold at 4 MiB and its trim threshold at 1 MiB, instead of
/// thresholds that grow with the largest block freed (see the module docs); nothing with
/// another allocator. Call it before the server allocates.
pub fn tune_allocator() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt sets two of glibc's parameters, under its lock; an unknown value is
    // refused, not undefined.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 4 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 1 << 20);
    }
}

/// Returns the free pages of the allocator's arenas to the system (glibc's `malloc_trim`;
/// nothing elsewhere). Takes from tens of microseconds to tens of milliseconds (after
/// compilations that filled several arenas), locking one arena at a time: call it off the
/// runtime's workers.
pub fn trim() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only releases free memory of glibc's arenas, under their locks;
    // it reads no pointer of ours.
    unsafe {
        libc::malloc_trim(0);
    }
}

impl Budget {
    /// A budget of `mib` MiB (at most 4 TiB).
    pub fn new(mib: u32) -> Budget {
        let kib = mib.saturating_mul(1024);
        // A semaphore counts fewer permits on a 32-bit target.
        let kib = u32::try_from(Semaphore::MAX_PERMITS).map_or(kib, |max| kib.min(max));
        Budget {
            permits: Arc::new(Semaphore::new(kib as usize)),
            released: Arc::new(Notify::new()),
            kib,
        }
    }

    fn held(&self, permit: OwnedSemaphorePermit, trim: bool) -> Held {
        Held {
            permit,
            released: Arc::clone(&self.released),
            trim,
        }
    }

    /// Bytes the requests in flight hold reserved now (whole KiB).
    pub fn reserved_bytes(&self) -> u64 {
        let free = u64::try_from(self.permits.available_permits()).unwrap_or(u64::MAX);
        u64::from(self.kib).saturating_sub(free) * 1024
    }

    /// `bytes` in KiB, if the whole budget holds them.
    ///
    /// Errors: 413 `request_too_large` naming `what` when it does not.
    fn within(&self, what: &str, bytes: u64) -> Result<u32, ApiError> {
        let kib = bytes.div_ceil(1024);
        let over = u32::try_from(kib).ok().filter(|&k| k <= self.kib);
        over.ok_or_else(|| {
            ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "request_too_large",
                format!(
                    "{what} would hold about {} MiB, more than the server's whole memory budget \
                     for requests ({} MiB, --max-request-memory)",
                    mib(kib),
                    mib(self.kib.into())
                ),
            )
        })
    }

    /// As [`Budget::reserve`], but waits while the requests running now hold the memory
    /// instead of answering 429: for a short step that every request of a kind takes (a
    /// chat template's render), which a burst of requests would otherwise refuse. A waiting
    /// call holds none of the budget (it tries again each time a reservation is given
    /// back), so that it refuses no other request while it waits. Call it on a blocking
    /// thread of the runtime.
    ///
    /// Errors: 413 `request_too_large` when `bytes` exceed the whole budget.
    pub fn reserve_waiting(&self, what: &str, bytes: u64) -> Result<Held, ApiError> {
        let kib = self.within(what, bytes)?;
        tokio::runtime::Handle::current().block_on(async {
            loop {
                let released = self.released.notified();
                tokio::pin!(released);
                // Registered before the try, so that a release between the two wakes it.
                released.as_mut().enable();
                if let Ok(permit) = Arc::clone(&self.permits).try_acquire_many_owned(kib) {
                    return Ok(self.held(permit, false));
                }
                released.await;
            }
        })
    }

    /// Reserves `bytes` for `what` (a phrase such as "the request body").
    ///
    /// Errors: 413 `request_too_large` when `bytes` exceed the whole budget, 429
    /// `memory_budget_exhausted` when they do not fit beside the reservations held now.
    pub fn reserve(&self, what: &str, bytes: u64) -> Result<Held, ApiError> {
        self.reserve_from(None, what, bytes)
    }

    /// As [`Budget::reserve`], but takes the bytes first from `from`, a reservation that
    /// the same request holds already (its chat template's render): what `from` holds
    /// beyond `bytes` is given back, and only what it lacks must fit beside the other
    /// requests, so that a request that waited for its render is not then refused for its
    /// generation by the renders of the requests behind it. The result trims when dropped
    /// if `from` did.
    ///
    /// Errors: as [`Budget::reserve`]; `from` is given back on error.
    pub fn reserve_from(
        &self,
        from: Option<Held>,
        what: &str,
        bytes: u64,
    ) -> Result<Held, ApiError> {
        let kib = self.within(what, bytes)?;
        let Some(mut held) = from else {
            return Ok(self.held(self.acquire(what, kib, kib)?, false));
        };
        let have = held.permit.num_permits();
        let permit = match held.permit.split(kib as usize) {
            // The rest goes back when `held` is dropped.
            Some(permit) => permit,
            None => {
                // `have` < `kib`, a u32.
                let mut permit = self.acquire(what, kib - have as u32, kib)?;
                if let Some(all) = held.permit.split(have) {
                    permit.merge(all);
                }
                permit
            }
        };
        Ok(self.held(permit, held.trim))
    }

    /// Takes `kib` KiB of the budget now.
    ///
    /// Errors: 429 `memory_budget_exhausted`, saying that `what` would hold `total` KiB.
    fn acquire(&self, what: &str, kib: u32, total: u32) -> Result<OwnedSemaphorePermit, ApiError> {
        Arc::clone(&self.permits)
            .try_acquire_many_owned(kib)
            .map_err(|_| {
                ApiError::new(
                    StatusCode::TOO_MANY_REQUESTS,
                    "memory_budget_exhausted",
                    format!(
                        "{what} would hold about {} MiB, and the requests running now hold the \
                         rest of the server's memory budget for requests ({} MiB, \
                         --max-request-memory): retry later",
                        mib(total.into()),
                        mib(self.kib.into())
                    ),
                )
            })
    }
}

/// The estimate of what a request's generation holds: `n` choices of a prompt of
/// `prompt_len` tokens, each generating up to `max_tokens` tokens with `logprobs`
/// alternatives per token (`None`: no log-probabilities). Saturates rather than wraps: a
/// saturated estimate exceeds any budget.
pub fn generation_bytes(
    n: usize,
    prompt_len: usize,
    max_tokens: usize,
    logprobs: Option<usize>,
) -> u64 {
    let wide = |v: usize| u64::try_from(v).unwrap_or(u64::MAX);
    let per_token = logprobs.map_or(TOKEN_BYTES, |k| {
        wide(k)
            .saturating_add(1)
            .saturating_mul(LOGPROB_BYTES)
            .saturating_add(TOKEN_BYTES)
    });
    let per_choice = wide(prompt_len)
        .saturating_mul(PROMPT_TOKEN_BYTES)
        .saturating_add(wide(max_tokens).saturating_mul(per_token));
    wide(n).saturating_mul(per_choice)
}

/// The estimate of what `inputs` embeddings of `dim` values hold until they are answered.
pub fn embedding_bytes(inputs: usize, dim: usize) -> u64 {
    let wide = |v: usize| u64::try_from(v).unwrap_or(u64::MAX);
    wide(inputs)
        .saturating_mul(wide(dim))
        .saturating_mul(EMBEDDING_VALUE_BYTES)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reservations_are_refused_over_the_budget_and_given_back_when_dropped() {
        let budget = Budget::new(1);
        let e = budget.reserve("it", 2 << 20).unwrap_err();
        assert_eq!(
            (e.status.as_u16(), e.code),
            (413, Some("request_too_large"))
        );
        let e = budget.reserve("it", u64::MAX).unwrap_err();
        assert_eq!(e.status.as_u16(), 413);
        let held = budget.reserve("it", 700 << 10).unwrap();
        assert_eq!(budget.reserved_bytes(), 700 << 10);
        let e = budget.reserve("that", 400 << 10).unwrap_err();
        assert_eq!(e.status.as_u16(), 429, "{}", e.message);
        assert!(e.message.starts_with("that would hold about 1 MiB"));
        drop(held);
        assert!(budget.reserve("that", 400 << 10).is_ok());
    }

    #[test]
    fn a_reservation_taken_from_another_keeps_what_it_needs() {
        let budget = Budget::new(1);
        let render = budget.reserve("render", 600 << 10).unwrap();
        let other = budget.reserve("other", 300 << 10).unwrap();
        // Less than the render held: the rest is given back at once.
        let generation = budget
            .reserve_from(Some(render), "generation", 100 << 10)
            .unwrap();
        assert_eq!(budget.reserved_bytes(), 400 << 10);
        // More than it holds: only the lack must fit beside `other`.
        let grown = budget
            .reserve_from(Some(generation.trimming()), "generation", 700 << 10)
            .unwrap();
        assert!(grown.trim);
        assert_eq!(budget.reserved_bytes(), 1000 << 10);
        // A lack that does not fit is refused, and what was held is given back.
        let e = budget
            .reserve_from(Some(grown), "generation", 1020 << 10)
            .unwrap_err();
        assert_eq!(e.status.as_u16(), 429, "{}", e.message);
        assert!(e.message.starts_with("generation would hold about 1 MiB"));
        assert_eq!(budget.reserved_bytes(), 300 << 10);
        drop(other);
        assert_eq!(budget.reserved_bytes(), 0);
    }

    #[test]
    fn a_waiting_reservation_holds_none_of_the_budget() {
        let runtime = tokio::runtime::Runtime::new().unwrap();
        let budget = Arc::new(Budget::new(1));
        let first = budget.reserve("first", 500 << 10).unwrap();
        let waiting = Arc::clone(&budget);
        let render = runtime.spawn_blocking(move || {
            let _held = waiting.reserve_waiting("render", 600 << 10).unwrap();
            waiting.reserved_bytes()
        });
        std::thread::sleep(std::time::Duration::from_millis(100));
        assert!(!render.is_finished());
        // What the waiting render lacks is not taken from the others.
        let second = budget.reserve("second", 500 << 10).unwrap();
        drop(first);
        std::thread::sleep(std::time::Duration::from_millis(100));
        assert!(!render.is_finished());
        drop(second);
        let reserved = runtime.block_on(render).unwrap();
        assert_eq!(reserved, 600 << 10);
        assert_eq!(budget.reserved_bytes(), 0);
    }

    #[test]
    fn the_estimate_grows_with_each_factor_and_saturates() {
        assert_eq!(generation_bytes(1, 10, 100, None), 10 * 16 + 100 * 64);
        assert_eq!(
            generation_bytes(2, 10, 100, Some(3)),
            2 * (10 * 16 + 100 * (64 + 4 * 128))
        );
        assert_eq!(generation_bytes(128, 1, usize::MAX, Some(20)), u64::MAX);
    }
}
