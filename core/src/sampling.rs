//! Token sampling: greedy, temperature, top-k, top-p (nucleus), repetition, presence and
//! frequency penalties.
//!
//! The order follows llama.cpp and Hugging Face `generate`: repetition penalty on the raw
//! logits (Keskar et al. 2019, CTRL: divide positive logits by the penalty, multiply
//! negative ones), then OpenAI's presence and frequency penalties (as vLLM applies them,
//! before the temperature), then temperature, then top-k, then top-p (Holtzman et al. 2019), then a
//! draw from the renormalised distribution. Temperature 0 is greedy (argmax). The random
//! stream is ChaCha8 seeded by [`SamplerConfig::seed`], so a seeded run is reproducible on
//! every platform.
//!
//! The same sampling runs as an op ([`crate::Op::Sample`]) on the device that holds the
//! logits: [`sample_tensors`] is its definition, over the random stream's state and the
//! history held in tensors ([`sampler_state`], [`chacha8_word`]), and gives the ids
//! [`Sampler::sample_with_output`] gives.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::{Data, DataType, Error, Executor, Location, Op, Result, SampleState};

/// Sampling parameters.
#[derive(Debug, Clone, PartialEq)]
pub struct SamplerConfig {
    /// Softmax temperature; 0 (or anything below 1e-6) means greedy. Must be finite and
    /// `>= 0`.
    pub temperature: f32,
    /// Keep only the `top_k` most likely tokens; 0 disables.
    pub top_k: usize,
    /// Keep the smallest set of tokens whose probability reaches `top_p`; in `(0, 1]`,
    /// 1 disables.
    pub top_p: f32,
    /// CTRL repetition penalty over the history given to [`Sampler::sample`]; `> 0`,
    /// 1 disables.
    pub repeat_penalty: f32,
    /// Seed of the random stream.
    pub seed: u64,
    /// OpenAI's presence penalty: subtracted once from the logit of every token that occurs
    /// in the generated output given to [`Sampler::sample_with_output`]; in `[-2, 2]`,
    /// 0 disables.
    pub presence_penalty: f32,
    /// OpenAI's frequency penalty: subtracted from a token's logit as many times as it occurs
    /// in the generated output; in `[-2, 2]`, 0 disables.
    pub frequency_penalty: f32,
}

impl SamplerConfig {
    /// Checks the parameters' ranges.
    ///
    /// Errors: [`Error::InvalidArgument`] for a negative or non-finite temperature, a
    /// `top_p` outside `(0, 1]`, a non-positive repetition penalty, or a presence or
    /// frequency penalty outside `[-2, 2]`.
    pub fn check(&self) -> Result<()> {
        if !(self.temperature >= 0.0 && self.temperature.is_finite()) {
            return Err(Error::InvalidArgument(format!(
                "temperature must be a finite number >= 0, got {}",
                self.temperature
            )));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(Error::InvalidArgument(format!(
                "top-p must be in (0, 1], got {}",
                self.top_p
            )));
        }
        if !(self.repeat_penalty > 0.0 && self.repeat_penalty.is_finite()) {
            return Err(Error::InvalidArgument(format!(
                "repetition penalty must be a finite number > 0, got {}",
                self.repeat_penalty
            )));
        }
        for (name, p) in [
            ("presence", self.presence_penalty),
            ("frequency", self.frequency_penalty),
        ] {
            if !(-2.0..=2.0).contains(&p) {
                return Err(Error::InvalidArgument(format!(
                    "the {name} penalty must be in [-2, 2], got {p}"
                )));
            }
        }
        Ok(())
    }

    /// Whether sampling is greedy (argmax): a temperature below 1e-6, where 1/T overflows
    /// the logits' range and the distribution is one-hot anyway.
    pub fn is_greedy(&self) -> bool {
        self.temperature < 1e-6
    }
}

impl Default for SamplerConfig {
    fn default() -> Self {
        SamplerConfig {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            repeat_penalty: 1.0,
            seed: 0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
        }
    }
}

/// Picks the next token from logits.
pub struct Sampler {
    config: SamplerConfig,
    rng: ChaCha8Rng,
    logits: Vec<f32>,
    candidates: Vec<(u32, f32)>,
    seen: Vec<u32>,
    counts: Vec<u32>,
}

/// Index of the largest value of `values` (the first on ties; NaN never wins; 0 for an
/// empty slice).
pub fn argmax(values: &[f32]) -> u32 {
    let mut best = 0;
    let mut best_value = f32::NEG_INFINITY;
    for (i, &v) in values.iter().enumerate() {
        if v > best_value {
            best = i;
            best_value = v;
        }
    }
    best as u32
}

/// The greedy pick: [`argmax`] of `logits`.
///
/// Errors: [`Error::InvalidArgument`] when every logit is NaN (a broken forward pass),
/// as sampling at a temperature refuses them, rather than id 0.
fn greedy(logits: &[f32]) -> Result<u32> {
    if logits.iter().all(|v| v.is_nan()) {
        return Err(all_nan());
    }
    Ok(argmax(logits))
}

fn all_nan() -> Error {
    Error::InvalidArgument("all logits are NaN".into())
}

/// The log-probabilities of one sampled token, as OpenAI's `logprobs` report them.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenLogprobs {
    /// Natural log of the chosen token's probability.
    pub logprob: f32,
    /// The most likely tokens and their log-probabilities, most likely first (ties: the
    /// lower id first).
    pub top: Vec<(u32, f32)>,
}

/// Log-probabilities of `chosen` and of the `top` most likely tokens under
/// `softmax(logits)`: the model's own distribution, before penalties, temperature and
/// truncation (vLLM's default, `logprobs_mode = raw_logprobs`). Log-sum-exp in f64 after
/// subtracting the largest logit. NaN logits count as −∞.
///
/// Errors: [`Error::InvalidArgument`] for empty logits, a `chosen` outside them, or logits
/// with no finite maximum.
pub fn log_softmax_top(logits: &[f32], chosen: u32, top: usize) -> Result<TokenLogprobs> {
    let max = logits
        .iter()
        .copied()
        .filter(|v| !v.is_nan())
        .fold(f32::NEG_INFINITY, f32::max);
    if !max.is_finite() || chosen as usize >= logits.len() {
        return Err(Error::InvalidArgument(format!(
            "log-probabilities of token {chosen} over {} logits with largest {max}",
            logits.len()
        )));
    }
    let clean = |v: f32| if v.is_nan() { f32::NEG_INFINITY } else { v };
    let sum: f64 = logits
        .iter()
        .map(|&v| (f64::from(clean(v)) - f64::from(max)).exp())
        .sum();
    let log_z = f64::from(max) + sum.ln();
    let logprob = |v: f32| (f64::from(clean(v)) - log_z) as f32;
    let mut ids: Vec<u32> = (0..logits.len() as u32).collect();
    let order = |a: &u32, b: &u32| {
        let (x, y) = (clean(logits[*a as usize]), clean(logits[*b as usize]));
        y.total_cmp(&x).then(a.cmp(b))
    };
    let top = top.min(ids.len());
    if top > 0 && top < ids.len() {
        ids.select_nth_unstable_by(top - 1, order);
    }
    ids.truncate(top);
    ids.sort_unstable_by(order);
    Ok(TokenLogprobs {
        logprob: logprob(logits[chosen as usize]),
        top: ids
            .into_iter()
            .map(|id| (id, logprob(logits[id as usize])))
            .collect(),
    })
}

impl Sampler {
    /// A sampler with `config`.
    ///
    /// Errors: [`Error::InvalidArgument`] for a negative or non-finite temperature, a
    /// `top_p` outside `(0, 1]`, a non-positive repetition penalty, or a presence or
    /// frequency penalty outside `[-2, 2]`.
    pub fn new(config: SamplerConfig) -> Result<Sampler> {
        config.check()?;
        Ok(Sampler {
            rng: ChaCha8Rng::seed_from_u64(config.seed),
            config,
            logits: Vec::new(),
            candidates: Vec::new(),
            seen: Vec::new(),
            counts: Vec::new(),
        })
    }

    /// The parameters.
    pub fn config(&self) -> &SamplerConfig {
        &self.config
    }

    /// Picks a token id from `logits` (one per vocabulary entry). `history` holds the ids
    /// the repetition penalty applies to (each distinct id once); ids outside the
    /// vocabulary are ignored. The presence and frequency penalties need the generated
    /// output: see [`Sampler::sample_with_output`]; here they see none.
    ///
    /// Errors: [`Error::InvalidArgument`] for empty or all-NaN logits (greedy too).
    pub fn sample(&mut self, logits: &[f32], history: &[u32]) -> Result<u32> {
        self.sample_with_output(logits, history, &[])
    }

    /// As [`Sampler::sample`], with OpenAI's presence and frequency penalties over the
    /// tokens generated so far, `output` (OpenAI API reference, "Parameter details":
    /// `mu[j] -= c[j] · frequency_penalty + (c[j] > 0) · presence_penalty`, `c[j]` the
    /// count of token `j` in `output`); ids outside the vocabulary are ignored.
    ///
    /// Errors: [`Error::InvalidArgument`] for empty or all-NaN logits (greedy too).
    pub fn sample_with_output(
        &mut self,
        logits: &[f32],
        history: &[u32],
        output: &[u32],
    ) -> Result<u32> {
        self.penalise(logits, history, output)?;
        if self.config.is_greedy() {
            return greedy(&self.logits);
        }
        self.nucleus()?;
        let total: f32 = self.candidates.iter().map(|c| c.1).sum();
        let r = self.rng.random::<f32>() * total;
        Ok(pick(r, self.candidates.iter().copied()))
    }

    /// The distribution [`Sampler::sample_with_output`] draws from for the same `logits`,
    /// `history` and `output` (penalties, temperature, top-k, top-p), written densely into
    /// `probs`: one probability per vocabulary entry (`logits.len()`), 0 outside the kept
    /// tokens, summing to 1 up to rounding; one-hot at the argmax for greedy sampling. Draws
    /// nothing from the random stream. Speculative decoding (Leviathan et al. 2023) needs it
    /// for the target and the draft model alike.
    ///
    /// Errors: [`Error::InvalidArgument`] for empty or all-NaN logits.
    pub fn probabilities(
        &mut self,
        logits: &[f32],
        history: &[u32],
        output: &[u32],
        probs: &mut Vec<f32>,
    ) -> Result<()> {
        self.penalise(logits, history, output)?;
        probs.clear();
        probs.resize(logits.len(), 0.0);
        if self.config.is_greedy() {
            probs[greedy(&self.logits)? as usize] = 1.0;
            return Ok(());
        }
        self.nucleus()?;
        let total: f32 = self.candidates.iter().map(|c| c.1).sum();
        for &(id, p) in &self.candidates {
            probs[id as usize] = p / total;
        }
        Ok(())
    }

    /// Draws an index with probability proportional to `weights` (non-negative; NaN and
    /// negative entries count as 0) from this sampler's random stream.
    ///
    /// Errors: [`Error::InvalidArgument`] when no weight is positive.
    pub fn draw(&mut self, weights: &[f32]) -> Result<u32> {
        let total: f32 = weights.iter().filter(|w| **w > 0.0).sum();
        if !(total > 0.0 && total.is_finite()) {
            return Err(Error::InvalidArgument(
                "no positive finite weight to draw from".into(),
            ));
        }
        let r = self.rng.random::<f32>() * total;
        Ok(pick(r, (0u32..).zip(weights.iter().copied())))
    }

    /// A uniform draw from `[0, 1)` of this sampler's random stream.
    pub fn uniform(&mut self) -> f32 {
        self.rng.random::<f32>()
    }

    /// Copies `logits` into `self.logits` with the repetition penalty over `history` and
    /// the presence and frequency penalties over `output` applied.
    fn penalise(&mut self, logits: &[f32], history: &[u32], output: &[u32]) -> Result<()> {
        if logits.is_empty() {
            return Err(Error::InvalidArgument("no logits to sample from".into()));
        }
        self.logits.clear();
        self.logits.extend_from_slice(logits);
        let c = &self.config;
        if c.repeat_penalty != 1.0 {
            self.seen.clear();
            self.seen.extend_from_slice(history);
            self.seen.sort_unstable();
            self.seen.dedup();
            for &id in &self.seen {
                if let Some(l) = self.logits.get_mut(id as usize) {
                    *l = repetition_penalised(*l, c.repeat_penalty);
                }
            }
        }
        if c.presence_penalty != 0.0 || c.frequency_penalty != 0.0 {
            self.counts.clear();
            self.counts.resize(self.logits.len(), 0);
            for &id in output {
                if let Some(n) = self.counts.get_mut(id as usize) {
                    *n += 1;
                }
            }
            for (l, &n) in self.logits.iter_mut().zip(&self.counts) {
                *l = count_penalised(*l, n, c);
            }
        }
        Ok(())
    }

    /// Fills `self.candidates` as [`nucleus`] does from `self.logits`.
    fn nucleus(&mut self) -> Result<()> {
        nucleus(&self.logits, &self.config, &mut self.candidates)
    }
}

/// CTRL's repetition penalty of one logit (Keskar et al. 2019): `l / p` if positive, else
/// `l · p`.
fn repetition_penalised(l: f32, penalty: f32) -> f32 {
    if l > 0.0 {
        l / penalty
    } else {
        l * penalty
    }
}

/// OpenAI's presence and frequency penalties of one logit whose token occurs `count` times
/// in the output: `l − (count · frequency + presence)` when `count > 0`.
fn count_penalised(l: f32, count: u32, c: &SamplerConfig) -> f32 {
    if count > 0 {
        l - (count as f32 * c.frequency_penalty + c.presence_penalty)
    } else {
        l
    }
}

/// Fills `candidates` with the kept tokens of the penalised `logits` and their softmax
/// probabilities after temperature and top-k, cut by top-p (not renormalised), in the
/// order: larger scaled logit first, the lower id first on ties. The sums run in f32 in
/// that order.
///
/// Errors: [`Error::InvalidArgument`] when every logit is NaN.
fn nucleus(logits: &[f32], config: &SamplerConfig, candidates: &mut Vec<(u32, f32)>) -> Result<()> {
    let inv_t = 1.0 / config.temperature;
    candidates.clear();
    candidates.extend(
        logits
            .iter()
            .enumerate()
            .filter(|(_, l)| !l.is_nan())
            .map(|(i, &l)| (i as u32, l * inv_t)),
    );
    if candidates.is_empty() {
        return Err(all_nan());
    }
    // A total order (ties by id), so that a device sorting differently keeps the same list.
    let by_logit_desc = |a: &(u32, f32), b: &(u32, f32)| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0));
    let k = config.top_k;
    if k > 0 && k < candidates.len() {
        candidates.select_nth_unstable_by(k - 1, by_logit_desc);
        candidates.truncate(k);
    }
    candidates.sort_unstable_by(by_logit_desc);
    let max = candidates[0].1;
    let mut sum = 0.0f32;
    for c in candidates.iter_mut() {
        c.1 = (c.1 - max).exp();
        sum += c.1;
    }
    let mut cumulative = 0.0f32;
    let mut keep = candidates.len();
    for (i, c) in candidates.iter_mut().enumerate() {
        c.1 /= sum;
        cumulative += c.1;
        if cumulative >= config.top_p {
            keep = i + 1;
            break;
        }
    }
    candidates.truncate(keep);
    Ok(())
}

/// Words of the sampler state tensor of [`crate::Op::Sample`]: the ChaCha8 key (8 words),
/// then the position of the next word of the stream, a `u64` with its low word first.
pub const SAMPLER_STATE_WORDS: usize = 10;

/// The ChaCha8 key that rand_core 0.9's `SeedableRng::seed_from_u64` makes from `seed`:
/// eight outputs of PCG32 (O'Neill 2014; multiplier 6364136223846793005, increment
/// 11634580027462260723, the state advanced before each output), as little-endian words.
pub fn chacha8_key(seed: u64) -> [u32; 8] {
    const MUL: u64 = 6364136223846793005;
    const INC: u64 = 11634580027462260723;
    let mut state = seed;
    std::array::from_fn(|_| {
        state = state.wrapping_mul(MUL).wrapping_add(INC);
        let xorshifted = (((state >> 18) ^ state) >> 27) as u32;
        xorshifted.rotate_right((state >> 59) as u32)
    })
}

/// Block `counter` of ChaCha with 8 rounds (Bernstein 2008, "ChaCha, a variant of
/// Salsa20") under `key`: the input words are the constants "expand 32-byte k", the key,
/// the 64-bit block counter (low word first) and a zero 64-bit nonce, as rand_chacha's
/// `ChaCha8Rng` (stream 0) lays them out; the output is the 16 words after the rounds plus
/// the input.
pub fn chacha8_block(key: &[u32; 8], counter: u64) -> [u32; 16] {
    let mut input = [0u32; 16];
    input[..4].copy_from_slice(&[0x6170_7865, 0x3320_646e, 0x7962_2d32, 0x6b20_6574]);
    input[4..12].copy_from_slice(key);
    input[12] = counter as u32;
    input[13] = (counter >> 32) as u32;
    let mut x = input;
    let quarter = |x: &mut [u32; 16], a: usize, b: usize, c: usize, d: usize| {
        x[a] = x[a].wrapping_add(x[b]);
        x[d] = (x[d] ^ x[a]).rotate_left(16);
        x[c] = x[c].wrapping_add(x[d]);
        x[b] = (x[b] ^ x[c]).rotate_left(12);
        x[a] = x[a].wrapping_add(x[b]);
        x[d] = (x[d] ^ x[a]).rotate_left(8);
        x[c] = x[c].wrapping_add(x[d]);
        x[b] = (x[b] ^ x[c]).rotate_left(7);
    };
    for _ in 0..4 {
        quarter(&mut x, 0, 4, 8, 12);
        quarter(&mut x, 1, 5, 9, 13);
        quarter(&mut x, 2, 6, 10, 14);
        quarter(&mut x, 3, 7, 11, 15);
        quarter(&mut x, 0, 5, 10, 15);
        quarter(&mut x, 1, 6, 11, 12);
        quarter(&mut x, 2, 7, 8, 13);
        quarter(&mut x, 3, 4, 9, 14);
    }
    for (o, i) in x.iter_mut().zip(input) {
        *o = o.wrapping_add(i);
    }
    x
}

/// Word `pos` of the ChaCha8 stream under `key`: what the `pos`-th `next_u32` of a
/// `ChaCha8Rng` with that key returns (block `pos / 16`, word `pos % 16`).
pub fn chacha8_word(key: &[u32; 8], pos: u64) -> u32 {
    chacha8_block(key, pos / 16)[(pos % 16) as usize]
}

/// rand 0.9's `random::<f32>()` from one `u32` word: its 24 high bits times 2⁻²⁴, in
/// `[0, 1)`.
pub fn unit_f32(word: u32) -> f32 {
    (word >> 8) as f32 * (1.0 / (1u32 << 24) as f32)
}

/// The initial sampler state of [`crate::Op::Sample`] for `seed`
/// ([`SAMPLER_STATE_WORDS`]): the key of [`chacha8_key`], position 0.
pub fn sampler_state(seed: u64) -> [u32; SAMPLER_STATE_WORDS] {
    let mut state = [0u32; SAMPLER_STATE_WORDS];
    state[..8].copy_from_slice(&chacha8_key(seed));
    state
}

/// [`crate::Op::Sample`] on host slices: the token [`Sampler::sample_with_output`] picks
/// with `config` from `logits` (`[vocab]`), where `seen[j] != 0` marks the ids of its
/// `history` and `counts[j]` counts id `j` in its `output`, drawing (unless greedy) the
/// word at the position held in `state` ([`SAMPLER_STATE_WORDS`]) of the stream keyed
/// there. Then the sampled id is marked in `seen`, counted in `counts` (saturating) and
/// the position advanced by one word per draw, so that the next call continues as the
/// next [`Sampler::sample_with_output`] over the history and output that include it.
///
/// Errors: [`Error::InvalidArgument`] for empty logits, `seen` or `counts` not of the
/// logits' length, a `state` of another length, invalid parameters
/// ([`SamplerConfig::check`]), or logits that are all NaN (greedy sampling too).
pub fn sample_tensors(
    config: &SamplerConfig,
    logits: &[f32],
    seen: &mut [u32],
    counts: &mut [u32],
    state: &mut [u32],
) -> Result<u32> {
    config.check()?;
    let vocab = logits.len();
    if vocab == 0 || seen.len() != vocab || counts.len() != vocab {
        return Err(Error::InvalidArgument(format!(
            "sampling {vocab} logits with {} history flags and {} counts",
            seen.len(),
            counts.len()
        )));
    }
    let words = state.len();
    let state: &mut [u32; SAMPLER_STATE_WORDS] = state.try_into().map_err(|_| {
        Error::InvalidArgument(format!(
            "a sampler state of {words} words, not {SAMPLER_STATE_WORDS}"
        ))
    })?;
    let penalised: Vec<f32> = logits
        .iter()
        .zip(seen.iter().zip(counts.iter()))
        .map(|(&l, (&s, &n))| {
            let l = if s != 0 && config.repeat_penalty != 1.0 {
                repetition_penalised(l, config.repeat_penalty)
            } else {
                l
            };
            if config.presence_penalty != 0.0 || config.frequency_penalty != 0.0 {
                count_penalised(l, n, config)
            } else {
                l
            }
        })
        .collect();
    let id = if config.is_greedy() {
        greedy(&penalised)?
    } else {
        let mut candidates = Vec::new();
        nucleus(&penalised, config, &mut candidates)?;
        let total: f32 = candidates.iter().map(|c| c.1).sum();
        let key: [u32; 8] = std::array::from_fn(|i| state[i]);
        let pos = u64::from(state[8]) | (u64::from(state[9]) << 32);
        let r = unit_f32(chacha8_word(&key, pos)) * total;
        let next = pos.wrapping_add(1);
        state[8] = next as u32;
        state[9] = (next >> 32) as u32;
        pick(r, candidates.into_iter())
    };
    seen[id as usize] = 1;
    counts[id as usize] = counts[id as usize].saturating_add(1);
    Ok(id)
}

/// Sampling where the logits are ([`Op::Sample`]), for a decode loop whose logits stay on
/// a device: the history flags, the output counts, the random stream's state and the
/// sampled id live in that device's memory, so that each step's only copy is the sampled
/// id to the host. It picks the ids a [`Sampler`] with the same configuration picks (up to
/// the device's rounding, see [`Op::Sample`]).
pub struct DeviceSampler {
    config: SamplerConfig,
    /// In the device's memory: the state and the i32 `[1]` sampled id.
    state: SampleState,
    id: Data,
    /// i32 `[1]` in host memory: the sampled id's copy.
    host_id: Data,
}

/// An i32 tensor holding `words`.
fn word_tensor(words: &[u32]) -> Result<Data> {
    Data::from_bytes(DataType::I32, &[words.len()], bytemuck::cast_slice(words))
}

impl DeviceSampler {
    /// A sampler for logits of `vocab` entries in the memory of `location`, whose history
    /// (the repetition penalty's, as [`Sampler::sample_with_output`]'s `history`) starts as
    /// `history` and whose output starts empty; the stream is seeded by `config.seed`. Its
    /// state is copied there once (recorded as `"sampler: history"` and
    /// `"sampler: seed"`).
    ///
    /// Errors: invalid parameters ([`SamplerConfig::check`]); [`Error::InvalidArgument`]
    /// for an empty vocabulary; the executor's allocation and copy errors.
    pub fn new(
        exec: &Executor,
        config: &SamplerConfig,
        vocab: usize,
        location: Location,
        history: &[u32],
    ) -> Result<DeviceSampler> {
        config.check()?;
        if vocab == 0 {
            return Err(Error::InvalidArgument("sampling from no logits".into()));
        }
        let mut seen = vec![0u32; vocab];
        for &id in history {
            if let Some(s) = seen.get_mut(id as usize) {
                *s = 1;
            }
        }
        Ok(DeviceSampler {
            config: config.clone(),
            state: SampleState {
                seen: exec.to_device(&word_tensor(&seen)?, location, "sampler: history")?,
                counts: exec.zeros(DataType::I32, &[vocab], location)?,
                stream: exec.to_device(
                    &word_tensor(&sampler_state(config.seed))?,
                    location,
                    "sampler: seed",
                )?,
            },
            id: exec.zeros(DataType::I32, &[1], location)?,
            host_id: Data::zeros(DataType::I32, &[1])?,
        })
    }

    /// Samples the next token from `logits` (f32 `[1, vocab]` in the sampler's memory) on
    /// the device there, adds it to the history and output, and copies its id to the host
    /// (recorded as `"sampled id to host"`).
    ///
    /// Errors: those of [`Op::Sample`] (a host device's included); [`Error::InvalidArgument`]
    /// when every logit is NaN.
    pub fn sample(&mut self, exec: &Executor, logits: &Data) -> Result<u32> {
        exec.run(Op::Sample {
            logits,
            state: &mut self.state,
            output: &mut self.id,
            config: &self.config,
        })?;
        exec.copy_into(&self.id, &mut self.host_id, "sampled id to host")?;
        match self.host_id.as_i32()?[0] as u32 {
            u32::MAX => Err(all_nan()),
            id => Ok(id),
        }
    }
}

/// The first id whose cumulative weight exceeds `r` (drawn from `[0, Σ weights)`); when
/// rounding leaves `r` past the end, the last id of positive weight (0 if there is none).
fn pick(r: f32, weighted: impl Iterator<Item = (u32, f32)>) -> u32 {
    let mut acc = 0.0f32;
    let mut last = 0;
    for (id, w) in weighted {
        if w > 0.0 {
            acc += w;
            last = id;
            if r < acc {
                return id;
            }
        }
    }
    last
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sampler(temperature: f32, top_k: usize, top_p: f32, penalty: f32, seed: u64) -> Sampler {
        Sampler::new(SamplerConfig {
            temperature,
            top_k,
            top_p,
            repeat_penalty: penalty,
            seed,
            ..SamplerConfig::default()
        })
        .unwrap()
    }

    #[test]
    fn log_probabilities_equal_torch_log_softmax() {
        // torch.log_softmax in float64 of these logits, rounded to 6 places.
        let logits = [2.0, -1.5, 0.25, 3.5, 3.5, -20.0, 0.0];
        let torch = [
            -2.332405, -5.832405, -4.082405, -0.832405, -0.832405, -24.332405, -4.332405,
        ];
        for (id, want) in torch.iter().enumerate() {
            let got = log_softmax_top(&logits, id as u32, 0).unwrap();
            assert!((got.logprob - want).abs() < 1e-5, "{id}: {got:?}");
            assert!(got.top.is_empty());
        }
        let got = log_softmax_top(&logits, 5, 4).unwrap();
        let ids: Vec<u32> = got.top.iter().map(|t| t.0).collect();
        assert_eq!(ids, [3, 4, 0, 2], "ties keep the lower id first");
        for (id, lp) in got.top {
            assert!((lp - torch[id as usize]).abs() < 1e-5);
        }
        assert_eq!(log_softmax_top(&logits, 0, 100).unwrap().top.len(), 7);
        let mut nan = logits;
        nan[1] = f32::NAN;
        assert_eq!(
            log_softmax_top(&nan, 1, 0).unwrap().logprob,
            f32::NEG_INFINITY
        );
        assert!(log_softmax_top(&logits, 7, 1).is_err());
        assert!(log_softmax_top(&[], 0, 1).is_err());
        assert!(log_softmax_top(&[f32::NAN; 3], 0, 1).is_err());
    }

    #[test]
    fn presence_and_frequency_penalties_follow_openai() {
        // Logits 3.0, 2.5, 2.0; token 0 generated twice, token 1 once.
        let logits = [3.0, 2.5, 2.0];
        let with = |presence: f32, frequency: f32| {
            Sampler::new(SamplerConfig {
                presence_penalty: presence,
                frequency_penalty: frequency,
                ..SamplerConfig::default()
            })
            .unwrap()
        };
        // No output, no penalty.
        assert_eq!(with(2.0, 2.0).sample(&logits, &[]).unwrap(), 0);
        // Frequency 0.4: 3.0 − 0.8 = 2.2 beats 2.5 − 0.4 = 2.1 and 2.0.
        assert_eq!(
            with(0.0, 0.4)
                .sample_with_output(&logits, &[], &[0, 1, 0])
                .unwrap(),
            0
        );
        // Frequency 0.6: 3.0 − 1.2 = 1.8, 2.5 − 0.6 = 1.9, 2.0 untouched: token 2.
        assert_eq!(
            with(0.0, 0.6)
                .sample_with_output(&logits, &[], &[0, 1, 0])
                .unwrap(),
            2
        );
        // Presence 0.6 counts each token once: 2.4, 1.9, 2.0: token 0 still.
        assert_eq!(
            with(0.6, 0.0)
                .sample_with_output(&logits, &[], &[0, 1, 0])
                .unwrap(),
            0
        );
        // A negative presence penalty favours what was generated; ids beyond the
        // vocabulary are ignored.
        assert_eq!(
            with(-1.5, 0.0)
                .sample_with_output(&logits, &[], &[2, 9])
                .unwrap(),
            2
        );
        for bad in [2.5, -2.1, f32::NAN] {
            assert!(Sampler::new(SamplerConfig {
                presence_penalty: bad,
                ..SamplerConfig::default()
            })
            .is_err());
            assert!(Sampler::new(SamplerConfig {
                frequency_penalty: bad,
                ..SamplerConfig::default()
            })
            .is_err());
        }
    }

    #[test]
    fn greedy_is_argmax_and_penalty_follows_ctrl() {
        let logits = [1.0, 3.0, 2.9, -1.0];
        assert_eq!(
            sampler(0.0, 0, 1.0, 1.0, 0).sample(&logits, &[]).unwrap(),
            1
        );
        // 3.0 / 1.5 = 2.0 < 2.9: the penalised token loses.
        assert_eq!(
            sampler(0.0, 0, 1.0, 1.5, 0)
                .sample(&logits, &[1, 1])
                .unwrap(),
            2
        );
    }

    #[test]
    fn top_k_one_and_tiny_top_p_are_greedy() {
        let logits = [0.5, 0.1, 2.0, 1.9];
        for seed in 0..20 {
            assert_eq!(
                sampler(1.0, 1, 1.0, 1.0, seed)
                    .sample(&logits, &[])
                    .unwrap(),
                2
            );
            assert_eq!(
                sampler(1.0, 0, 1e-6, 1.0, seed)
                    .sample(&logits, &[])
                    .unwrap(),
                2
            );
        }
    }

    #[test]
    fn sampling_matches_softmax_frequencies_and_is_reproducible() {
        let logits = [0.0f32, (2.0f32).ln(), (5.0f32).ln()];
        let mut s = sampler(1.0, 0, 1.0, 1.0, 42);
        let mut counts = [0usize; 3];
        let draws: Vec<u32> = (0..8000).map(|_| s.sample(&logits, &[]).unwrap()).collect();
        for &d in &draws {
            counts[d as usize] += 1;
        }
        for (c, p) in counts.iter().zip([0.125, 0.25, 0.625]) {
            assert!((*c as f64 / 8000.0 - p).abs() < 0.02, "{counts:?}");
        }
        let mut again = sampler(1.0, 0, 1.0, 1.0, 42);
        let replay: Vec<u32> = (0..8000)
            .map(|_| again.sample(&logits, &[]).unwrap())
            .collect();
        assert_eq!(draws, replay);
    }

    #[test]
    fn probabilities_are_the_distribution_sample_draws_from() {
        let logits = [0.0f32, (2.0f32).ln(), (5.0f32).ln(), -30.0];
        let mut probs = Vec::new();
        sampler(1.0, 0, 1.0, 1.0, 0)
            .probabilities(&logits, &[], &[], &mut probs)
            .unwrap();
        let softmax_sum = 8.0 + (-30.0f32).exp();
        let expected = [1.0 / softmax_sum, 2.0 / softmax_sum, 5.0 / softmax_sum, 0.0];
        for (p, e) in probs.iter().zip(expected) {
            assert!((p - e).abs() < 1e-6, "{probs:?}");
        }
        // top-k 2 keeps ids 2 and 1, renormalised: 5/7 and 2/7.
        sampler(1.0, 2, 1.0, 1.0, 0)
            .probabilities(&logits, &[], &[], &mut probs)
            .unwrap();
        let expected = [0.0, 2.0 / 7.0, 5.0 / 7.0, 0.0];
        for (p, e) in probs.iter().zip(expected) {
            assert!((p - e).abs() < 1e-6, "{probs:?}");
        }
        // Greedy with a penalty: 3.0 / 1.5 = 2.0 < 2.9, one-hot at id 2.
        sampler(0.0, 0, 1.0, 1.5, 0)
            .probabilities(&[1.0, 3.0, 2.9, -1.0], &[1], &[], &mut probs)
            .unwrap();
        assert_eq!(probs, [0.0, 0.0, 1.0, 0.0]);
    }

    #[test]
    fn draw_follows_the_weights_and_refuses_no_mass() {
        let mut s = sampler(1.0, 0, 1.0, 1.0, 7);
        let weights = [0.0f32, 3.0, f32::NAN, 1.0, -2.0];
        let mut counts = [0usize; 5];
        for _ in 0..8000 {
            counts[s.draw(&weights).unwrap() as usize] += 1;
        }
        assert_eq!((counts[0], counts[2], counts[4]), (0, 0, 0), "{counts:?}");
        assert!(
            (counts[1] as f64 / 8000.0 - 0.75).abs() < 0.02,
            "{counts:?}"
        );
        assert!(s.draw(&[0.0, -1.0]).is_err());
        assert!(s.draw(&[]).is_err());
        let u = s.uniform();
        assert!((0.0..1.0).contains(&u));
    }

    #[test]
    fn chacha8_words_are_rand_chachas_stream() {
        use rand::RngCore;
        for seed in [0, 1, 42, u64::MAX, 0x0123_4567_89ab_cdef] {
            let mut rng = ChaCha8Rng::seed_from_u64(seed);
            let key = chacha8_key(seed);
            // Past rand_chacha's 64-word buffer, into its second and third refills.
            for pos in 0..200 {
                assert_eq!(
                    chacha8_word(&key, pos),
                    rng.next_u32(),
                    "seed {seed} word {pos}"
                );
            }
            let mut rng = ChaCha8Rng::seed_from_u64(seed);
            for pos in 0..100 {
                assert_eq!(unit_f32(chacha8_word(&key, pos)), rng.random::<f32>());
            }
        }
        // A counter past 2³² words: the block counter's high word.
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        let pos = (1u64 << 36) + 5;
        rng.set_word_pos(u128::from(pos));
        assert_eq!(chacha8_word(&chacha8_key(7), pos), rng.next_u32());
    }

    /// Logits with ties, −∞, NaN and a wide range, from a fixed stream.
    fn test_logits(seed: u64, vocab: usize) -> Vec<f32> {
        let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x5eed);
        (0..vocab)
            .map(|i| match rng.random_range(0..40) {
                0 => f32::NAN,
                1 => f32::NEG_INFINITY,
                2..=5 => 1.5,
                _ => rng.random_range(-8.0f32..8.0) + (i % 3) as f32,
            })
            .collect()
    }

    #[test]
    fn the_op_on_tensors_picks_the_samplers_ids() {
        let configs = [
            (0.0, 0, 1.0, 1.0, 0.0, 0.0),
            (0.0, 0, 1.0, 1.3, 0.5, 0.2),
            (1.0, 0, 1.0, 1.0, 0.0, 0.0),
            (0.7, 40, 1.0, 1.0, 0.0, 0.0),
            (0.8, 0, 0.9, 1.1, 0.0, 0.0),
            (1.3, 5, 0.5, 1.2, 0.4, -0.3),
            (0.5, 1, 1.0, 0.8, -1.0, 1.0),
            (2.0, 200, 0.95, 1.0, 0.0, 0.6),
        ];
        for (c, &(temperature, top_k, top_p, repeat_penalty, presence, frequency)) in
            configs.iter().enumerate()
        {
            for seed in 0..12u64 {
                let config = SamplerConfig {
                    temperature,
                    top_k,
                    top_p,
                    repeat_penalty,
                    seed,
                    presence_penalty: presence,
                    frequency_penalty: frequency,
                };
                let vocab = 97 + seed as usize * 13;
                let mut host = Sampler::new(config.clone()).unwrap();
                let mut history: Vec<u32> = (0..7)
                    .map(|i| (i * 31 + seed as u32) % vocab as u32)
                    .collect();
                let prompt = history.len();
                let (mut seen, mut counts) = (vec![0u32; vocab], vec![0u32; vocab]);
                for &id in &history {
                    seen[id as usize] = 1;
                }
                let mut state = sampler_state(seed);
                for step in 0..30 {
                    let logits = test_logits(seed * 100 + step, vocab);
                    let want = host
                        .sample_with_output(&logits, &history, &history[prompt..])
                        .unwrap();
                    let got = sample_tensors(&config, &logits, &mut seen, &mut counts, &mut state)
                        .unwrap();
                    assert_eq!(got, want, "config {c}, seed {seed}, step {step}");
                    history.push(got);
                }
                let draws = if config.is_greedy() { 0 } else { 30 };
                assert_eq!((state[8], state[9]), (draws, 0));
                assert_eq!(counts.iter().sum::<u32>(), 30);
            }
        }
        let config = SamplerConfig {
            temperature: 1.0,
            ..SamplerConfig::default()
        };
        let mut state = sampler_state(0);
        let err = |logits: &[f32], seen: &mut [u32], state: &mut [u32]| {
            sample_tensors(
                &config,
                logits,
                seen,
                &mut [0; 2][..seen.len().min(2)],
                state,
            )
            .is_err()
        };
        assert!(err(&[f32::NAN; 2], &mut [0; 2], &mut state));
        assert!(err(&[1.0; 2], &mut [0; 1], &mut state));
        assert!(err(&[1.0; 2], &mut [0; 2], &mut state[..9]));
        assert!(err(&[], &mut [], &mut state));
    }

    /// Every mode refuses all-NaN logits with the same error: greedy no longer picks id 0.
    #[test]
    fn all_nan_logits_are_an_error_in_every_mode() {
        let nan = [f32::NAN; 4];
        for temperature in [0.0, 0.8] {
            let mut s = sampler(temperature, 0, 1.0, 1.3, 7);
            let err = s.sample(&nan, &[1]).unwrap_err();
            assert_eq!(err.to_string(), all_nan().to_string(), "T={temperature}");
            let mut probs = Vec::new();
            assert!(s.probabilities(&nan, &[], &[], &mut probs).is_err());
            let config = s.config().clone();
            let (mut seen, mut counts) = ([0u32; 4], [0u32; 4]);
            let mut state = sampler_state(0);
            let err = sample_tensors(&config, &nan, &mut seen, &mut counts, &mut state);
            assert!(err.is_err(), "T={temperature}");
            assert_eq!((seen, counts), ([0; 4], [0; 4]), "nothing is recorded");
        }
        // One real logit among NaNs is still picked.
        let mut one = nan;
        one[2] = -5.0;
        assert_eq!(sampler(0.0, 0, 1.0, 1.0, 0).sample(&one, &[]).unwrap(), 2);
        assert_eq!(sampler(0.8, 0, 1.0, 1.0, 0).sample(&one, &[]).unwrap(), 2);
    }

    #[test]
    fn invalid_parameters_are_rejected() {
        let bad = |t: f32, p: f32, r: f32| {
            Sampler::new(SamplerConfig {
                temperature: t,
                top_p: p,
                repeat_penalty: r,
                ..SamplerConfig::default()
            })
            .is_err()
        };
        assert!(bad(-1.0, 1.0, 1.0));
        assert!(bad(f32::NAN, 1.0, 1.0));
        assert!(bad(1.0, 0.0, 1.0));
        assert!(bad(1.0, 1.5, 1.0));
        assert!(bad(1.0, 1.0, 0.0));
    }
}
