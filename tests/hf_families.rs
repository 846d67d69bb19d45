//! Llama 3 (llama3 RoPE scaling), Mistral (sliding-window attention), Qwen2 (q/k/v
//! biases), Qwen3 (an RMSNorm over each query and key head), Phi-3 (fused projections,
//! LongRoPE on part of each head), Gemma (GeGLU, `1 + w` gains, scaled embeddings), Gemma 2
//! (post-norms, soft-capping, alternating sliding and global layers), Gemma 3 (q/k norms
//! and a local RoPE besides), Mixtral, Qwen3-MoE and Qwen2-MoE (routed experts; Qwen2-MoE's shared expert),
//! DeepSeek-V2/V3, GLM-4.5 and gpt-oss (attention sinks, biased router and experts, a
//! clamped SwiGLU) through the Llama graph, against the logits of Hugging Face transformers
//! for tiny random-weight checkpoints (tests/data/hf-families, made by its `make_*.py`; see
//! its SOURCES.md).

use std::path::Path;

use flm_core::{
    DataType, ExpertActivation, ExpertGroups, GroupScore, Llama3Scaling, RopeScaling, RopeStyle,
    RouterScoring,
};
use flm_models::convert::Recipe;
use flm_models::llama::{Attention, Ffn, Llama, LlamaWeights, Logits};
use flm_models::{import, Activation, Graph, MlaConfig, ModelConfig, MoeConfig};
use flm_tests::{
    convert_with_tok512, cpu_executor, data, f32_file, ids, json, max_abs_diff, HF_FAMILIES,
};
use serde_json::Value;

/// The bound on the difference to transformers' logits.
const TOLERANCE: f32 = 1e-4;

fn reference() -> Value {
    json("hf-families/reference.json")
}

fn input_ids() -> Vec<u32> {
    ids(&reference()["input_ids"])
}

/// transformers' logits `[24, vocab]` of one prefill of the input ids.
fn expected(family: &str) -> Vec<f32> {
    f32_file(&data(&format!("hf-families/{family}/logits_f32le.bin")))
}

/// transformers' logits of the input ids in the three ways of [`logits_three_ways`]: one
/// prefill, two chunks and token by token over the cache. They are the same but for
/// Phi-3, whose LongRoPE rotates a forward pass over at most 16 positions with its short
/// factors (`make_longrope.py`).
fn expected_three_ways(family: &str) -> [Vec<f32>; 3] {
    let prefill = expected(family);
    if family != "phi3" {
        return [prefill.clone(), prefill.clone(), prefill];
    }
    let file = |how: &str| f32_file(&data(&format!("hf-families/phi3/{how}_logits_f32le.bin")));
    [prefill, file("two_chunks"), file("stepped")]
}

/// The logits of the model at `path`, in one prefill and token by token, are within
/// `tolerance` of `prefill` and `stepped`; `what` names the model in a failure.
fn assert_prefill_and_decode_near(
    path: &Path,
    [prefill, stepped]: [&[f32]; 2],
    tolerance: f32,
    what: &str,
) {
    let [got_prefill, _, got_stepped] = logits_three_ways(path);
    for (how, got, want) in [
        ("prefill", got_prefill, prefill),
        ("decode", got_stepped, stepped),
    ] {
        let diff = max_abs_diff(&got, want);
        assert!(diff <= tolerance, "{what} {how}: max |Δ| = {diff}");
    }
}

/// [`assert_prefill_and_decode_near`] against transformers' f32 logits of `family`.
fn assert_near_transformers(path: &Path, family: &str, what: &str) {
    let [prefill, _, stepped] = expected_three_ways(family);
    assert_prefill_and_decode_near(path, [&prefill, &stepped], TOLERANCE, what);
}

/// The logits of one prefill of the model at `path` are within [`TOLERANCE`] of
/// transformers' for `family`.
fn assert_prefill_matches(path: &Path, family: &str) {
    let got = load(path)
        .forward(&cpu_executor(), &input_ids(), 0, Logits::All)
        .unwrap()
        .to_vec();
    let diff = max_abs_diff(&got, &expected(family));
    assert!(diff <= TOLERANCE, "{family}: max |Δ| = {diff}");
}

fn load(path: &Path) -> Llama {
    let ckpt = import::load(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    Llama::new(ckpt.config.clone(), LlamaWeights::load(&ckpt).unwrap()).unwrap()
}

/// The logits of every position: one prefill, two chunks (the second one starting at
/// position 10, past Mistral's window), and one token at a time through the KV cache.
fn logits_three_ways(path: &Path) -> [Vec<f32>; 3] {
    let exec = cpu_executor();
    let input = input_ids();
    let prefill = load(path)
        .forward(&exec, &input, 0, Logits::All)
        .unwrap()
        .to_vec();
    let mut model = load(path);
    let mut chunked = model
        .forward(&exec, &input[..10], 0, Logits::All)
        .unwrap()
        .to_vec();
    chunked.extend(model.forward(&exec, &input[10..], 10, Logits::All).unwrap());
    let mut model = load(path);
    let mut stepped = Vec::new();
    for (pos, &token) in input.iter().enumerate() {
        stepped.extend(model.forward(&exec, &[token], pos, Logits::Last).unwrap());
    }
    [prefill, chunked, stepped]
}

#[test]
fn configurations_are_read_per_family() {
    let config = |family: &str| -> ModelConfig {
        import::load(&data(&format!("hf-families/{family}")))
            .unwrap()
            .config
    };
    let llama3 = config("llama3");
    assert_eq!(llama3.rope_theta, 500000.0);
    assert_eq!(
        llama3.rope_scaling,
        Some(RopeScaling::Llama3(Llama3Scaling {
            factor: 8.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: 64,
        }))
    );
    assert_eq!(llama3.sliding_window, None);
    let mistral = config("mistral");
    assert_eq!((mistral.sliding_window, mistral.qkv_bias), (Some(8), false));
    let qwen2 = config("qwen2");
    assert_eq!(qwen2.rope_theta, 1e6);
    assert!(qwen2.qkv_bias && !qwen2.o_bias && qwen2.tie_embeddings);
    assert_eq!((qwen2.sliding_window, qwen2.rope_scaling), (None, None));
    assert!(!qwen2.qk_norm);
    let qwen3 = config("qwen3");
    assert!(qwen3.qk_norm && !qwen3.qkv_bias && qwen3.tie_embeddings);
    // Heads of 32: queries 128 wide over a hidden size of 64.
    assert_eq!((qwen3.head_dim, qwen3.q_dim(), qwen3.dim), (32, 128, 64));
    let glm4 = config("glm4");
    assert!(glm4.post_norms && glm4.qkv_bias && !glm4.o_bias && !glm4.norm_unit_offset);
    assert_eq!(glm4.rope_style, RopeStyle::AdjacentPairs);
    assert_eq!((glm4.head_dim, glm4.rotary_dim()), (16, 8));
    let phi3 = config("phi3");
    assert_eq!((phi3.head_dim, phi3.rotary_dim()), (16, 12));
    let Some(RopeScaling::LongRope {
        long_factor,
        original_max_position_embeddings: 16,
        attention_factor,
        ..
    }) = phi3.rope_scaling
    else {
        panic!("{:?}", phi3.rope_scaling);
    };
    assert_eq!(long_factor, [1.0, 1.5, 2.5, 4.0, 6.0, 9.0]);
    // sqrt(1 + ln(128 / 16) / ln(16)), transformers' default.
    assert!((attention_factor - 1.75f32.sqrt()).abs() < 1e-6);
    let gemma = config("gemma");
    assert_eq!(gemma.activation, Activation::GeluTanh);
    assert!(gemma.norm_unit_offset && gemma.tie_embeddings && !gemma.post_norms);
    assert_eq!(gemma.embed_scale, Some(8.0));
    let gemma2 = config("gemma2");
    assert!(gemma2.post_norms && !gemma2.qk_norm);
    assert_eq!(
        (gemma2.attn_softcap, gemma2.final_softcap),
        (Some(1.5), Some(4.0))
    );
    assert_eq!(gemma2.attention_scale, Some(24f64.powf(-0.5) as f32));
    assert_eq!(
        (gemma2.layer_window(0), gemma2.layer_window(1)),
        (Some(8), None)
    );
    let gemma3 = config("gemma3");
    assert!(gemma3.post_norms && gemma3.qk_norm && gemma3.attn_softcap.is_none());
    assert_eq!(
        (gemma3.rope_theta, gemma3.rope_local_theta),
        (1e6, Some(10000.0))
    );
    assert_eq!(
        gemma3.rope_scaling,
        Some(RopeScaling::Linear { factor: 8.0 })
    );
    let mixtral = config("mixtral").moe.unwrap();
    assert_eq!(mixtral, MoeConfig::softmax_top_k(4, 2, 128, true));
    let qwen3_moe = config("qwen3_moe");
    assert!(qwen3_moe.qk_norm);
    assert_eq!(
        qwen3_moe.moe.unwrap(),
        MoeConfig {
            dense_layers: vec![1],
            ..MoeConfig::softmax_top_k(4, 2, 32, true)
        }
    );
    let qwen2_moe = config("qwen2_moe");
    assert!(qwen2_moe.qkv_bias && !qwen2_moe.o_bias && !qwen2_moe.qk_norm);
    assert_eq!(qwen2_moe.sliding_window, None);
    assert_eq!(
        qwen2_moe.moe.unwrap(),
        MoeConfig {
            shared_expert_dim: Some(48),
            ..MoeConfig::softmax_top_k(4, 2, 32, false)
        }
    );
    let v2 = config("deepseek_v2");
    assert_eq!(
        v2.mla,
        Some(MlaConfig {
            q_lora_rank: None,
            kv_lora_rank: 32,
            qk_nope_head_dim: 16,
            qk_rope_head_dim: 8,
        })
    );
    assert_eq!((v2.n_kv_heads, v2.head_dim, v2.rotary_dim()), (1, 16, 8));
    assert_eq!(v2.rope_style, RopeStyle::AdjacentPairs);
    // The cache holds the latent and the rotated key: 40 values a position, not the
    // 4 × (24 + 16) of the expanded keys and values.
    assert_eq!((v2.kv_widths(), v2.kv_values_per_position()), ((32, 8), 40));
    let Some(RopeScaling::Yarn(yarn)) = &v2.rope_scaling else {
        panic!("{:?}", v2.rope_scaling);
    };
    // transformers' `yarn_apply_mscale`: (0.1 · 0.707 · ln 4 + 1)² / √24.
    let mscale = 0.1 * 0.707 * 4f64.ln() + 1.0;
    let want = mscale * mscale / 24f64.sqrt();
    assert!((v2.attention_scale() as f64 - want).abs() < 1e-6);
    assert!((yarn.softmax_scale_factor() as f64 - mscale * mscale).abs() < 1e-6);
    assert_eq!(
        v2.moe.unwrap(),
        MoeConfig {
            dense_layers: vec![0],
            shared_expert_dim: Some(32),
            shared_expert_gated: false,
            groups: Some(ExpertGroups {
                n_groups: 4,
                top_groups: 2,
                score: GroupScore::Max,
            }),
            routed_scale: 2.0,
            ..MoeConfig::softmax_top_k(16, 3, 32, false)
        }
    );
    let v3 = config("deepseek_v3");
    assert_eq!(v3.mla.as_ref().unwrap().q_lora_rank, Some(24));
    assert_eq!(v3.attention_scale(), 24f32.powf(-0.5));
    assert_eq!(
        v3.moe.clone().unwrap(),
        MoeConfig {
            dense_layers: vec![0],
            shared_expert_dim: Some(32),
            shared_expert_gated: false,
            scoring: RouterScoring::Sigmoid,
            groups: Some(ExpertGroups {
                n_groups: 4,
                top_groups: 2,
                score: GroupScore::SumOfTop2,
            }),
            choice_bias: true,
            routed_scale: 2.5,
            ..MoeConfig::softmax_top_k(8, 2, 32, true)
        }
    );
    // GLM-4.5: DeepSeek-V3's experts behind grouped-query attention.
    let glm = config("glm4_moe");
    assert!(glm.qk_norm && glm.qkv_bias && !glm.o_bias && glm.mla.is_none());
    assert_eq!((glm.n_kv_heads, glm.head_dim, glm.rotary_dim()), (2, 16, 8));
    assert_eq!(glm.rope_style, RopeStyle::RotateHalf);
    assert_eq!(glm.moe, v3.moe);
    // gpt-oss: sinks, q/k/v/o biases, windows on the layers `layer_types` says, YaRN, and
    // experts with biases and the clamped SwiGLU behind a biased, renormalised router.
    let oss = config("gpt_oss");
    assert!(oss.attn_sinks && oss.qkv_bias && oss.o_bias);
    assert_eq!(oss.sliding_window, Some(4));
    assert_eq!(oss.sliding_layers, Some(vec![true, false, true, false]));
    assert!(matches!(oss.rope_scaling, Some(RopeScaling::Yarn(y)) if !y.truncate));
    assert_eq!(
        oss.moe,
        Some(MoeConfig {
            logit_bias: true,
            expert_biases: true,
            activation: ExpertActivation::ClampedSwiGlu {
                alpha: 1.702,
                limit: 1.0,
            },
            ..MoeConfig::softmax_top_k(8, 2, 32, true)
        })
    );
}

#[test]
fn logits_match_transformers_within_1e_4() {
    for family in HF_FAMILIES {
        let path = data(&format!("hf-families/{family}"));
        let ways = ["prefill", "two chunks", "decode"];
        for ((how, got), want) in ways
            .iter()
            .zip(logits_three_ways(&path))
            .zip(expected_three_ways(family))
        {
            let diff = max_abs_diff(&got, &want);
            assert!(diff <= TOLERANCE, "{family} {how}: max |Δ| = {diff}");
        }
    }
}

/// Phi-3's LongRoPE chooses its factors per forward pass by the sequence's length, as
/// transformers does, whatever the context the model was loaded for: token by token, the
/// first 16 positions (its pre-training context) rotate with the short factors and the
/// next with the long ones, the keys already cached kept, both with a context of 128 and
/// with one of 16 (whose table holds the short factors alone).
#[test]
fn longrope_switches_with_the_sequence_not_the_context() {
    let exec = cpu_executor();
    let input = input_ids();
    let want = &expected_three_ways("phi3")[2];
    let ckpt = import::load(&data("hf-families/phi3")).unwrap();
    for context in [128, 16] {
        let config = ModelConfig {
            max_seq_len: context,
            ..ckpt.config.clone()
        };
        let mut model = Llama::new(config, LlamaWeights::load(&ckpt).unwrap()).unwrap();
        let vocab = model.config().vocab_size;
        for (pos, &token) in input.iter().enumerate().take(context) {
            let got = model.forward(&exec, &[token], pos, Logits::Last).unwrap();
            let diff = max_abs_diff(got, &want[pos * vocab..][..vocab]);
            assert!(
                diff <= TOLERANCE,
                "context {context}, position {pos}: {diff}"
            );
        }
    }
}

/// The features matter at these positions: without them the logits are far off.
#[test]
fn without_the_family_feature_the_logits_differ() {
    let exec = cpu_executor();
    let input = input_ids();
    for (family, strip) in [
        (
            "llama3",
            (|c: &mut ModelConfig| c.rope_scaling = None) as fn(&mut ModelConfig),
        ),
        ("mistral", |c: &mut ModelConfig| c.sliding_window = None),
        ("qwen3", |c: &mut ModelConfig| c.qk_norm = false),
        ("phi3", |c: &mut ModelConfig| c.rope_scaling = None),
        ("gemma", |c: &mut ModelConfig| {
            c.activation = Activation::Silu
        }),
        ("gemma2", |c: &mut ModelConfig| {
            (c.attn_softcap, c.final_softcap) = (None, None)
        }),
        ("gemma3", |c: &mut ModelConfig| c.rope_local_theta = None),
        // RoPE on all of each head instead of its first half.
        ("glm4", |c: &mut ModelConfig| c.rotary_dim = None),
        // One expert per token instead of two.
        ("mixtral", |c: &mut ModelConfig| {
            c.moe.as_mut().unwrap().top_k = 1
        }),
        // The top-2 probabilities as they are, not divided by their sum.
        ("qwen3_moe", |c: &mut ModelConfig| {
            c.moe.as_mut().unwrap().renormalize = false
        }),
        // No shared expert (its weights are dropped below).
        ("qwen2_moe", |c: &mut ModelConfig| {
            c.moe.as_mut().unwrap().shared_expert_dim = None
        }),
        // DeepSeek's routing features, one at a time, and YaRN (its frequencies and its
        // factor in the softmax scale).
        ("deepseek_v2", |c: &mut ModelConfig| {
            c.moe.as_mut().unwrap().groups = None
        }),
        ("deepseek_v2", |c: &mut ModelConfig| {
            c.moe.as_mut().unwrap().routed_scale = 1.0
        }),
        ("deepseek_v2", |c: &mut ModelConfig| {
            c.moe.as_mut().unwrap().shared_expert_dim = None
        }),
        ("deepseek_v2", |c: &mut ModelConfig| {
            c.rope_scaling = None;
            c.attention_scale = Some(24f32.powf(-0.5));
        }),
        ("deepseek_v3", |c: &mut ModelConfig| {
            c.moe.as_mut().unwrap().groups = None
        }),
        // The bias that only chooses (its tensor is dropped below).
        ("deepseek_v3", |c: &mut ModelConfig| {
            c.moe.as_mut().unwrap().choice_bias = false
        }),
        ("deepseek_v3", |c: &mut ModelConfig| {
            c.moe.as_mut().unwrap().renormalize = false
        }),
        ("deepseek_v3", |c: &mut ModelConfig| {
            c.moe.as_mut().unwrap().routed_scale = 1.0
        }),
        ("deepseek_v3", |c: &mut ModelConfig| {
            c.moe.as_mut().unwrap().shared_expert_dim = None
        }),
        ("glm4_moe", |c: &mut ModelConfig| {
            c.moe.as_mut().unwrap().groups = None
        }),
        ("glm4_moe", |c: &mut ModelConfig| {
            c.moe.as_mut().unwrap().choice_bias = false
        }),
        ("glm4_moe", |c: &mut ModelConfig| {
            c.moe.as_mut().unwrap().routed_scale = 1.0
        }),
        // gpt-oss's features, one at a time (the tensors they drop, below).
        ("gpt_oss", |c: &mut ModelConfig| c.attn_sinks = false),
        ("gpt_oss", |c: &mut ModelConfig| c.sliding_window = None),
        ("gpt_oss", |c: &mut ModelConfig| {
            c.moe.as_mut().unwrap().activation = ExpertActivation::ClampedSwiGlu {
                alpha: 1.702,
                limit: f32::MAX,
            }
        }),
        ("gpt_oss", |c: &mut ModelConfig| {
            c.moe.as_mut().unwrap().logit_bias = false
        }),
        ("gpt_oss", |c: &mut ModelConfig| {
            c.moe.as_mut().unwrap().expert_biases = false
        }),
        ("gpt_oss", |c: &mut ModelConfig| c.rope_scaling = None),
    ] {
        let ckpt = import::load(&data(&format!("hf-families/{family}"))).unwrap();
        let mut config = ckpt.config.clone();
        let mut weights = LlamaWeights::load(&ckpt).unwrap();
        strip(&mut config);
        // The prediction layers do not make the logits: left out rather than stripped too.
        (config.mtp_layers, weights.mtp) = (0, Vec::new());
        let no_shared = config
            .moe
            .as_ref()
            .is_some_and(|m| m.shared_expert_dim.is_none());
        for layer in &mut weights.layers {
            if let (false, Attention::Heads(h)) = (config.qk_norm, &mut layer.attn) {
                h.qk_norm = None;
            }
            if let (true, Ffn::Moe { shared, .. }) = (no_shared, &mut layer.ffn) {
                *shared = None;
            }
            let no_bias = config.moe.as_ref().is_some_and(|m| !m.choice_bias);
            if let (true, Ffn::Moe { router_bias, .. }) = (no_bias, &mut layer.ffn) {
                *router_bias = None;
            }
            if let (false, Attention::Heads(h)) = (config.attn_sinks, &mut layer.attn) {
                h.sinks = None;
            }
            if let (
                Some(m),
                Ffn::Moe {
                    router_logit_bias,
                    experts,
                    ..
                },
            ) = (&config.moe, &mut layer.ffn)
            {
                if !m.logit_bias {
                    *router_logit_bias = None;
                }
                if !m.expert_biases {
                    experts.iter_mut().for_each(|e| e.biases = None);
                }
            }
        }
        let mut model = Llama::new(config, weights).unwrap();
        let got = model.forward(&exec, &input, 0, Logits::All).unwrap();
        let diff = max_abs_diff(got, &expected(family));
        assert!(diff > 0.1, "{family}: only {diff} without its feature");
    }
}

/// Each checkpoint converted to an f32 .flm file keeps its configuration and its logits.
#[test]
fn f32_flm_files_run_the_same() {
    let dir = tempfile::tempdir().unwrap();
    for family in HF_FAMILIES {
        let ckpt = import::load(&data(&format!("hf-families/{family}"))).unwrap();
        let out = dir.path().join(format!("{family}.flm"));
        convert_with_tok512(&ckpt, &out, DataType::F32, Recipe::Mixed);
        assert_eq!(import::load(&out).unwrap().config, ckpt.config, "{family}");
        let what = format!("{family}.flm");
        assert_near_transformers(&out, family, &what);
    }
}

/// Each checkpoint converted to int8 and int4 .flm files runs quantised: its logits stay
/// near transformers' f32 ones (int8 rounding of every matrix and activation moves them by
/// up to 0.2 here, int4 by up to 2.2), and the greedy token agrees at the positions whose
/// top two logits are far enough apart.
#[test]
fn quantised_flm_files_stay_near_transformers() {
    let dir = tempfile::tempdir().unwrap();
    let exec = cpu_executor();
    let input = input_ids();
    // The mixtures have their own test (quantised_mixtures_stay_near_transformers): a
    // rounding can send a token to another expert, which no bound on rounding covers.
    let dense = HF_FAMILIES.into_iter().filter(|f| {
        !f.contains("moe") && !["mixtral", "deepseek_v2", "deepseek_v3", "gpt_oss"].contains(f)
    });
    for family in dense {
        let ckpt = import::load(&data(&format!("hf-families/{family}"))).unwrap();
        let want = expected(family);
        // Bounds of about 1.3× the largest difference seen over the families: random
        // Gaussian weights of rows of 64 lose much to 16 levels.
        for (dtype, bound) in [(DataType::I8, 0.25), (DataType::I4G32, 2.5)] {
            let out = dir.path().join(format!("{family}-{}.flm", dtype.name()));
            convert_with_tok512(&ckpt, &out, dtype, Recipe::Pure);
            let mut model = load(&out);
            let vocab = model.config().vocab_size;
            let got = model.forward(&exec, &input, 0, Logits::All).unwrap();
            let diff = max_abs_diff(got, &want);
            assert!(diff <= bound, "{family} {}: max |Δ| = {diff}", dtype.name());
            for (pos, (g, w)) in got.chunks(vocab).zip(want.chunks(vocab)).enumerate() {
                let best = flm_core::argmax(w);
                let mut sorted = w.to_vec();
                sorted.sort_by(|a, b| b.total_cmp(a));
                if sorted[0] - sorted[1] > 2.0 * bound {
                    let what = format!("{family} {} at {pos}", dtype.name());
                    assert_eq!(flm_core::argmax(g), best, "{what}");
                }
            }
        }
    }
}

/// A copy of a tiny checkpoint whose `config.json` is edited by `edit`.
fn edited_copy(family: &str, edit: impl FnOnce(&mut Value)) -> tempfile::TempDir {
    let src = data(&format!("hf-families/{family}"));
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(
        src.join("model.safetensors"),
        dir.path().join("model.safetensors"),
    )
    .unwrap();
    let mut config: Value =
        serde_json::from_str(&std::fs::read_to_string(src.join("config.json")).unwrap()).unwrap();
    edit(&mut config);
    std::fs::write(dir.path().join("config.json"), config.to_string()).unwrap();
    dir
}

/// The transformers 4 form of the Llama 3.1 fields (`rope_theta` and `rope_scaling`, as on
/// the Hub) gives the same model as transformers 5's `rope_parameters`.
#[test]
fn llama3_scaling_in_the_transformers_4_form() {
    let dir = edited_copy("llama3", |c| {
        let mut scaling = c["rope_parameters"].take();
        let theta = scaling
            .as_object_mut()
            .unwrap()
            .remove("rope_theta")
            .unwrap();
        let c = c.as_object_mut().unwrap();
        c.remove("rope_parameters");
        c.insert("rope_theta".into(), theta);
        c.insert("rope_scaling".into(), scaling);
    });
    assert_prefill_matches(dir.path(), "llama3");
}

/// What the graph cannot run is refused with an error naming it.
#[test]
fn unsupported_family_settings_are_clear_errors() {
    type Edit = fn(&mut Value);
    let cases: [(&str, Edit, &str); 12] = [
        (
            "llama3",
            |c| c["rope_parameters"]["rope_type"] = "dynamic".into(),
            "\"dynamic\"",
        ),
        (
            "llama3",
            |c| c["rope_parameters"]["high_freq_factor"] = 0.5.into(),
            "high_freq_factor",
        ),
        (
            "qwen2",
            |c| c["use_sliding_window"] = true.into(),
            "use_sliding_window",
        ),
        (
            "qwen3",
            |c| c["use_sliding_window"] = true.into(),
            "qwen3's use_sliding_window",
        ),
        (
            "mistral",
            |c| c["sliding_window"] = 0.into(),
            "sliding_window",
        ),
        (
            "qwen3_moe",
            |c| {
                c.as_object_mut().unwrap().remove("num_experts_per_tok");
            },
            "num_experts_per_tok",
        ),
        (
            "qwen3_moe",
            |c| c["decoder_sparse_step"] = 0.into(),
            "decoder_sparse_step",
        ),
        ("mixtral", |c| c["num_experts_per_tok"] = 5.into(), "top_k"),
        (
            "qwen2_moe",
            |c| {
                c.as_object_mut()
                    .unwrap()
                    .remove("shared_expert_intermediate_size");
            },
            "shared_expert_intermediate_size",
        ),
        (
            "qwen2_moe",
            |c| c["use_sliding_window"] = true.into(),
            "qwen2_moe's use_sliding_window",
        ),
        (
            "deepseek_v2",
            |c| c["topk_method"] = "noaux_tc".into(),
            "topk_method Some(\"noaux_tc\")",
        ),
        (
            "deepseek_v3",
            |c| c["moe_layer_freq"] = 0.into(),
            "moe_layer_freq",
        ),
    ];
    for (family, edit, needle) in cases {
        let dir = edited_copy(family, edit);
        let Err(err) = import::load(dir.path()) else {
            panic!("{family}: {needle} accepted");
        };
        let err = err.to_string();
        assert!(err.contains(needle), "{family}: {err}");
    }
}

/// The greedy id at every position of the input (teacher-forced, so that one disagreement
/// cannot hide the rest) is transformers' argmax, wherever that argmax is clear of the
/// runner-up by more than twice the tolerance.
#[test]
fn greedy_ids_equal_transformers() {
    let exec = cpu_executor();
    let input = input_ids();
    for family in HF_FAMILIES {
        let want = expected(family);
        let mut model = load(&data(&format!("hf-families/{family}")));
        let vocab = model.config().vocab_size;
        let got = model
            .forward(&exec, &input, 0, Logits::All)
            .unwrap()
            .to_vec();
        let mut compared = 0;
        for (pos, (g, w)) in got.chunks(vocab).zip(want.chunks(vocab)).enumerate() {
            let best = flm_core::argmax(w);
            let runner_up = w
                .iter()
                .enumerate()
                .filter(|&(i, _)| i != best as usize)
                .map(|(_, &v)| v)
                .fold(f32::NEG_INFINITY, f32::max);
            if w[best as usize] - runner_up > 2.0 * TOLERANCE {
                assert_eq!(flm_core::argmax(g), best, "{family} at position {pos}");
                compared += 1;
            }
        }
        assert!(compared >= 20, "{family}: only {compared} clear positions");
    }
}

/// The Qwen2, Qwen3, Gemma 3, Phi-3 and GLM-4 checkpoints as llama.cpp writes them into
/// GGUF files (made from the same weights by tools/gguf/make_family_ggufs.py; Phi-3's fused
/// `attn_qkv` and `ffn_up`, partial rotary and LongRoPE factor tensors; GLM-4's fused
/// `ffn_up`, post-norms and partial rotary in adjacent pairs): the configuration the
/// architecture's keys give, and transformers' logits from the F32 tensors.
#[test]
fn qwen_gemma_phi3_and_glm4_gguf_files_run_as_transformers() {
    for family in ["qwen2", "qwen3", "gemma3", "phi3", "glm4"] {
        let path = data(&format!("hf-families/{family}.gguf"));
        let gguf = import::load(&path).unwrap().config;
        let hf = import::load(&data(&format!("hf-families/{family}")))
            .unwrap()
            .config;
        let attention = |c: &ModelConfig| {
            let window = (c.sliding_window, c.rotary_dim());
            (c.qkv_bias, c.qk_norm, c.rope_style, c.head_dim, window)
        };
        assert_eq!(attention(&gguf), attention(&hf), "{family}");
        // The norms' `+ 1` is in the GGUF's tensors, not in its configuration.
        assert!(!gguf.norm_unit_offset, "{family}");
        let gemma = |c: &ModelConfig| {
            let layers = (c.layer_window(0), c.layer_window(1));
            (
                c.post_norms,
                c.embed_scale,
                c.rope_local_theta,
                c.rope_scaling.clone(),
                layers,
            )
        };
        assert_eq!(gemma(&gguf), gemma(&hf), "{family}");
        assert_eq!(gguf.attention_scale(), hf.attention_scale(), "{family}");
        let what = format!("{family}.gguf");
        assert_near_transformers(&path, family, &what);
    }
}

/// The mixtures as llama.cpp writes them into GGUF files (tools/gguf/make_family_ggufs.py:
/// each layer's experts stacked into `ffn_{gate,up,down}_exps`, Mixtral as architecture
/// `llama` with q/k permuted, and again with each expert's tensors of its own as llama.cpp
/// wrote Mixtral before stacking; Qwen2-MoE's shared expert as `*_shexp`; GLM-4.5's
/// sigmoid router, groups, bias and shared expert with its prediction layer counted in
/// `block_count`; DeepSeek-V2 and V3 as `deepseek2`, their multi-head latent attention
/// with `kv_b_proj` split into `attn_k_b` and `attn_v_b` (or whole, as older files have
/// it), YaRN through
/// `yarn_log_multiplier`): the experts the keys and tensors give are transformers', the
/// logits too,
/// in one prefill and token by token, and again from an f32 .flm file converted from the
/// GGUF.
#[test]
fn mixture_gguf_files_run_as_transformers() {
    let dir = tempfile::tempdir().unwrap();
    for (file, family) in [
        ("mixtral", "mixtral"),
        ("mixtral-per-expert", "mixtral"),
        ("qwen3_moe", "qwen3_moe"),
        ("qwen2_moe", "qwen2_moe"),
        ("glm4_moe", "glm4_moe"),
        ("deepseek_v2", "deepseek_v2"),
        ("deepseek_v2-kv_b", "deepseek_v2"),
        ("deepseek_v3", "deepseek_v3"),
    ] {
        let path = data(&format!("hf-families/{file}.gguf"));
        let gguf = import::load(&path).unwrap();
        assert_eq!(gguf.config.n_layers, 2, "{family}");
        let hf = import::load(&data(&format!("hf-families/{family}")))
            .unwrap()
            .config;
        assert_eq!(gguf.config.moe, hf.moe, "{family}");
        let c = &gguf.config;
        assert_eq!(c.mla, hf.mla, "{family}");
        if c.mla.is_some() {
            assert_eq!(c.rope_style, hf.rope_style, "{family}");
        }
        // DeepSeek's YaRN factor through `yarn_log_multiplier`, an f32 of 0.1 · mscale_all_dim.
        let scale = (c.attention_scale() - hf.attention_scale()).abs();
        assert!(scale < 1e-6, "{family}: {scale}");
        assert!(gguf.ignored.is_empty(), "{family}: {:?}", gguf.ignored);
        assert_eq!(
            (gguf.config.qkv_bias, gguf.config.qk_norm),
            (hf.qkv_bias, hf.qk_norm),
            "{family}"
        );
        let out = dir.path().join(format!("{file}.flm"));
        convert_with_tok512(&gguf, &out, DataType::F32, Recipe::Keep);
        for file in [&path, &out] {
            let what = file.display().to_string();
            assert_near_transformers(file, family, &what);
        }
    }
}

/// Phi-3 and Qwen2-MoE GGUF files with their matrices in Q8_0 (used in place as q8_0): q/k/v
/// and gate/up sliced out of the fused blocks and each expert out of the stacked ones,
/// decoded to f32, give transformers' logits for the weights the blocks decode to
/// (`<family>/q8_0_logits_f32le.bin`, tools/gguf/make_family_ggufs.py) within 1e-4; in
/// place, dotted against int8 activations, within the activations' rounding (a block
/// sliced at a wrong offset moves the logits by whole units).
#[test]
fn q8_0_gguf_files_slice_fused_and_stacked_blocks() {
    use flm_models::import::Encoding;
    for (family, sliced) in [
        ("phi3", "layers.1.w_up"),
        ("qwen2_moe", "layers.1.experts.3.w_down"),
    ] {
        let path = data(&format!("hf-families/{family}-q8_0.gguf"));
        let ckpt = import::load(&path).unwrap();
        let t = ckpt.tensors.iter().find(|t| t.name == sliced).unwrap();
        assert_eq!(t.encoding, Encoding::Native(DataType::Q8_0), "{family}");
        let want = f32_file(&data(&format!(
            "hf-families/{family}/q8_0_logits_f32le.bin"
        )));
        let decoded = LlamaWeights::from_tensors(&ckpt.config, |name, _| {
            Ok(ckpt.tensor(name).unwrap().load()?.to_dtype(DataType::F32)?)
        })
        .unwrap();
        let got = Llama::new(ckpt.config.clone(), decoded)
            .unwrap()
            .forward(&cpu_executor(), &input_ids(), 0, Logits::All)
            .unwrap()
            .to_vec();
        let diff = max_abs_diff(&got, &want);
        assert!(
            diff <= TOLERANCE,
            "{family}-q8_0 decoded to f32: max |Δ| = {diff}"
        );
        // Measured: 0.084 (phi3) and 0.158 (qwen2_moe). Phi-3 token by token against the
        // f32 weights' stepped logits, which differ from its prefill's (LongRoPE).
        let stepped = match family {
            "phi3" => expected_three_ways(family)[2].clone(),
            _ => want.clone(),
        };
        let what = format!("{family}-q8_0");
        assert_prefill_and_decode_near(&path, [&want, &stepped], 0.25, &what);
    }
}

/// A tensor no canonical name maps to is listed as ignored, not read as another one, and
/// the model still gives transformers' logits.
#[test]
fn unknown_tensors_are_listed_as_ignored() {
    use safetensors::tensor::TensorView;
    let dir = edited_copy("qwen3", |_| {});
    let path = dir.path().join("model.safetensors");
    let bytes = std::fs::read(&path).unwrap();
    let file = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let extra = [0u8; 16];
    let mut views: Vec<(String, TensorView<'_>)> = file.tensors();
    let name = "model.layers.0.mlp.experts.0.up_proj.weight";
    let view = TensorView::new(safetensors::Dtype::F32, vec![2, 2], &extra).unwrap();
    views.push((name.to_string(), view));
    safetensors::tensor::serialize_to_file(views, None, &path).unwrap();
    let ckpt = import::load(dir.path()).unwrap();
    assert_eq!(ckpt.ignored, [name]);
    let notes = ckpt.load_notes();
    assert!(notes.iter().any(|n| n.contains(name)), "{notes:?}");
    assert_prefill_matches(dir.path(), "qwen3");
}

/// The mixtures converted to int8 and int4 .flm files (the experts quantised like the
/// other matrices, the router kept f32) run near transformers' logits: the RMS of the
/// logits' error relative to the logits' RMS stays under about twice what was measured
/// (int8: 0.027 Mixtral, 0.106 Qwen3-MoE, 0.030 Qwen2-MoE, 0.26 gpt-oss; int4 g32: 0.29,
/// 0.24, 0.18; groups of 32 over rows of 64 random values, and a few routing choices flip).
#[test]
fn quantised_mixtures_stay_near_transformers() {
    use flm_models::tensor_names::{LayerPart, TensorName};
    let dir = tempfile::tempdir().unwrap();
    let families = [
        "mixtral",
        "qwen3_moe",
        "qwen2_moe",
        "deepseek_v2",
        "deepseek_v3",
        "glm4_moe",
        "gpt_oss",
    ];
    for family in families {
        let ckpt = import::load(&data(&format!("hf-families/{family}"))).unwrap();
        let c = &ckpt.config;
        let l = (0..c.n_layers).find(|&l| c.moe_layer(l).is_some()).unwrap();
        // gpt-oss's int8 rounding flips one routing choice at position 9 (its error there
        // is 3.5 with 8- and 16-bit activations alike), which later positions attend to.
        let int8 = if family == "gpt_oss" { 0.35 } else { 0.2 };
        for (dtype, bound) in [(DataType::I8, int8), (DataType::I4G32, 0.5)] {
            let out = dir.path().join(format!("{family}.{dtype}.flm"));
            convert_with_tok512(&ckpt, &out, dtype, Recipe::Mixed);
            let flm = import::load(&out).unwrap();
            let dtype_of = |name: TensorName| {
                let t = flm
                    .tensors
                    .iter()
                    .find(|t| t.name == name.to_string())
                    .unwrap();
                t.encoding.load_dtype()
            };
            assert_eq!(dtype_of(TensorName::Expert(l, 1, LayerPart::WUp)), dtype);
            assert_eq!(dtype_of(TensorName::Expert(l, 3, LayerPart::WDown)), dtype);
            assert_eq!(
                dtype_of(TensorName::Layer(l, LayerPart::Router)),
                DataType::F32
            );
            let [prefill, _, _] = logits_three_ways(&out);
            let want = expected(family);
            let rms = |v: &mut dyn Iterator<Item = f32>| {
                let (sum, n) = v.fold((0.0f64, 0usize), |(s, n), x| (s + (x * x) as f64, n + 1));
                (sum / n as f64).sqrt()
            };
            let error = rms(&mut prefill.iter().zip(&want).map(|(g, w)| g - w));
            let relative = error / rms(&mut want.iter().copied());
            eprintln!("{family} {dtype}: relative RMS error {relative:.4}");
            assert!(
                relative <= bound,
                "{family} {dtype}: relative RMS error {relative}"
            );
        }
    }
}

/// gpt-oss decoding greedily with its KV cache (sinks, alternating windows, its experts)
/// writes the 20 tokens transformers' full-prefill argmax gives after the input ids
/// (`make_gpt_oss.py`'s `greedy_ids`, whose best logit leads the next by 0.04 or more).
#[test]
fn gpt_oss_greedy_continuation_is_transformers() {
    let want = ids(&reference()["families"]["gpt_oss"]["greedy_ids"]);
    let mut model = load(&data("hf-families/gpt_oss"));
    let got = flm_tests::greedy_on(&cpu_executor(), &mut model, &input_ids(), want.len());
    assert_eq!(got, want);
}
