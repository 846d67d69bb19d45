//! llama.cpp's file of a base model's log-probabilities (`llama-perplexity
//! --kl-divergence-base FILE`), read and written byte for byte as
//! `tools/perplexity/perplexity.cpp` does, so that a file from either tool serves both.
//!
//! Layout, little-endian: the 8 bytes `_logits_`; `n_ctx`, `n_vocab`, `n_chunk` (i32);
//! the `n_chunk · n_ctx` token ids of the text (i32, as tokenized, BOS not substituted);
//! then for each chunk, for each of its `n_ctx − 1 − n_ctx/2` scored positions, a row of
//! `nv = 2·⌈n_vocab/2⌉ + 4` u16: the f32 `scale` and f32 `min_log_prob`, then one code per
//! token (the row padded to an even count), where `ln p(i) ≈ scale · code(i) +
//! min_log_prob`. The codes cover the 16 nats below the most likely token; anything less
//! likely has code 0.

use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};

use flm_core::PartialFile;

use crate::{Error, Result};

const MAGIC: &[u8; 8] = b"_logits_";

/// u16 per row for a vocabulary of `vocab` tokens (llama.cpp's `nv`).
fn row_len(vocab: usize) -> usize {
    vocab.div_ceil(2) * 2 + 4
}

/// Scored positions per chunk of `ctx` tokens (llama.cpp's `n_ctx − 1 − first`).
pub(super) fn scored_per_chunk(ctx: usize) -> usize {
    ctx - 1 - ctx / 2
}

/// One row of base log-probabilities, as stored.
#[derive(Debug, Clone, Default)]
pub struct LogProbRow {
    scale: f32,
    min_log_prob: f32,
    codes: Vec<u16>,
}

impl LogProbRow {
    /// `ln p(token)` as the row stores it, in f32 (`scale · code + min_log_prob`).
    pub fn log_prob(&self, token: usize) -> f32 {
        self.scale * f32::from(self.codes[token]) + self.min_log_prob
    }

    /// Tokens of the row's vocabulary.
    pub fn vocab(&self) -> usize {
        self.codes.len()
    }

    /// The row of `logits` (`[vocab]` f32), encoded as llama.cpp's `log_softmax` does.
    pub fn encode(logits: &[f32]) -> LogProbRow {
        let max = logits.iter().fold(logits[0], |m, &v| m.max(v));
        let min = logits
            .iter()
            .fold(logits[0], |m, &v| m.min(v))
            .max(max - 16.0);
        // f32 exponentials summed in f64, then the log in f32, as perplexity.cpp does.
        let sum: f64 = logits.iter().map(|&v| f64::from((v - max).exp())).sum();
        let log_sum_exp = sum.ln() as f32;
        let scale = (max - min) / 65535.0;
        let codes = if scale != 0.0 {
            let inverse = 1.0 / scale;
            logits
                .iter()
                .map(|&v| {
                    // Rounds half to even, as llama.cpp's `nearest_int`; at most 65535.
                    if v > min {
                        (inverse * (v - min)).round_ties_even().min(65535.0) as u16
                    } else {
                        0
                    }
                })
                .collect()
        } else {
            vec![0; logits.len()]
        };
        LogProbRow {
            scale,
            min_log_prob: min - max - log_sum_exp,
            codes,
        }
    }
}

/// Writes a log-probability file; it takes its name only when [`LogProbWriter::finish`]
/// has written every row.
pub struct LogProbWriter {
    out: BufWriter<PartialFile>,
    path: PathBuf,
    rows_left: usize,
    bytes: Vec<u8>,
}

impl LogProbWriter {
    /// Starts the file at `path` for `tokens` (`n_chunk · ctx` ids) cut into chunks of
    /// `ctx` over a vocabulary of `vocab`.
    ///
    /// Errors: [`Error::Config`] for sizes the format cannot hold, [`Error::Io`].
    pub fn create(path: &Path, ctx: usize, vocab: usize, tokens: &[u32]) -> Result<LogProbWriter> {
        let io = |source| Error::Io {
            path: path.to_path_buf(),
            source,
        };
        let i32_of = |v: usize, what: &str| {
            i32::try_from(v).map_err(|_| {
                Error::Config(format!("{what} {v} does not fit the log-probability file"))
            })
        };
        if ctx < 4 || !tokens.len().is_multiple_of(ctx) {
            return Err(Error::Config(format!(
                "log-probability files hold whole chunks of at least 4 tokens: {} tokens in \
                 chunks of {ctx}",
                tokens.len()
            )));
        }
        let chunks = tokens.len() / ctx;
        let mut header = MAGIC.to_vec();
        for v in [
            i32_of(ctx, "a context of")?,
            i32_of(vocab, "a vocabulary of")?,
            i32_of(chunks, "a count of chunks")?,
        ] {
            header.extend_from_slice(&v.to_le_bytes());
        }
        for &t in tokens {
            header.extend_from_slice(&i32_of(t as usize, "the token id")?.to_le_bytes());
        }
        let mut out = BufWriter::new(PartialFile::create(path).map_err(io)?);
        out.write_all(&header).map_err(io)?;
        Ok(LogProbWriter {
            out,
            path: path.to_path_buf(),
            rows_left: chunks * scored_per_chunk(ctx),
            bytes: Vec::with_capacity(row_len(vocab) * 2),
        })
    }

    /// Writes the next scored position's row, from its logits (`[vocab]` f32).
    ///
    /// Errors: [`Error::State`] past the last row, [`Error::Io`].
    pub fn add(&mut self, logits: &[f32]) -> Result<()> {
        if self.rows_left == 0 {
            return Err(Error::State(
                "every row of the log-probability file is written".into(),
            ));
        }
        let row = LogProbRow::encode(logits);
        self.bytes.clear();
        self.bytes.extend_from_slice(&row.scale.to_le_bytes());
        self.bytes
            .extend_from_slice(&row.min_log_prob.to_le_bytes());
        for &c in &row.codes {
            self.bytes.extend_from_slice(&c.to_le_bytes());
        }
        self.bytes.resize(row_len(logits.len()) * 2, 0);
        self.out
            .write_all(&self.bytes)
            .map_err(|source| Error::Io {
                path: self.path.clone(),
                source,
            })?;
        self.rows_left -= 1;
        Ok(())
    }

    /// Names the complete file.
    ///
    /// Errors: [`Error::State`] when rows are missing, [`Error::Io`].
    pub fn finish(self) -> Result<()> {
        if self.rows_left != 0 {
            return Err(Error::State(format!(
                "{} rows of the log-probability file are missing",
                self.rows_left
            )));
        }
        let io = |source| Error::Io {
            path: self.path.clone(),
            source,
        };
        let file = self.out.into_inner().map_err(|e| io(e.into_error()))?;
        file.persist().map_err(io)
    }
}

/// Reads a log-probability file, row by row.
pub struct LogProbReader {
    input: BufReader<File>,
    path: PathBuf,
    ctx: usize,
    vocab: usize,
    tokens: Vec<u32>,
    bytes: Vec<u8>,
}

impl LogProbReader {
    /// Opens `path` and reads its header and tokens, checking that the file's length is
    /// what they announce.
    ///
    /// Errors: [`Error::Io`]; [`Error::Format`] for a file that is not one (magic, sizes,
    /// a token outside the vocabulary, a length that disagrees).
    pub fn open(path: &Path) -> Result<LogProbReader> {
        let io = |source| Error::Io {
            path: path.to_path_buf(),
            source,
        };
        let bad = |msg: String| Error::format(path, msg);
        let file = File::open(path).map_err(io)?;
        let length = file.metadata().map_err(io)?.len();
        let mut input = BufReader::new(file);
        let mut head = [0u8; 20];
        input
            .read_exact(&mut head)
            .map_err(|_| bad("too short for a log-probability file".into()))?;
        if &head[..8] != MAGIC {
            return Err(bad(
                "not a log-probability file (no `_logits_` at its start)".into(),
            ));
        }
        let field = |i: usize| i32::from_le_bytes(head[8 + 4 * i..12 + 4 * i].try_into().unwrap());
        let (ctx, vocab, chunks) = (field(0), field(1), field(2));
        let positive = |v: i32, what: &str| {
            usize::try_from(v)
                .ok()
                .filter(|&v| v > 0)
                .ok_or_else(|| bad(format!("its {what} is {v}")))
        };
        let (ctx, vocab, chunks) = (
            positive(ctx, "context")?,
            positive(vocab, "vocabulary")?,
            positive(chunks, "count of chunks")?,
        );
        if ctx < 4 {
            return Err(bad(format!("its context is {ctx}, less than 4")));
        }
        let want = (chunks as u64)
            .checked_mul(ctx as u64)
            .and_then(|n| n.checked_mul(4))
            .and_then(|t| {
                let rows = (chunks as u64).checked_mul(scored_per_chunk(ctx) as u64)?;
                rows.checked_mul(row_len(vocab) as u64 * 2)?
                    .checked_add(t)?
                    .checked_add(20)
            });
        if want != Some(length) {
            return Err(bad(format!(
                "{length} bytes where {chunks} chunks of {ctx} tokens over a vocabulary of \
                 {vocab} take {}",
                want.map_or("more than 2^64".into(), |w| w.to_string())
            )));
        }
        let mut raw = vec![0u8; chunks * ctx * 4];
        input.read_exact(&mut raw).map_err(io)?;
        let tokens = raw
            .chunks_exact(4)
            .map(|b| i32::from_le_bytes(b.try_into().unwrap()))
            .map(|t| {
                u32::try_from(t)
                    .ok()
                    .filter(|&t| (t as usize) < vocab)
                    .ok_or_else(|| bad(format!("token {t} is outside its vocabulary of {vocab}")))
            })
            .collect::<Result<Vec<u32>>>()?;
        Ok(LogProbReader {
            input,
            path: path.to_path_buf(),
            ctx,
            vocab,
            tokens,
            bytes: vec![0; row_len(vocab) * 2],
        })
    }

    /// Tokens per chunk.
    pub fn ctx(&self) -> usize {
        self.ctx
    }

    /// Tokens of the base model's vocabulary.
    pub fn vocab(&self) -> usize {
        self.vocab
    }

    /// The text's token ids, `chunks · ctx` of them.
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// Reads the next row into `row`.
    ///
    /// Errors: [`Error::Io`] (the length was checked: a short read means the file changed).
    pub fn next_row(&mut self, row: &mut LogProbRow) -> Result<()> {
        self.input
            .read_exact(&mut self.bytes)
            .map_err(|source| Error::Io {
                path: self.path.clone(),
                source,
            })?;
        let f32_at = |i: usize| f32::from_le_bytes(self.bytes[i..i + 4].try_into().unwrap());
        row.scale = f32_at(0);
        row.min_log_prob = f32_at(4);
        row.codes.clear();
        row.codes.extend(
            self.bytes[8..8 + 2 * self.vocab]
                .chunks_exact(2)
                .map(|b| u16::from_le_bytes([b[0], b[1]])),
        );
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_round_trip_within_a_code() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("base.kld");
        let tokens: Vec<u32> = (0..16).map(|i| i % 5).collect();
        let rows: Vec<Vec<f32>> = (0..6)
            .map(|r| {
                (0..5)
                    .map(|i| (i * 7 + r * 3) as f32 % 11.0 - 20.0 * (i == 4) as u8 as f32)
                    .collect()
            })
            .collect();
        let mut writer = LogProbWriter::create(&path, 8, 5, &tokens).unwrap();
        for r in &rows {
            writer.add(r).unwrap();
        }
        assert!(writer.add(&rows[0]).is_err());
        writer.finish().unwrap();
        let mut reader = LogProbReader::open(&path).unwrap();
        assert_eq!(
            (reader.ctx(), reader.vocab(), reader.tokens()),
            (8, 5, &tokens[..])
        );
        let mut row = LogProbRow::default();
        for r in &rows {
            reader.next_row(&mut row).unwrap();
            let lse = log_sum_exp(r);
            let max = r.iter().fold(f32::MIN, |m, &v| m.max(v));
            for (i, &v) in r.iter().enumerate() {
                let exact = (v as f64 - lse) as f32;
                // Codes step 16/65535 nats; below 16 nats under the best the row says 16.
                if v > max - 16.0 {
                    assert!(
                        (row.log_prob(i) - exact).abs() < 2e-4,
                        "{i}: {} {exact}",
                        row.log_prob(i)
                    );
                } else {
                    assert!(row.log_prob(i) >= exact);
                }
            }
        }
        assert!(reader.next_row(&mut row).is_err());
    }

    fn log_sum_exp(row: &[f32]) -> f64 {
        super::super::log_sum_exp(row)
    }

    #[test]
    fn malformed_files_are_refused_with_their_fault() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("bad.kld");
        let mut writer = LogProbWriter::create(&path, 4, 3, &[0, 1, 2, 0]).unwrap();
        writer.add(&[0.0, 1.0, 2.0]).unwrap();
        writer.finish().unwrap();
        let good = std::fs::read(&path).unwrap();
        let cases: Vec<(Vec<u8>, &str)> = vec![
            (good[..10].to_vec(), "too short"),
            (
                [b"_logitz_", &good[8..]].concat(),
                "not a log-probability file",
            ),
            (good[..good.len() - 1].to_vec(), "bytes where"),
            ([&good[..], &[0]].concat(), "bytes where"),
            (
                [&good[..20], &7i32.to_le_bytes(), &good[24..]].concat(),
                "outside its vocabulary",
            ),
            (
                [&good[..8], &(-4i32).to_le_bytes(), &good[12..]].concat(),
                "context is -4",
            ),
            (
                [&good[..16], &i32::MAX.to_le_bytes(), &good[20..]].concat(),
                "bytes where",
            ),
        ];
        for (bytes, says) in cases {
            std::fs::write(&path, &bytes).unwrap();
            let e = LogProbReader::open(&path).err().expect(says).to_string();
            assert!(e.contains(says), "{says}: {e}");
        }
    }
}
