//! The batched forward pass over a paged KV cache (`LlamaBatch`) against the single-sequence
//! `Llama::forward` on the shipped stories260K, bit for bit: sequences at different positions, mixing
//! prefill chunks and decode rows in one batch, block tables scattered over the pool.

use flm_core::{DataType, PagedKvCache};
use flm_models::BatchSeq;
use flm_tests::{assert_batched_equals_single, batch_invariant_executor as exec, stories260k};

/// A sequence of the test: its tokens and the chunks it runs in, step by step (`0`: it sits
/// this step out).
struct Script {
    tokens: Vec<u32>,
    chunks: Vec<usize>,
}

#[test]
fn batched_forward_equals_single_sequence_forward() {
    let (model, tokenizer) = stories260k(Some(256));
    let c = model.config().clone();
    let exec = exec();
    let encode = |s: &str| tokenizer.encode(s, true).unwrap();
    let mut a = encode("Once upon a time, there was a little girl named Lily.");
    a.truncate(13);
    let b = encode("Tom had a big red ball");
    let mut long = encode(
        "The sun was shining and the birds were singing. The little dog ran to the park \
         to play with his friends, and they had so much fun together all day long.",
    );
    long.truncate(40);
    let scripts = [
        // A prefill in two chunks, then decode rows.
        Script {
            tokens: a.clone(),
            chunks: vec![7, 4, 1, 1],
        },
        // Joins late, one chunk, then decodes.
        Script {
            tokens: b.clone(),
            chunks: vec![0, b.len() - 2, 1, 1],
        },
        // Decodes from its first token on, beside the prefills.
        Script {
            tokens: vec![1, 403, 407, 261],
            chunks: vec![1, 1, 1, 1],
        },
        // A long prefill in chunks of odd sizes.
        Script {
            tokens: long.clone(),
            chunks: vec![19, 0, 17, 4],
        },
    ];
    let block_size = 5;
    let mut kv =
        PagedKvCache::new(c.n_layers, 40, block_size, c.kv_widths(), DataType::F32).unwrap();
    // Block tables taken in an interleaved order, so that no sequence's blocks are adjacent.
    let tables: Vec<Vec<u32>> = scripts
        .iter()
        .map(|s| {
            let blocks = kv.blocks_for(s.tokens.len());
            (0..blocks)
                .map(|_| kv.allocator_mut().alloc().unwrap())
                .collect()
        })
        .collect();
    let mut batch = model.batch(4).unwrap();
    let seqs: Vec<(&[u32], &[usize])> = scripts
        .iter()
        .map(|s| (&s.tokens[..], &s.chunks[..]))
        .collect();
    assert_batched_equals_single(
        &model,
        &exec,
        batch.as_mut(),
        &mut kv,
        &seqs,
        &tables,
        "stories260K",
    );
}

#[test]
fn batched_forward_rejects_bad_batches() {
    let (model, _) = stories260k(Some(64));
    let c = model.config().clone();
    let exec = exec();
    let mut kv = PagedKvCache::new(c.n_layers, 4, 16, c.kv_widths(), DataType::F32).unwrap();
    let mut batch = model.batch(1).unwrap();
    let blocks = [0u32];
    let seq = |tokens: &'static [u32], start_pos: usize, blocks: &'static [u32]| BatchSeq {
        tokens,
        start_pos,
        blocks,
    };
    assert!(batch.forward(&exec, &mut kv, &[]).is_err());
    assert!(batch.forward(&exec, &mut kv, &[seq(&[], 0, &[0])]).is_err());
    assert!(batch
        .forward(&exec, &mut kv, &[seq(&[100_000], 0, &[0])])
        .is_err());
    // Position 16 needs a second block.
    assert!(batch
        .forward(&exec, &mut kv, &[seq(&[1], 16, &[0])])
        .is_err());
    // Beyond the context of 64.
    assert!(batch
        .forward(&exec, &mut kv, &[seq(&[1], 64, &[0, 1, 2, 3])])
        .is_err());
    // A block outside the pool.
    assert!(batch
        .forward(&exec, &mut kv, &[seq(&[1], 0, &[9])])
        .is_err());
    batch
        .forward(
            &exec,
            &mut kv,
            &[BatchSeq {
                tokens: &[1, 2],
                start_pos: 0,
                blocks: &blocks,
            }],
        )
        .unwrap();
}
