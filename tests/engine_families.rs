//! The batched forward pass over a paged KV cache (`LlamaBatch`, what the serving engine
//! runs) against `Model::forward` of each sequence alone, bit for bit, for every family on
//! the Llama graph: ChatGLM2/3 and GLM-4 (chatglm.cpp's test models, with and without a
//! p-tuning v2 prefix), Baichuan-7B and Baichuan-13B (ALiBi), InternLM, Llama 3, Mistral
//! (sliding window), Qwen2, Qwen3, Phi-3, Mixtral, Qwen3-MoE and DeepSeek-V2/V3 (routed
//! experts; each expert runs over the rows of every sequence routed to it; DeepSeek's
//! latent attention over a paged cache of latents) (transformers' tiny checkpoints), and
//! an act-order GPTQ checkpoint (int4 with input permutations).
//! ChatGLM-6B is refused by the engine.

use std::path::Path;

use flm_core::{DataType, PagedKvCache};
use flm_models::engine::{Engine, EngineConfig};
use flm_models::import;
use flm_models::{Error, SharedModel};
use flm_tests::glm_data::{write_hf_dir, Family, MODELS};
use flm_tests::{
    assert_batched_equals_single, batch_invariant_executor, cpu_executor, data, ids, json,
    HF_FAMILIES,
};

/// Runs two sequences through one batch in steps of the given chunk sizes (0: the sequence
/// sits the step out), and each alone through `Model::forward`; the logits must be equal.
fn batched_equals_single(model: &SharedModel, seqs: [(&[u32], &[usize]); 2], what: &str) {
    let c = model.config();
    let exec = batch_invariant_executor();
    let block_size = 3;
    let positions: usize = seqs.iter().map(|s| c.pre_seq_len + s.0.len()).sum();
    let mut kv = PagedKvCache::new(
        c.n_layers,
        positions,
        block_size,
        c.kv_widths(),
        DataType::F32,
    )
    .unwrap();
    let mut batch = model.batch(1).unwrap();
    let mut tables = Vec::new();
    for (tokens, _) in &seqs {
        let n = kv.blocks_for(c.pre_seq_len + tokens.len());
        let table: Vec<u32> = (0..n)
            .map(|_| kv.allocator_mut().alloc().unwrap())
            .collect();
        batch.write_prefix(&exec, &mut kv, &table).unwrap();
        tables.push(table);
    }
    assert_batched_equals_single(model, &exec, batch.as_mut(), &mut kv, &seqs, &tables, what);
}

#[test]
fn chatglm_cpp_families_batch_exactly() {
    // ChatGLM-6B is refused by the engine (`chatglm_6b_is_refused_by_the_engine`).
    let models = MODELS.into_iter().filter(|&(_, f, _)| f != Family::Glm);
    for (file, family, prefix) in models {
        let dir = tempfile::tempdir().unwrap();
        let steps = write_hf_dir(file, family, prefix, dir.path());
        let tokens: Vec<u32> = steps.iter().flat_map(|s| s.0.clone()).collect();
        let other: Vec<u32> = tokens.iter().rev().copied().collect();
        let ckpt = import::load(dir.path()).unwrap();
        let model = SharedModel::new(&ckpt).unwrap();
        // A: chatglm.cpp's steps (3 tokens, then one at a time); B: joins at the second
        // step with a chunk of 4, then decodes.
        batched_equals_single(&model, [(&tokens, &[3, 1, 1]), (&other, &[0, 4, 1])], file);
    }
}

#[test]
fn hf_families_batch_exactly() {
    let input = ids(&json("hf-families/reference.json")["input_ids"]);
    let other: Vec<u32> = input.iter().rev().copied().collect();
    for family in HF_FAMILIES {
        let path = data(&format!("hf-families/{family}"));
        let ckpt = import::load(Path::new(&path)).unwrap();
        let model = SharedModel::new(&ckpt).unwrap();
        // Past Mistral's window of 8 in chunks, beside decode rows.
        let a: [usize; 5] = [10, 7, 5, 1, 1];
        let b: [usize; 5] = [1, 1, 13, 0, 9];
        batched_equals_single(&model, [(&input[..24], &a), (&other[..24], &b)], family);
    }
}

#[test]
fn act_order_gptq_batches_exactly() {
    // int4 weights with input permutations: each row of the batch is gathered alike.
    let input = ids(&json("gptq-awq/reference.json")["input_ids"]);
    let other: Vec<u32> = input.iter().rev().copied().collect();
    let ckpt = import::load(Path::new(&data("gptq-awq/gptq-sym-g32-actorder"))).unwrap();
    let model = SharedModel::new(&ckpt).unwrap();
    let (a, b): ([usize; 4], [usize; 4]) = ([6, 5, 1, 1], [1, 4, 0, 3]);
    batched_equals_single(&model, [(&input, &a), (&other, &b)], "gptq act-order");
}

#[test]
fn chatglm_6b_is_refused_by_the_engine() {
    let dir = tempfile::tempdir().unwrap();
    write_hf_dir("glm_model.data", Family::Glm, false, dir.path());
    let ckpt = import::load(dir.path()).unwrap();
    let model = SharedModel::new(&ckpt).unwrap();
    let err = Engine::new(model, cpu_executor(), EngineConfig::default())
        .err()
        .unwrap();
    assert!(matches!(err, Error::Config(_)), "{err}");
}
