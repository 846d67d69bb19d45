//! `flm bench --tp N` (or under `mpirun`): prefill and decode of a model split among
//! tensor-parallel ranks, with the share of rank 0's time spent in the ranks' collectives (the
//! all-reduces and the logits' gather, waiting for the slowest rank included).

use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use flm_models::Logits;

use crate::bench::{source, BenchArgs};
use crate::device::Chosen;
use crate::split::{split, Part};

/// Measures `args`' tests on the model split among `args.tp` ranks sharing `threads`, or
/// among the processes of an MPI job of `threads` threads each.
pub fn run(args: &BenchArgs, positions: usize, chosen: &Chosen, threads: usize) -> Result<()> {
    let (config, weights, name, dtype) = source(args, positions)?;
    let model = match split(&config, &weights, args.tp, threads, chosen)? {
        Part::Rank0(model) => model,
        Part::Served => return Ok(()),
        Part::Whole => bail!("the tensor-parallel bench needs --tp or mpirun"),
    };
    drop(weights);
    let tp = model
        .tensor_parallel()
        .context("a split model is a tensor-parallel one")?;
    let exec = &chosen.exec;
    let mut m = model.instance()?;
    let vocab = config.vocab_size as u64;
    let prompt: Vec<u32> = (0..args.prompt_tokens as u64)
        .map(|i| ((i * 2_654_435_761) % vocab) as u32)
        .collect();
    // Seconds and seconds in collectives of `f`.
    let timed = |f: &mut dyn FnMut() -> Result<()>| -> Result<(f64, f64)> {
        let (start, comm) = (Instant::now(), tp.time_in_collectives());
        f()?;
        let spent: Duration = tp.time_in_collectives() - comm;
        Ok((start.elapsed().as_secs_f64(), spent.as_secs_f64()))
    };
    let mut runs = Vec::new();
    for rep in 0..=args.reps {
        let pp = timed(&mut || {
            m.forward(exec, &prompt, 0, Logits::Last)?;
            Ok(())
        })?;
        let tg = timed(&mut || {
            let mut next = prompt[0];
            for g in 0..args.gen_tokens {
                next = flm_core::argmax(m.forward(exec, &[next], g, Logits::Last)?);
            }
            Ok(())
        })?;
        // The first is the warm-up.
        if rep > 0 {
            runs.push((pp, tg));
        }
    }
    /// Seconds, and seconds in collectives, of a prefill and of a decode.
    type Rep = ((f64, f64), (f64, f64));
    let mean = |f: &dyn Fn(&Rep) -> f64| runs.iter().map(f).sum::<f64>() / runs.len() as f64;
    let pp = args.prompt_tokens as f64 / mean(&|r| r.0 .0);
    let tg = args.gen_tokens as f64 / mean(&|r| r.1 .0);
    let pp_comm = mean(&|r| r.0 .1) / mean(&|r| r.0 .0);
    let tg_comm = mean(&|r| r.1 .1) / mean(&|r| r.1 .0);
    if args.json {
        let line = serde_json::json!({
            "model": name,
            "dtype": dtype,
            "tp": tp.ranks(),
            "threads": threads,
            "prompt_tokens": args.prompt_tokens,
            "gen_tokens": args.gen_tokens,
            "reps": args.reps,
            "prefill_tok_s": pp,
            "decode_tok_s": tg,
            "prefill_collective_share": pp_comm,
            "decode_collective_share": tg_comm,
        });
        println!("{line}");
    } else {
        // Local ranks share the threads; an MPI job's processes each have theirs.
        let per_rank = match args.tp {
            1 => threads,
            n => (threads / n).max(1),
        };
        println!(
            "model {name} ({dtype}) split among {} ranks of {per_rank} threads each, {} repetitions",
            tp.ranks(),
            args.reps
        );
        println!(
            "| test | tokens/s | in collectives |\n|---|---|---|\n| pp{} | {pp:.2} | {:.1}% |\n| tg{} | {tg:.2} | {:.1}% |",
            args.prompt_tokens,
            100.0 * pp_comm,
            args.gen_tokens,
            100.0 * tg_comm
        );
    }
    Ok(())
}
