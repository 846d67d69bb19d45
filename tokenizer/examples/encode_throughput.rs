//! Encode throughput of one tokenizer file on one text file, for comparison with other
//! tokenizer libraries on the same text: prints the median and best MB/s of several runs
//! on one thread and writes the ids as little-endian u32 so that they can be compared
//! byte for byte with the reference library's.
//!
//! ```text
//! cargo run --release -p flm-tokenizer --example encode_throughput -- \
//!     TOKENIZER TEXT [RUNS] [CHUNK_BYTES] [IDS_OUT]
//! ```
//!
//! `CHUNK_BYTES` (default 0: the whole text in one call) cuts the text after the line
//! that reaches that many bytes, each chunk encoded by its own call without BOS, as a
//! retrieval pipeline encodes its documents.

use std::io::Write;
use std::path::Path;
use std::time::Instant;

use flm_tokenizer::Tokenizer;

/// The text cut after the first line end at or past each `size` bytes; whole if 0.
fn chunks(text: &str, size: usize) -> Vec<&str> {
    if size == 0 {
        return vec![text];
    }
    let mut out = Vec::new();
    let mut rest = text;
    while !rest.is_empty() {
        let mut end = size.min(rest.len());
        while !rest.is_char_boundary(end) {
            end += 1;
        }
        let end = rest[end..].find('\n').map_or(rest.len(), |i| end + i + 1);
        out.push(&rest[..end]);
        rest = &rest[end..];
    }
    out
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [tokenizer, text, rest @ ..] = &args[..] else {
        return Err(
            "usage: encode_throughput TOKENIZER TEXT [RUNS] [CHUNK_BYTES] [IDS_OUT]".into(),
        );
    };
    let runs: usize = rest.first().map_or(Ok(5), |s| s.parse())?;
    let chunk: usize = rest.get(1).map_or(Ok(0), |s| s.parse())?;
    let tok = Tokenizer::from_file(Path::new(tokenizer))?;
    let text = std::fs::read_to_string(text)?;
    let parts = chunks(&text, chunk);
    let mut ids = Vec::new();
    let mut seconds = Vec::with_capacity(runs);
    for _ in 0..runs.max(1) {
        ids.clear();
        let start = Instant::now();
        for part in &parts {
            ids.extend(tok.encode(part, false)?);
        }
        seconds.push(start.elapsed().as_secs_f64());
    }
    seconds.sort_by(f64::total_cmp);
    let mb = text.len() as f64 / 1e6;
    println!(
        "{mb:.1} MB in {} call(s), {} ids: median {:.2} MB/s, best {:.2} MB/s",
        parts.len(),
        ids.len(),
        mb / seconds[seconds.len() / 2],
        mb / seconds[0]
    );
    if let Some(path) = rest.get(2) {
        let mut out = std::io::BufWriter::new(std::fs::File::create(path)?);
        for id in &ids {
            out.write_all(&id.to_le_bytes())?;
        }
        out.flush()?;
    }
    Ok(())
}
