//! chatglm.cpp's `*_model.data` files (`tests/data/chatglm`, layouts in its SOURCES.md) as
//! tiny Hugging Face directories: the weights under the names of each family's modeling
//! code (THUDM `modeling_chatglm.py`, Baichuan's, InternLM's) in a `model.safetensors`,
//! with the `config.json` the reference was generated from, so that the tests load them
//! through the same importer as a downloaded checkpoint.

use std::path::Path;

use flm_models::Model;
use safetensors::tensor::TensorView;
use safetensors::Dtype;

use crate::cpu_executor;

/// The models of chatglm.cpp's test data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    /// ChatGLM-6B (`glm_model.data`).
    Glm,
    /// ChatGLM2/3 (`glm2_model.data`, `glm3_model.data`).
    Glm2,
    /// GLM-4 (`glm4_model.data`): ChatGLM2's layout with eps 1.5625e-7.
    Glm4,
    /// Baichuan-7B (RoPE) or -13B (ALiBi), told apart by `alibi`.
    Baichuan { alibi: bool },
    /// InternLM.
    InternLm,
}

/// Every model file: name, family, whether it starts with a p-tuning v2 prefix.
pub const MODELS: [(&str, Family, bool); 9] = [
    ("glm_model.data", Family::Glm, false),
    ("glm_ptuning_v2_model.data", Family::Glm, true),
    ("glm2_model.data", Family::Glm2, false),
    ("glm3_model.data", Family::Glm2, false),
    ("glm3_ptuning_v2_model.data", Family::Glm2, true),
    ("glm4_model.data", Family::Glm4, false),
    (
        "baichuan7b_model.data",
        Family::Baichuan { alibi: false },
        false,
    ),
    (
        "baichuan13b_model.data",
        Family::Baichuan { alibi: true },
        false,
    ),
    ("internlm_model.data", Family::InternLm, false),
];

/// Runs the three steps of `steps` on `model`, one KV cache, on the CPU; returns the largest
/// absolute error of the hidden states after the final norm and the largest expected
/// magnitude.
pub fn run_steps(model: &mut Model, steps: &Steps) -> (f32, f32) {
    let exec = cpu_executor();
    let (mut err, mut mag, mut pos) = (0.0f32, 0.0f32, 0);
    for (tokens, want) in steps {
        let got = model.hidden_states(&exec, tokens, pos).expect("forward");
        assert_eq!(got.len(), want.len());
        for (g, w) in got.iter().zip(want) {
            err = err.max((g - w).abs());
            mag = mag.max(w.abs());
        }
        pos += tokens.len();
    }
    (err, mag)
}

/// Reads the raw little-endian tensors of a `.data` file in order.
pub struct Reader {
    bytes: Vec<u8>,
    at: usize,
}

impl Reader {
    /// The file `tests/data/chatglm/{name}`.
    pub fn open(name: &str) -> Reader {
        let path = crate::data(&format!("chatglm/{name}"));
        let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        Reader { bytes, at: 0 }
    }

    fn take(&mut self, n: usize) -> &[u8] {
        let out = &self.bytes[self.at..self.at + n];
        self.at += n;
        out
    }

    /// `n` f32 values.
    pub fn f32s(&mut self, n: usize) -> Vec<f32> {
        self.take(4 * n)
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect()
    }

    /// `n` int32 values as token ids.
    pub fn ids(&mut self, n: usize) -> Vec<u32> {
        self.take(4 * n)
            .chunks_exact(4)
            .map(|b| i32::from_le_bytes([b[0], b[1], b[2], b[3]]) as u32)
            .collect()
    }

    /// `n` f16 values, raw.
    pub fn f16_bytes(&mut self, n: usize) -> Vec<u8> {
        self.take(2 * n).to_vec()
    }

    /// Whether every byte has been read.
    pub fn at_end(&self) -> bool {
        self.at == self.bytes.len()
    }
}

/// The three steps of a `*_model.data` file: `(tokens, expected hidden states)` for the
/// prefill `[0, 1, 2]` and the single tokens 3 and 4.
pub type Steps = Vec<(Vec<u32>, Vec<f32>)>;

const DIM: usize = 32;

/// A named tensor to write: name, dtype, shape, little-endian bytes.
type Named = (String, Dtype, Vec<usize>, Vec<u8>);

fn f32_tensor(name: &str, shape: &[usize], values: Vec<f32>) -> Named {
    assert_eq!(values.len(), shape.iter().product::<usize>(), "{name}");
    let bytes = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    (name.to_string(), Dtype::F32, shape.to_vec(), bytes)
}

/// Reads the f32 tensor `name` of `shape` from `r` into `t`.
fn read(r: &mut Reader, t: &mut Vec<Named>, name: &str, shape: &[usize]) {
    let values = r.f32s(shape.iter().product());
    t.push(f32_tensor(name, shape, values));
}

/// Writes the model of `file` (of `family`; `prefix` for the p-tuning v2 files) as a
/// Hugging Face directory in `dir`, and returns its three steps.
pub fn write_hf_dir(file: &str, family: Family, prefix: bool, dir: &Path) -> Steps {
    let mut r = Reader::open(file);
    let mut t: Vec<Named> = Vec::new();
    let (n_layers, pre_seq_len, hd) = (1, 5, 4);
    if prefix {
        // [2·n_layers, kv_heads, pre_seq_len, head_dim] (chatglm.cpp `get_prefix_cache`)
        // to THUDM's `prefix_encoder.embedding.weight` [pre_seq_len, 2·n_layers·kv_dim].
        let kv_heads = if family == Family::Glm { 8 } else { 2 };
        let raw = r.f16_bytes(2 * n_layers * kv_heads * pre_seq_len * hd);
        let mut rows = vec![0u8; raw.len()];
        for i in 0..2 * n_layers {
            for g in 0..kv_heads {
                for p in 0..pre_seq_len {
                    for d in 0..hd {
                        let src = ((i * kv_heads + g) * pre_seq_len + p) * hd + d;
                        let dst = p * 2 * n_layers * kv_heads * hd + (i * kv_heads + g) * hd + d;
                        rows[2 * dst..2 * dst + 2].copy_from_slice(&raw[2 * src..2 * src + 2]);
                    }
                }
            }
        }
        let shape = vec![pre_seq_len, 2 * n_layers * kv_heads * hd];
        t.push((
            "transformer.prefix_encoder.embedding.weight".into(),
            Dtype::F16,
            shape,
            rows,
        ));
    }
    let config = match family {
        Family::Glm => {
            let p = "transformer.layers.0";
            read(
                &mut r,
                &mut t,
                "transformer.word_embeddings.weight",
                &[5, DIM],
            );
            for (name, shape) in [
                ("input_layernorm.weight", vec![DIM]),
                ("input_layernorm.bias", vec![DIM]),
                ("attention.query_key_value.weight", vec![3 * DIM, DIM]),
                ("attention.query_key_value.bias", vec![3 * DIM]),
                ("attention.dense.weight", vec![DIM, DIM]),
                ("attention.dense.bias", vec![DIM]),
                ("post_attention_layernorm.weight", vec![DIM]),
                ("post_attention_layernorm.bias", vec![DIM]),
                ("mlp.dense_h_to_4h.weight", vec![4 * DIM, DIM]),
                ("mlp.dense_h_to_4h.bias", vec![4 * DIM]),
                ("mlp.dense_4h_to_h.weight", vec![DIM, 4 * DIM]),
                ("mlp.dense_4h_to_h.bias", vec![DIM]),
            ] {
                read(&mut r, &mut t, &format!("{p}.{name}"), &shape);
            }
            read(&mut r, &mut t, "transformer.final_layernorm.weight", &[DIM]);
            read(&mut r, &mut t, "transformer.final_layernorm.bias", &[DIM]);
            // The prompt [0, 1, 2] is read as `[MASK]`-free `… [gMASK] sop`: the reference
            // positions [[0, 1, 1], [0, 0, 1]] and mask put [gMASK] at 1 and sop at 2.
            serde_json::json!({
                "model_type": "chatglm", "hidden_size": DIM, "num_layers": n_layers,
                "num_attention_heads": 8, "inner_hidden_size": 4 * DIM, "vocab_size": 5,
                "max_sequence_length": 16, "position_encoding_2d": true,
                "layernorm_epsilon": 1e-5, "bos_token_id": 2, "gmask_token_id": 1,
                "mask_token_id": 4, "tie_word_embeddings": true,
                "pre_seq_len": if prefix { Some(pre_seq_len) } else { None },
            })
        }
        Family::Glm2 | Family::Glm4 => {
            let p = "transformer.encoder.layers.0";
            read(
                &mut r,
                &mut t,
                "transformer.embedding.word_embeddings.weight",
                &[5, DIM],
            );
            for (name, shape) in [
                ("input_layernorm.weight", vec![DIM]),
                ("self_attention.query_key_value.weight", vec![48, DIM]),
                ("self_attention.query_key_value.bias", vec![48]),
                ("self_attention.dense.weight", vec![DIM, DIM]),
                ("post_attention_layernorm.weight", vec![DIM]),
                ("mlp.dense_h_to_4h.weight", vec![96, DIM]),
                ("mlp.dense_4h_to_h.weight", vec![DIM, 48]),
            ] {
                read(&mut r, &mut t, &format!("{p}.{name}"), &shape);
            }
            read(
                &mut r,
                &mut t,
                "transformer.encoder.final_layernorm.weight",
                &[DIM],
            );
            let eps = if family == Family::Glm4 {
                1.5625e-7
            } else {
                1e-5
            };
            serde_json::json!({
                "model_type": "chatglm", "hidden_size": DIM, "num_layers": n_layers,
                "num_attention_heads": 8, "kv_channels": hd, "ffn_hidden_size": 48,
                "padded_vocab_size": 5, "seq_length": 16, "layernorm_epsilon": eps,
                "rmsnorm": true, "multi_query_attention": true, "multi_query_group_num": 2,
                "add_qkv_bias": true, "add_bias_linear": false, "tie_word_embeddings": true,
                "pre_seq_len": if prefix { Some(pre_seq_len) } else { None },
            })
        }
        Family::Baichuan { alibi } => {
            let p = "model.layers.0";
            read(&mut r, &mut t, "model.embed_tokens.weight", &[5, DIM]);
            for (name, shape) in [
                ("input_layernorm.weight", vec![DIM]),
                ("self_attn.W_pack.weight", vec![3 * DIM, DIM]),
                ("self_attn.o_proj.weight", vec![DIM, DIM]),
                ("post_attention_layernorm.weight", vec![DIM]),
                ("mlp.gate_proj.weight", vec![96, DIM]),
                ("mlp.down_proj.weight", vec![DIM, 96]),
                ("mlp.up_proj.weight", vec![96, DIM]),
            ] {
                read(&mut r, &mut t, &format!("{p}.{name}"), &shape);
            }
            read(&mut r, &mut t, "model.norm.weight", &[DIM]);
            let mut c = serde_json::json!({
                "model_type": "baichuan", "hidden_size": DIM, "intermediate_size": 96,
                "num_hidden_layers": n_layers, "num_attention_heads": 8, "vocab_size": 5,
                "rms_norm_eps": 1e-6, "hidden_act": "silu", "tie_word_embeddings": true,
                "model_max_length": 16,
            });
            if !alibi {
                c["max_position_embeddings"] = 16.into();
            }
            c
        }
        Family::InternLm => {
            let p = "model.layers.0";
            read(&mut r, &mut t, "model.embed_tokens.weight", &[5, DIM]);
            read(
                &mut r,
                &mut t,
                &format!("{p}.input_layernorm.weight"),
                &[DIM],
            );
            // chatglm.cpp stores q, k, v concatenated; InternLM's checkpoints keep them apart.
            let w = r.f32s(3 * DIM * DIM);
            let b = r.f32s(3 * DIM);
            for (i, name) in ["q_proj", "k_proj", "v_proj"].iter().enumerate() {
                let rows = w[i * DIM * DIM..(i + 1) * DIM * DIM].to_vec();
                let bias = b[i * DIM..(i + 1) * DIM].to_vec();
                t.push(f32_tensor(
                    &format!("{p}.self_attn.{name}.weight"),
                    &[DIM, DIM],
                    rows,
                ));
                t.push(f32_tensor(
                    &format!("{p}.self_attn.{name}.bias"),
                    &[DIM],
                    bias,
                ));
            }
            for (name, shape) in [
                ("self_attn.o_proj.weight", vec![DIM, DIM]),
                ("self_attn.o_proj.bias", vec![DIM]),
                ("post_attention_layernorm.weight", vec![DIM]),
                ("mlp.gate_proj.weight", vec![96, DIM]),
                ("mlp.up_proj.weight", vec![96, DIM]),
                ("mlp.down_proj.weight", vec![DIM, 96]),
            ] {
                read(&mut r, &mut t, &format!("{p}.{name}"), &shape);
            }
            read(&mut r, &mut t, "model.norm.weight", &[DIM]);
            serde_json::json!({
                "model_type": "internlm", "hidden_size": DIM, "intermediate_size": 96,
                "num_hidden_layers": n_layers, "num_attention_heads": 8, "vocab_size": 5,
                "rms_norm_eps": 1e-6, "hidden_act": "silu", "bias": true,
                "max_position_embeddings": 16, "tie_word_embeddings": true,
            })
        }
    };
    let mut steps = Vec::new();
    for n in [3, 1, 1] {
        let ids = r.ids(n);
        steps.push((ids, r.f32s(n * DIM)));
    }
    assert!(r.at_end(), "{file}: bytes left after the x/y tail");
    let views: Vec<(String, TensorView<'_>)> = t
        .iter()
        .map(|(name, dtype, shape, bytes)| {
            let view = TensorView::new(*dtype, shape.clone(), bytes).expect("tensor view");
            (name.clone(), view)
        })
        .collect();
    safetensors::tensor::serialize_to_file(views, None, &dir.join("model.safetensors"))
        .expect("write model.safetensors");
    std::fs::write(dir.join("config.json"), config.to_string()).expect("write config.json");
    steps
}
