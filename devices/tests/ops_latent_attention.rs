//! Multi-head latent attention in its absorbed form (DeepSeek-V2, DeepSeek-AI 2024, §2.1) on
//! the CPU device: `Op::Attention` and `Op::PagedAttention` whose values are the latent keys
//! themselves, with a decoupled RoPE part of the scores, against a naive f64 formula; and
//! `Op::HeadLinear` against one `Op::Linear` per head.

#[macro_use]
mod common;

use common::*;
use flm_core::{AttentionOperands, AttentionParams, Data, DataType, DecoupledRope, Op, PagedSeq};

/// One latent attention shape: `n` query rows from `start_pos`, `heads` query heads over
/// `kv_heads` latent heads of `latent` values, and a RoPE part of `rope` per head.
#[derive(Debug, Clone, Copy)]
struct Case {
    n: usize,
    start_pos: usize,
    heads: usize,
    kv_heads: usize,
    latent: usize,
    rope: usize,
}

/// The operands of a case: queries, their RoPE part, the latent cache and the rotated keys,
/// each as a tensor and its values. Rows past `start_pos + n` hold NaN: never read.
struct Operands {
    q: (Data, Vec<f32>),
    q_rope: (Data, Vec<f32>),
    latent: (Data, Vec<f32>),
    rope_keys: (Data, Vec<f32>),
}

impl Case {
    /// `n` rows from `start_pos`, `heads` query heads over one latent head.
    fn one_latent(n: usize, start_pos: usize, heads: usize, latent: usize, rope: usize) -> Case {
        Case {
            n,
            start_pos,
            heads,
            kv_heads: 1,
            latent,
            rope,
        }
    }

    fn operands(&self, seed: u64, f16: bool) -> Operands {
        let mut rng = rng(seed);
        let rows = self.start_pos + self.n + 2;
        let filled = self.start_pos + self.n;
        let mut cache = |width: usize| {
            let mut values = uniform(&mut rng, rows * width, 1.0);
            values[filled * width..].fill(f32::NAN);
            let data = f32_data(&[rows, width], &values);
            if f16 {
                let data = to_f16(&data);
                let rounded = data.to_f32_vec().unwrap();
                (data, rounded)
            } else {
                (data, values)
            }
        };
        let latent = cache(self.kv_heads * self.latent);
        let rope_keys = cache(self.kv_heads * self.rope);
        Operands {
            q: random_f32(&mut rng, &[self.n, self.heads * self.latent], 0.5),
            q_rope: random_f32(&mut rng, &[self.n, self.heads * self.rope], 0.5),
            latent,
            rope_keys,
        }
    }

    fn params(&self) -> AttentionParams {
        AttentionParams::causal(self.heads, self.kv_heads, 0.7 / (self.latent as f32).sqrt())
    }

    /// `out_h = Σ_t softmax_t(scale·(q_h·c_t + q_rope_h·k_rope_t))·c_t`, in f64, and a
    /// tolerance per element (as `ops_attention`'s: the f32 score errors times the largest
    /// value, plus the weighted sum's rounding).
    fn reference(&self, o: &Operands) -> (Vec<f64>, Vec<f64>) {
        let (dl, dr, group) = (self.latent, self.rope, self.heads / self.kv_heads);
        let scale = self.params().scale as f64;
        let mut want = vec![0.0; self.n * self.heads * dl];
        let mut tol = vec![0.0; want.len()];
        for i in 0..self.n {
            let len = self.start_pos + i + 1;
            for h in 0..self.heads {
                let kv = h / group;
                let qh = &o.q.1[(i * self.heads + h) * dl..][..dl];
                let qr = &o.q_rope.1[(i * self.heads + h) * dr..][..dr];
                let latent = |t: usize| &o.latent.1[(t * self.kv_heads + kv) * dl..][..dl];
                let rope = |t: usize| &o.rope_keys.1[(t * self.kv_heads + kv) * dr..][..dr];
                let dot = |a: &[f32], b: &[f32]| -> (f64, f64) {
                    a.iter().zip(b).fold((0.0, 0.0), |(s, m), (&x, &y)| {
                        let p = x as f64 * y as f64;
                        (s + p, m + p.abs())
                    })
                };
                let mut max_mag = 0.0f64;
                let scores: Vec<f64> = (0..len)
                    .map(|t| {
                        let (a, ma) = dot(qh, latent(t));
                        let (b, mb) = dot(qr, rope(t));
                        max_mag = max_mag.max((ma + mb) * scale);
                        (a + b) * scale
                    })
                    .collect();
                let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let weights: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
                let total: f64 = weights.iter().sum();
                let out = &mut want[(i * self.heads + h) * dl..][..dl];
                let mut vmax = 0.0f64;
                for (t, w) in weights.iter().enumerate() {
                    for (o, &x) in out.iter_mut().zip(latent(t)) {
                        *o += w / total * x as f64;
                        vmax = vmax.max((x as f64).abs());
                    }
                }
                let t = vmax * (2.0 * (DOT_REL * max_mag + 4.0 * EPS) + EPS * (len as f64).sqrt());
                tol[(i * self.heads + h) * dl..][..dl].fill(t);
            }
        }
        (want, tol)
    }

    /// The case's attention over a contiguous cache.
    fn attend(&self, o: &Operands) -> Vec<f32> {
        output_of(&[self.n, self.heads * self.latent], |output| {
            run(Op::Attention {
                operands: self.operands_of(o, (&o.latent.0, &o.rope_keys.0), output),
                start_pos: self.start_pos,
            })
        })
    }

    /// The operands of the case's queries over the caches `(latent, rope_keys)`.
    fn operands_of<'a>(
        &self,
        o: &'a Operands,
        (latent, rope_keys): (&'a Data, &'a Data),
        output: &'a mut Data,
    ) -> AttentionOperands<'a> {
        AttentionOperands {
            q: &o.q.0,
            cache_k: latent,
            cache_v: latent,
            rope: Some(DecoupledRope {
                q: &o.q_rope.0,
                cache: rope_keys,
            }),
            params: self.params(),
            sinks: None,
            output,
        }
    }
}

/// Decode and prefill, one latent head (DeepSeek's MQA-like absorbed form) and two, RoPE
/// parts of odd widths, DeepSeek-V2's shapes (16 heads, latent 512, RoPE 64) past the
/// parallel threshold; f32 and f16 caches.
#[test]
fn latent_attention_matches_formula() {
    let cases = [
        (1, 0, 4, 1, 16, 8),
        (1, 37, 16, 1, 512, 64),
        (5, 0, 4, 1, 33, 7),
        (6, 11, 6, 2, 24, 5),
        (9, 20, 3, 1, 64, 16),
    ];
    for (seed, (n, start_pos, heads, kv_heads, latent, rope)) in cases.into_iter().enumerate() {
        let c = Case {
            n,
            start_pos,
            heads,
            kv_heads,
            latent,
            rope,
        };
        for f16 in [false, true] {
            let o = c.operands(seed as u64, f16);
            let (want, tol) = c.reference(&o);
            let what = format!("latent attention {c:?}, f16 cache {f16}");
            assert_close(&what, &c.attend(&o), &want, |i| tol[i]);
        }
    }
}

/// A row's result has the same bits alone (decode) as among the rows of a prefill.
#[test]
fn latent_attention_rows_do_not_depend_on_the_batch() {
    let prefill = Case::one_latent(7, 2, 16, 64, 16);
    let o = prefill.operands(7, false);
    let all = prefill.attend(&o);
    let width = prefill.heads * prefill.latent;
    for i in [0, 3, 6] {
        let row = |d: &Data| {
            let cols = d.cols();
            f32_data(&[1, cols], &d.to_f32_vec().unwrap()[i * cols..][..cols])
        };
        let one = Operands {
            q: (row(&o.q.0), Vec::new()),
            q_rope: (row(&o.q_rope.0), Vec::new()),
            latent: (o.latent.0.clone(), Vec::new()),
            rope_keys: (o.rope_keys.0.clone(), Vec::new()),
        };
        let decode = Case {
            n: 1,
            start_pos: prefill.start_pos + i,
            ..prefill
        };
        assert_same_bits(
            &format!("row {i}"),
            &decode.attend(&one),
            &all[i * width..][..width],
        );
    }
}

/// The paged form over a pool whose blocks hold the same rows gives the contiguous form's
/// bits.
#[test]
fn paged_latent_attention_equals_contiguous() {
    let c = Case::one_latent(5, 6, 8, 40, 8);
    let o = c.operands(11, false);
    let want = c.attend(&o);
    // Blocks of 4 positions, placed in reverse in a pool of 4 blocks.
    let (block_size, table) = (4usize, vec![3u32, 2, 1]);
    let pool = |d: &Data| {
        let (cols, values) = (d.cols(), d.to_f32_vec().unwrap());
        let mut rows = vec![0.0f32; 16 * cols];
        for t in 0..c.start_pos + c.n {
            let r = table[t / block_size] as usize * block_size + t % block_size;
            rows[r * cols..][..cols].copy_from_slice(&values[t * cols..][..cols]);
        }
        f32_data(&[16, cols], &rows)
    };
    let (latent, rope_keys) = (pool(&o.latent.0), pool(&o.rope_keys.0));
    let seqs = [PagedSeq {
        n_rows: c.n,
        start_pos: c.start_pos,
        blocks: &table,
    }];
    let got = output_of(&[c.n, c.heads * c.latent], |output| {
        run(Op::PagedAttention {
            operands: c.operands_of(&o, (&latent, &rope_keys), output),
            block_size,
            seqs: &seqs,
        })
    });
    assert_same_bits("paged latent attention", &got, &want);
}

/// Each head's product has the bits of `Op::Linear` over that head's columns, for decode
/// and prefill rows.
fn head_linear_equals_linear_per_head(dtype: DataType) {
    let mut rng = rng(0x41);
    for (n, heads, k, m) in [(1, 4, 32, 48), (5, 3, 64, 16), (2, 16, 128, 96)] {
        let weights: Vec<Data> = (0..heads)
            .map(|_| {
                let w = random_weight(&mut rng, &[m, k], dtype).0;
                if flm_core::panels::has_panels(dtype) {
                    w.to_panels().unwrap()
                } else {
                    w
                }
            })
            .collect();
        let (x, xs) = random_f32(&mut rng, &[n, heads * k], 1.0);
        let got = output_of(&[n, heads * m], |output| {
            run(Op::HeadLinear {
                input: &x,
                weights: &weights,
                output,
            })
        });
        for (h, w) in weights.iter().enumerate() {
            let cols: Vec<f32> = xs
                .chunks_exact(heads * k)
                .flat_map(|row| row[h * k..][..k].to_vec())
                .collect();
            let input = f32_data(&[n, k], &cols);
            let want = output_of(&[n, m], |output| {
                run(Op::Linear {
                    input: &input,
                    weight: w,
                    bias: None,
                    output,
                })
            });
            let got: Vec<f32> = got
                .chunks_exact(heads * m)
                .flat_map(|row| row[h * m..][..m].to_vec())
                .collect();
            assert_same_bits(
                &format!("{dtype} head {h} of {n}×{heads}×{k}→{m}"),
                &got,
                &want,
            );
        }
    }
}

dtype_tests!([f32: F32, bf16: BF16, i8: I8, i4sg32: I4SymG32] head_linear_equals_linear_per_head);
