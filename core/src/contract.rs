//! The op contract: every [`Op`]'s shape, dtype and range rules, written once.
//!
//! [`Op::validate`] checks an op against the rules its variant documents and returns a
//! [`CheckedOp`], the only form a [`crate::BaseDevice`] runs, so that no device repeats
//! these checks and none can be handed an op that skipped them. Devices keep only what is
//! theirs to refuse (a dtype without a kernel, in [`crate::BaseDevice::supports`]).

use crate::kv_cache::check_kv_dtype;
use crate::{
    AttentionOperands, AttentionParams, Data, DataType, Error, ExpertActivation, GroupScore,
    Location, MoeRouting, Op, PagedSeq, Result, RopeTable, TokenIds,
};

/// An [`Op`] whose operands passed [`Op::validate`].
#[derive(Debug)]
pub struct CheckedOp<'a> {
    op: Op<'a>,
    location: Location,
    step: bool,
}

impl<'a> CheckedOp<'a> {
    /// The op, to read its operands.
    pub fn op(&self) -> &Op<'a> {
        &self.op
    }

    /// The op, to take its operands apart.
    pub fn into_op(self) -> Op<'a> {
        self.op
    }

    /// Where all its tensor operands are.
    pub fn location(&self) -> Location {
        self.location
    }

    /// Whether its token ids and positions are those of the step being run
    /// ([`crate::Executor::run_step`]): the [`crate::StepInputs`] of a captured step, which
    /// a replay reads from device memory (see [`crate::StepGraph`]).
    pub fn follows_step(&self) -> bool {
        self.step
    }

    /// Marks it as following the step's inputs ([`CheckedOp::follows_step`]).
    pub(crate) fn at_step(mut self) -> CheckedOp<'a> {
        self.step = true;
        self
    }
}

fn shape(op: &'static str, msg: String) -> Error {
    Error::Shape { op, msg }
}

/// `Ok` when every tensor of `tensors` is f32.
fn all_f32(op: &'static str, tensors: &[(&str, &Data)]) -> Result<()> {
    match tensors.iter().find(|(_, d)| d.dtype() != DataType::F32) {
        None => Ok(()),
        Some((name, d)) => Err(Error::DType {
            op,
            msg: format!("{name} must be f32, found {}", d.dtype()),
        }),
    }
}

/// `Ok` when every position of `positions` is inside `table`.
fn positions_fit(table: &RopeTable, positions: &[u32]) -> Result<()> {
    match positions.iter().find(|&&p| p as usize >= table.max_pos()) {
        None => Ok(()),
        Some(&p) => Err(Error::ContextOverflow {
            needed: p as usize + 1,
            max: table.max_pos(),
        }),
    }
}

/// The rules of [`Op::Embedding`]: an f32 output row of the table's width per token, a
/// table without permuted columns, and host ids inside the vocabulary or an i32 id tensor.
fn embedding(table: &Data, tokens: &TokenIds<'_>, output: &Data) -> Result<()> {
    all_f32("Embedding", &[("output", output)])?;
    if table.input_perm().is_some() {
        return Err(Error::DType {
            op: "Embedding",
            msg: "a table with permuted columns".into(),
        });
    }
    let (vocab_size, dim) = (table.rows(), table.cols());
    if output.rows() != tokens.len() || output.cols() != dim || dim == 0 {
        return Err(shape(
            "Embedding",
            format!(
                "output {:?} for {} tokens of dim {dim}",
                output.shape(),
                tokens.len()
            ),
        ));
    }
    match tokens {
        TokenIds::Host(ids) => match ids.iter().find(|&&t| t as usize >= vocab_size) {
            Some(&id) => Err(Error::TokenOutOfRange { id, vocab_size }),
            None => Ok(()),
        },
        TokenIds::Tensor(ids) if ids.dtype() != DataType::I32 => Err(Error::DType {
            op: "Embedding",
            msg: format!("token ids must be i32, found {}", ids.dtype()),
        }),
        TokenIds::Tensor(_) => Ok(()),
    }
}

/// The rules of [`Op::RmsNorm`]: f32 input and output of one shape, a weight per column.
fn rms_norm(input: &Data, weight: &Data, output: &Data) -> Result<()> {
    all_f32("RmsNorm", &[("input", input), ("output", output)])?;
    let dim = input.cols();
    if dim == 0 || weight.numel() != dim || output.shape() != input.shape() {
        return Err(shape(
            "RmsNorm",
            format!(
                "input {:?}, weight {:?}, output {:?}",
                input.shape(),
                weight.shape(),
                output.shape()
            ),
        ));
    }
    Ok(())
}

/// The rules of [`Op::LayerNorm`]: f32 input and output of one shape, a weight and a bias
/// per column.
fn layer_norm(input: &Data, weight: &Data, bias: &Data, output: &Data) -> Result<()> {
    all_f32("LayerNorm", &[("input", input), ("output", output)])?;
    let dim = input.cols();
    if dim == 0 || weight.numel() != dim || bias.numel() != dim || output.shape() != input.shape() {
        return Err(shape(
            "LayerNorm",
            format!(
                "input {:?}, weight {:?}, bias {:?}, output {:?}",
                input.shape(),
                weight.shape(),
                bias.shape(),
                output.shape()
            ),
        ));
    }
    Ok(())
}

/// The rules of one [`crate::LinearPart`] (or [`Op::Linear`]) over `input`; a weight's
/// [`Data::input_perm`] was checked when it was attached, its memory is checked with the
/// operands'.
fn linear_part(input: &Data, weight: &Data, bias: Option<&Data>, output: &Data) -> Result<()> {
    all_f32("Linear", &[("input", input), ("output", output)])?;
    if weight.dtype() == DataType::I32 {
        return Err(Error::DType {
            op: "Linear",
            msg: "i32 weights (indices, not values)".into(),
        });
    }
    let (n, k, m) = (input.rows(), input.cols(), weight.rows());
    if weight.cols() != k
        || output.rows() != n
        || output.cols() != m
        || bias.is_some_and(|b| b.numel() != m)
        || k == 0
    {
        return Err(shape(
            "Linear",
            format!(
                "input {:?}, weight {:?}, bias {:?}, output {:?}",
                input.shape(),
                weight.shape(),
                bias.map(|b| b.shape().to_vec()),
                output.shape()
            ),
        ));
    }
    Ok(())
}

/// The rules of [`Op::Linears`]: at least one part, each a [`linear_part`] over `input`.
fn linears(input: &Data, parts: &[crate::LinearPart<'_>]) -> Result<()> {
    if parts.is_empty() {
        return Err(shape("Linears", "no parts".into()));
    }
    parts
        .iter()
        .try_for_each(|p| linear_part(input, p.weight, p.bias, p.output))
}

/// The rules of [`Op::HeadLinear`]: at least one head, f32 activations of `heads` equal
/// blocks, and weights of one shape, each a valid Linear weight for its block.
fn head_linear(input: &Data, weights: &[Data], output: &Data) -> Result<()> {
    const OP: &str = "HeadLinear";
    all_f32(OP, &[("input", input), ("output", output)])?;
    let heads = weights.len();
    let (out, k) = weights.first().map_or((0, 0), |w| (w.rows(), w.cols()));
    if heads == 0
        || k == 0
        || weights
            .iter()
            .any(|w| w.shape() != [out, k] || w.dtype() == DataType::I32)
        || input.cols() != heads * k
        || output.cols() != heads * out
        || output.rows() != input.rows()
    {
        return Err(shape(
            OP,
            format!(
                "input {:?}, {heads} weights of {:?}, output {:?}",
                input.shape(),
                weights.first().map(|w| w.shape().to_vec()),
                output.shape()
            ),
        ));
    }
    Ok(())
}

/// The rules of [`Op::Rope`]: f32 `x` of `n_heads` heads of the table's width, its rows from
/// `start_pos` inside the table.
fn rope(x: &Data, table: &RopeTable, n_heads: usize, start_pos: usize) -> Result<()> {
    all_f32("Rope", &[("x", x)])?;
    let head_dim = table.head_dim();
    if x.cols() != n_heads * head_dim || head_dim == 0 {
        return Err(shape(
            "Rope",
            format!("x {:?} for {n_heads} heads of {head_dim}", x.shape()),
        ));
    }
    // Saturating: an absurd `start_pos` is a context overflow, not a panic.
    let needed = start_pos.saturating_add(x.rows());
    if needed > table.max_pos() {
        return Err(Error::ContextOverflow {
            needed,
            max: table.max_pos(),
        });
    }
    Ok(())
}

/// The rules of [`Op::RopeRows`]: f32 `x` of `n_heads` heads of the table's width, a
/// position per row, each inside the table.
fn rope_rows(x: &Data, table: &RopeTable, n_heads: usize, positions: &[u32]) -> Result<()> {
    all_f32("RopeRows", &[("x", x)])?;
    let head_dim = table.head_dim();
    if x.cols() != n_heads * head_dim || head_dim == 0 || x.rows() != positions.len() {
        return Err(shape(
            "RopeRows",
            format!(
                "x {:?} for {n_heads} heads of {head_dim} and {} positions",
                x.shape(),
                positions.len()
            ),
        ));
    }
    positions_fit(table, positions)
}

/// The rules of [`Op::Rope2d`]: f32 `x` of `n_heads` heads of twice the table's width, a
/// position and a block position per row, all inside the table.
fn rope2d(
    x: &Data,
    table: &RopeTable,
    n_heads: usize,
    positions: &[u32],
    block_positions: &[u32],
) -> Result<()> {
    all_f32("Rope2d", &[("x", x)])?;
    let (half, n) = (table.head_dim(), x.rows());
    if half == 0
        || x.cols() != n_heads * 2 * half
        || positions.len() != n
        || block_positions.len() != n
    {
        return Err(shape(
            "Rope2d",
            format!(
                "x {:?} for {n_heads} heads of 2 × {half}, {} positions, {} block positions",
                x.shape(),
                positions.len(),
                block_positions.len()
            ),
        ));
    }
    positions_fit(table, positions)?;
    positions_fit(table, block_positions)
}

/// The rules of [`Op::CopyRows`]: an f32 source, a KV cache dtype destination of its
/// width, and both row ranges inside their tensors.
fn copy_rows(
    (src, src_row): (&Data, usize),
    (dst, dst_row): (&Data, usize),
    n_rows: usize,
) -> Result<()> {
    all_f32("CopyRows", &[("src", src)])?;
    check_kv_dtype("CopyRows", dst.dtype())?;
    if dst.cols() != src.cols() {
        return Err(shape(
            "CopyRows",
            format!("src {:?}, dst {:?}", src.shape(), dst.shape()),
        ));
    }
    // Saturating: absurd row indices are out of bounds, not an arithmetic panic.
    let (src_end, dst_end) = (
        src_row.saturating_add(n_rows),
        dst_row.saturating_add(n_rows),
    );
    if src_end > src.rows() || dst_end > dst.rows() {
        return Err(Error::OutOfBounds(format!(
            "copying rows {src_row}..{src_end} of {:?} to rows {dst_row}..{dst_end} of {:?}",
            src.shape(),
            dst.shape()
        )));
    }
    Ok(())
}

/// The rules of [`Op::ScatterRows`]: an f32 source with a row index per row, a KV cache
/// dtype destination of its width, and every index inside it.
fn scatter_rows(src: &Data, rows: &[u32], dst: &Data) -> Result<()> {
    all_f32("ScatterRows", &[("src", src)])?;
    check_kv_dtype("ScatterRows", dst.dtype())?;
    if dst.cols() != src.cols() || src.rows() != rows.len() {
        return Err(shape(
            "ScatterRows",
            format!(
                "src {:?}, {} rows, dst {:?}",
                src.shape(),
                rows.len(),
                dst.shape()
            ),
        ));
    }
    match rows.iter().find(|&&r| r as usize >= dst.rows()) {
        Some(&r) => Err(Error::OutOfBounds(format!(
            "scattering to row {r} of {:?}",
            dst.shape()
        ))),
        None => Ok(()),
    }
}

/// The rules of [`Op::SiluMul`] and [`Op::GeluMul`] (`op` names which): f32 gate, up and
/// output of one shape.
fn silu_gelu_mul(op: &'static str, gate: &Data, up: &Data, output: &Data) -> Result<()> {
    all_f32(op, &[("gate", gate), ("up", up), ("output", output)])?;
    if gate.shape() != up.shape() || gate.shape() != output.shape() {
        return Err(shape(
            op,
            format!(
                "gate {:?}, up {:?}, output {:?}",
                gate.shape(),
                up.shape(),
                output.shape()
            ),
        ));
    }
    Ok(())
}

/// The rules of [`Op::Add`]: f32 `x` and `y` of one shape.
fn add(x: &Data, y: &Data) -> Result<()> {
    all_f32("Add", &[("x", x), ("y", y)])?;
    if x.shape() != y.shape() {
        return Err(shape(
            "Add",
            format!("x {:?}, y {:?}", x.shape(), y.shape()),
        ));
    }
    Ok(())
}

/// The rules of [`Op::GatedAdd`]: f32 `x` and `y` of one shape, and an f32 gate of one
/// column with a row per row of `x`.
fn gated_add(x: &Data, y: &Data, gate: &Data) -> Result<()> {
    all_f32("GatedAdd", &[("x", x), ("y", y), ("gate", gate)])?;
    if x.shape() != y.shape() || gate.shape() != [x.rows(), 1] {
        return Err(shape(
            "GatedAdd",
            format!(
                "x {:?}, y {:?}, gate {:?}",
                x.shape(),
                y.shape(),
                gate.shape()
            ),
        ));
    }
    Ok(())
}

/// The rules of [`Op::MoeFfn`]: a router row per expert of the router, the experts a
/// nonempty run `first..first + experts.len()` of its rows, every expert a SwiGLU of one
/// inner width from `input`'s columns back to them, and a routing that fits the router's
/// experts ([`moe_routing`]).
fn moe_ffn(
    input: &Data,
    (router, experts, first): (&Data, &[crate::Expert], usize),
    (routing, activation): (&MoeRouting<'_>, ExpertActivation),
    output: &Data,
) -> Result<()> {
    const OP: &str = "MoeFfn";
    all_f32(OP, &[("input", input), ("output", output)])?;
    let dim = input.cols();
    if dim == 0 || output.shape() != input.shape() {
        return Err(shape(
            OP,
            format!("input {:?}, output {:?}", input.shape(), output.shape()),
        ));
    }
    let n_experts = router.rows();
    if n_experts == 0 || router.cols() != dim {
        return Err(shape(
            OP,
            format!("router {:?}, input {:?}", router.shape(), input.shape()),
        ));
    }
    let end = first.checked_add(experts.len());
    if experts.is_empty() || end.is_none_or(|end| end > n_experts) {
        return Err(shape(
            OP,
            format!(
                "experts {first}..{first}+{} of a router of {n_experts} experts (a nonempty \
                 run of its rows)",
                experts.len()
            ),
        ));
    }
    moe_routing(routing, n_experts)?;
    let inner = experts[0].gate.rows();
    // The errors name an expert by its router index.
    for (i, e) in (first..).zip(experts) {
        let ok = |d: &Data, rows, cols| d.rows() == rows && d.cols() == cols;
        if inner == 0
            || !ok(&e.gate, inner, dim)
            || !ok(&e.up, inner, dim)
            || !ok(&e.down, dim, inner)
        {
            return Err(shape(
                OP,
                format!(
                    "expert {i}: gate {:?}, up {:?}, down {:?} for dim {dim} and inner width {inner}",
                    e.gate.shape(),
                    e.up.shape(),
                    e.down.shape()
                ),
            ));
        }
        if let Some(biases) = &e.biases {
            let [g, u, d] = biases;
            all_f32(OP, &[("gate bias", g), ("up bias", u), ("down bias", d)])?;
            if g.shape() != [inner] || u.shape() != [inner] || d.shape() != [dim] {
                return Err(shape(
                    OP,
                    format!(
                        "expert {i}: biases {:?}, {:?}, {:?} for inner width {inner} and dim {dim}",
                        g.shape(),
                        u.shape(),
                        d.shape()
                    ),
                ));
            }
        }
    }
    if let ExpertActivation::ClampedSwiGlu { alpha, limit } = activation {
        if !(alpha.is_finite() && limit.is_finite() && limit > 0.0) {
            return Err(Error::InvalidArgument(format!(
                "{OP}: clamped SwiGLU with alpha {alpha} and limit {limit} (finite; the limit positive)"
            )));
        }
    }
    Ok(())
}

/// The rules of a [`MoeRouting`] over `n_experts` experts: groups that divide them into
/// runs (of two experts at least for [`GroupScore::SumOfTop2`]), `1..=n_groups` of them
/// chosen, `top_k` in `1..=` the experts they hold, an f32 choice bias of one value per
/// expert, and a finite scale.
fn moe_routing(routing: &MoeRouting<'_>, n_experts: usize) -> Result<()> {
    const OP: &str = "MoeFfn";
    let mut choosable = n_experts;
    if let Some(g) = routing.groups {
        let per_group = n_experts.checked_div(g.n_groups).unwrap_or(0);
        let least = match g.score {
            GroupScore::Max => 1,
            GroupScore::SumOfTop2 => 2,
        };
        if g.n_groups == 0 || !n_experts.is_multiple_of(g.n_groups) || per_group < least {
            return Err(shape(
                OP,
                format!(
                    "{n_experts} experts in {} groups scored by {:?}",
                    g.n_groups, g.score
                ),
            ));
        }
        if g.top_groups == 0 || g.top_groups > g.n_groups {
            return Err(Error::InvalidArgument(format!(
                "{OP}: top_groups = {} must be in 1..={} (the groups)",
                g.top_groups, g.n_groups
            )));
        }
        choosable = g.top_groups * per_group;
    }
    if routing.top_k == 0 || routing.top_k > choosable {
        return Err(shape(
            OP,
            format!(
                "top {} of {n_experts} experts, {choosable} of them in the chosen groups",
                routing.top_k
            ),
        ));
    }
    for (name, bias) in [
        ("choice_bias", routing.choice_bias),
        ("logit_bias", routing.logit_bias),
    ] {
        let Some(bias) = bias else { continue };
        all_f32(OP, &[(name, bias)])?;
        if bias.shape() != [n_experts] {
            return Err(shape(
                OP,
                format!("{name} {:?} for {n_experts} experts", bias.shape()),
            ));
        }
    }
    if !routing.scale.is_finite() {
        return Err(Error::InvalidArgument(format!(
            "{OP}: the routing scale must be finite, got {}",
            routing.scale
        )));
    }
    Ok(())
}

/// The rules of [`Op::SoftCap`]: an f32 `x` and a positive, finite cap.
fn soft_cap(x: &Data, cap: f32) -> Result<()> {
    all_f32("SoftCap", &[("x", x)])?;
    positive_cap("SoftCap", Some(cap))
}

/// The rules of [`Op::Sample`]: valid parameters, one row of f32 logits, i32 history
/// flags and counts of its length, the stream's words and one output id.
fn sample(
    logits: &Data,
    state: &crate::SampleState,
    output: &Data,
    config: &crate::SamplerConfig,
) -> Result<()> {
    const OP: &str = "Sample";
    config.check()?;
    all_f32(OP, &[("logits", logits)])?;
    let crate::SampleState {
        seen,
        counts,
        stream,
    } = state;
    let i32s = [
        ("seen", seen),
        ("counts", counts),
        ("stream", stream),
        ("output", output),
    ];
    if let Some((name, d)) = i32s.iter().find(|(_, d)| d.dtype() != DataType::I32) {
        return Err(Error::DType {
            op: OP,
            msg: format!("{name} must be i32, found {}", d.dtype()),
        });
    }
    let vocab = logits.cols();
    if logits.rows() != 1
        || vocab == 0
        || seen.numel() != vocab
        || counts.numel() != vocab
        || stream.numel() != crate::SAMPLER_STATE_WORDS
        || output.numel() != 1
    {
        return Err(shape(
            OP,
            format!(
                "logits {:?}, seen {:?}, counts {:?}, stream {:?}, output {:?}",
                logits.shape(),
                seen.shape(),
                counts.shape(),
                stream.shape(),
                output.shape()
            ),
        ));
    }
    Ok(())
}

/// The rules of [`Op::Argmax`]: f32 input rows of at least one column, an output id per row.
fn argmax(input: &Data, output: &[u32]) -> Result<()> {
    all_f32("Argmax", &[("input", input)])?;
    if output.len() != input.rows() || input.cols() == 0 {
        return Err(shape(
            "Argmax",
            format!("input {:?}, {} outputs", input.shape(), output.len()),
        ));
    }
    Ok(())
}

/// Checks that a soft-capping value, if any, is positive and finite.
fn positive_cap(op: &'static str, cap: Option<f32>) -> Result<()> {
    match cap {
        Some(c) if !(c.is_finite() && c > 0.0) => Err(Error::InvalidArgument(format!(
            "{op}: a soft cap must be positive and finite, got {c}"
        ))),
        _ => Ok(()),
    }
}

/// The rules of the [`AttentionOperands`] of `op` ([`Op::Attention`] or
/// [`Op::PagedAttention`]): dtypes, head counts that divide, one key head size and one value
/// head size (at most the key's), a decoupled RoPE part of the caches' rows, and a sliding
/// window only without a bidirectional prefix.
fn attention_operands(op: &'static str, operands: &AttentionOperands<'_>) -> Result<()> {
    let AttentionOperands {
        q,
        cache_k,
        cache_v,
        rope,
        sinks,
        ref output,
        params,
    } = *operands;
    let AttentionParams {
        n_heads,
        n_kv_heads,
        ..
    } = params;
    positive_cap(op, params.softcap)?;
    all_f32(op, &[("q", q), ("output", output)])?;
    check_kv_dtype(op, cache_k.dtype())?;
    let caches = [Some(cache_v), rope.map(|r| r.cache)];
    if let Some(other) = caches
        .into_iter()
        .flatten()
        .find(|c| c.dtype() != cache_k.dtype())
    {
        return Err(Error::DType {
            op,
            msg: format!(
                "cache_k is {} and another cache {}: one KV cache dtype",
                cache_k.dtype(),
                other.dtype()
            ),
        });
    }
    if n_heads == 0
        || n_kv_heads == 0
        || !n_heads.is_multiple_of(n_kv_heads)
        || !q.cols().is_multiple_of(n_heads)
        || !output.cols().is_multiple_of(n_heads)
    {
        return Err(shape(
            op,
            format!(
                "{n_heads} query heads, {n_kv_heads} KV heads, q {:?}, output {:?}",
                q.shape(),
                output.shape()
            ),
        ));
    }
    let (head_dim, v_head_dim) = (q.cols() / n_heads, output.cols() / n_heads);
    if head_dim == 0
        || v_head_dim == 0
        || v_head_dim > head_dim
        || cache_k.cols() != n_kv_heads * head_dim
        || cache_v.shape() != [cache_k.rows(), n_kv_heads * v_head_dim]
        || output.rows() != q.rows()
    {
        return Err(shape(
            op,
            format!(
                "q {:?}, caches {:?} and {:?}, output {:?}, {n_heads} heads, {n_kv_heads} KV heads",
                q.shape(),
                cache_k.shape(),
                cache_v.shape(),
                output.shape()
            ),
        ));
    }
    if let Some(r) = rope {
        all_f32(op, &[("rope q", r.q)])?;
        let rope_dim = r.q.cols() / n_heads;
        if rope_dim == 0
            || r.q.shape() != [q.rows(), n_heads * rope_dim]
            || r.cache.shape() != [cache_k.rows(), n_kv_heads * rope_dim]
        {
            return Err(shape(
                op,
                format!(
                    "a decoupled RoPE part of q {:?} and cache {:?} beside q {:?} and cache {:?}",
                    r.q.shape(),
                    r.cache.shape(),
                    q.shape(),
                    cache_k.shape()
                ),
            ));
        }
    }
    if let Some(sinks) = sinks {
        if sinks.dtype() != DataType::F32 {
            return Err(Error::DType {
                op,
                msg: format!("sinks must be f32, found {}", sinks.dtype()),
            });
        }
        if sinks.numel() != n_heads {
            return Err(shape(
                op,
                format!(
                    "sinks {:?}: one per query head, {n_heads} values",
                    sinks.shape()
                ),
            ));
        }
    }
    match (params.sliding_window, params.bidirectional) {
        (None, _) => Ok(()),
        (Some(w), 0) if w > 0 => Ok(()),
        (Some(w), b) => Err(shape(
            op,
            format!(
                "a sliding window of {w} positions (must be positive, and without a \
                 bidirectional prefix; got {b} rows)"
            ),
        )),
    }
}

/// The rules of [`Op::Attention`]: its [`attention_operands`], then `q`'s rows from
/// `start_pos` inside the cache and any bidirectional prefix inside the filled rows.
fn attention(operands: &AttentionOperands<'_>, start_pos: usize) -> Result<()> {
    attention_operands("Attention", operands)?;
    let AttentionOperands {
        q,
        cache_k,
        params: AttentionParams { bidirectional, .. },
        ..
    } = *operands;
    // Saturating: an absurd `start_pos` is a context overflow, not a panic.
    let filled = start_pos.saturating_add(q.rows());
    if filled > cache_k.rows() {
        return Err(Error::ContextOverflow {
            needed: filled,
            max: cache_k.rows(),
        });
    }
    if bidirectional > filled {
        return Err(shape(
            "Attention",
            format!(
                "a bidirectional prefix of {bidirectional} rows, but only {filled} cache rows are filled"
            ),
        ));
    }
    Ok(())
}

/// The rules of [`Op::PagedAttention`]: its [`attention_operands`], then its blocks and
/// sequences ([`paged_seqs`]).
fn paged_attention(
    operands: &AttentionOperands<'_>,
    block_size: usize,
    seqs: &[PagedSeq<'_>],
) -> Result<()> {
    attention_operands("PagedAttention", operands)?;
    if operands.params.bidirectional != 0 {
        return Err(shape(
            "PagedAttention",
            format!(
                "a bidirectional prefix of {} rows (paged attention is causal)",
                operands.params.bidirectional
            ),
        ));
    }
    paged_seqs(operands.q, operands.cache_k.rows(), block_size, seqs)
}

/// The rules of [`Op::PagedAttention`] beyond the heads': whole blocks, the sequences'
/// rows adding up to `q`'s, block tables long enough and inside the pool.
fn paged_seqs(q: &Data, pool_rows: usize, block_size: usize, seqs: &[PagedSeq<'_>]) -> Result<()> {
    const OP: &str = "PagedAttention";
    if block_size == 0 || !pool_rows.is_multiple_of(block_size) {
        return Err(shape(
            OP,
            format!("a pool of {pool_rows} rows in blocks of {block_size}"),
        ));
    }
    let n_blocks = pool_rows / block_size;
    let total = seqs
        .iter()
        .fold(0usize, |sum, s| sum.saturating_add(s.n_rows));
    if total != q.rows() {
        return Err(shape(
            OP,
            format!("the sequences have {total} rows, q {:?}", q.shape()),
        ));
    }
    for s in seqs {
        let end = s.start_pos.saturating_add(s.n_rows);
        let capacity = s.blocks.len().saturating_mul(block_size);
        if end > capacity {
            return Err(Error::ContextOverflow {
                needed: end,
                max: capacity,
            });
        }
        if let Some(&b) = s.blocks.iter().find(|&&b| b as usize >= n_blocks) {
            return Err(Error::OutOfBounds(format!(
                "KV block {b} of a pool of {n_blocks} blocks"
            )));
        }
    }
    Ok(())
}

impl<'a> Op<'a> {
    /// Checks the op against the rules its variant documents and returns it as a
    /// [`CheckedOp`] for a device to run. The [`crate::Executor`] calls it before choosing
    /// a device; a device's own tests call it before `run`.
    ///
    /// Errors: [`Error::Shape`] when operands disagree; [`Error::DType`] for an activation
    /// that is not f32; [`Error::TokenOutOfRange`] for an embedding id `>= vocab`;
    /// [`Error::ContextOverflow`] for a position beyond a RoPE table or a KV cache (or a
    /// block table); [`Error::OutOfBounds`] for a row or block index outside its tensor;
    /// [`Error::InvalidArgument`] for invalid sampling parameters, soft caps or MoE routing
    /// parameters ([`MoeRouting`]).
    /// [`Error::Placement`] when its tensors are not all in one memory (host, or one
    /// device's).
    pub fn validate(self) -> Result<CheckedOp<'a>> {
        let location = self.location()?;
        self.check()?;
        Ok(CheckedOp {
            op: self,
            location,
            step: false,
        })
    }

    /// Where the tensor operands are (host memory for an op without any).
    ///
    /// Errors: [`Error::Placement`], naming two operands, when they are not all in one
    /// memory.
    pub fn location(&self) -> Result<Location> {
        let mut first: Option<(&str, Location)> = None;
        let mut conflict = None;
        self.for_each_tensor(&mut |name, data| {
            let here = data.location();
            match first {
                None => first = Some((name, here)),
                Some((first_name, there)) if there != here && conflict.is_none() => {
                    conflict = Some(format!(
                        "{:?}: {first_name} is in {there} memory, {name} in {here} memory",
                        self.kind()
                    ));
                }
                Some(_) => {}
            }
        });
        match (conflict, first) {
            (Some(msg), _) => Err(Error::Placement(msg)),
            (None, Some((_, location))) => Ok(location),
            (None, None) => Ok(Location::Host),
        }
    }

    /// Calls `f` with the name and tensor of each tensor operand, inputs and outputs.
    pub fn for_each_tensor<'s>(&'s self, f: &mut dyn FnMut(&'static str, &'s Data)) {
        match self {
            Op::Embedding {
                table,
                tokens,
                output,
            } => {
                f("table", table);
                if let TokenIds::Tensor(ids) = tokens {
                    f("tokens", ids);
                }
                f("output", output);
            }
            Op::RmsNorm {
                input,
                weight,
                output,
                ..
            }
            | Op::LayerNorm {
                input,
                weight,
                output,
                ..
            } => {
                f("input", input);
                f("weight", weight);
                if let Op::LayerNorm { bias, .. } = self {
                    f("bias", bias);
                }
                f("output", output);
            }
            Op::Linear {
                input,
                weight,
                bias,
                output,
            } => {
                f("input", input);
                f("weight", weight);
                if let Some(p) = weight.input_perm() {
                    f("input permutation", p);
                }
                if let Some(b) = bias {
                    f("bias", b);
                }
                f("output", output);
            }
            Op::Linears { input, parts } => {
                f("input", input);
                for p in parts.iter() {
                    f("weight", p.weight);
                    if let Some(perm) = p.weight.input_perm() {
                        f("input permutation", perm);
                    }
                    if let Some(b) = p.bias {
                        f("bias", b);
                    }
                    f("output", p.output);
                }
            }
            Op::Rope { x, .. } | Op::RopeRows { x, .. } | Op::Rope2d { x, .. } => f("x", x),
            Op::Gelu { x } | Op::Scale { x, .. } | Op::SoftCap { x, .. } => f("x", x),
            Op::CopyRows {
                src: (src, _),
                dst: (dst, _),
                ..
            }
            | Op::ScatterRows { src, dst, .. } => {
                f("src", src);
                f("dst", dst);
            }
            Op::Attention { operands, .. } | Op::PagedAttention { operands, .. } => {
                f("q", operands.q);
                f("cache_k", operands.cache_k);
                f("cache_v", operands.cache_v);
                if let Some(r) = &operands.rope {
                    f("rope q", r.q);
                    f("rope cache", r.cache);
                }
                if let Some(s) = operands.sinks {
                    f("sinks", s);
                }
                f("output", operands.output);
            }
            Op::HeadLinear {
                input,
                weights,
                output,
            } => {
                f("input", input);
                for w in weights.iter() {
                    f("weight", w);
                    if let Some(p) = w.input_perm() {
                        f("input permutation", p);
                    }
                }
                f("output", output);
            }
            Op::SiluMul { gate, up, output } | Op::GeluMul { gate, up, output } => {
                f("gate", gate);
                f("up", up);
                f("output", output);
            }
            Op::Add { x, y } => {
                f("x", x);
                f("y", y);
            }
            Op::GatedAdd { x, y, gate } => {
                f("x", x);
                f("y", y);
                f("gate", gate);
            }
            Op::Argmax { input, .. } => f("input", input),
            Op::Sample {
                logits,
                state,
                output,
                ..
            } => {
                f("logits", logits);
                f("seen", &state.seen);
                f("counts", &state.counts);
                f("stream", &state.stream);
                f("output", output);
            }
            Op::MoeFfn {
                input,
                router,
                experts,
                routing,
                output,
                ..
            } => {
                f("input", input);
                f("router", router);
                if let Some(p) = router.input_perm() {
                    f("input permutation", p);
                }
                if let Some(b) = routing.choice_bias {
                    f("choice_bias", b);
                }
                if let Some(b) = routing.logit_bias {
                    f("logit_bias", b);
                }
                for e in experts.iter() {
                    for (name, w) in [("gate", &e.gate), ("up", &e.up), ("down", &e.down)] {
                        f(name, w);
                        if let Some(p) = w.input_perm() {
                            f("input permutation", p);
                        }
                    }
                    for b in e.biases.iter().flatten() {
                        f("expert bias", b);
                    }
                }
                f("output", output);
            }
        }
    }

    fn check(&self) -> Result<()> {
        match self {
            Op::Embedding {
                table,
                tokens,
                output,
            } => embedding(table, tokens, output),
            Op::RmsNorm {
                input,
                weight,
                output,
                ..
            } => rms_norm(input, weight, output),
            Op::LayerNorm {
                input,
                weight,
                bias,
                output,
                ..
            } => layer_norm(input, weight, bias, output),
            Op::Linear {
                input,
                weight,
                bias,
                output,
            } => linear_part(input, weight, *bias, output),
            Op::Linears { input, parts } => linears(input, parts),
            Op::HeadLinear {
                input,
                weights,
                output,
            } => head_linear(input, weights, output),
            Op::Rope {
                x,
                table,
                n_heads,
                start_pos,
            } => rope(x, table, *n_heads, *start_pos),
            Op::RopeRows {
                x,
                table,
                n_heads,
                positions,
            } => rope_rows(x, table, *n_heads, positions),
            Op::Rope2d {
                x,
                table,
                n_heads,
                positions,
                block_positions,
            } => rope2d(x, table, *n_heads, positions, block_positions),
            Op::CopyRows { src, dst, n_rows } => copy_rows(*src, (dst.0, dst.1), *n_rows),
            Op::ScatterRows { src, rows, dst } => scatter_rows(src, rows, dst),
            Op::Attention {
                operands,
                start_pos,
            } => attention(operands, *start_pos),
            Op::PagedAttention {
                operands,
                block_size,
                seqs,
            } => paged_attention(operands, *block_size, seqs),
            Op::SiluMul { gate, up, output } | Op::GeluMul { gate, up, output } => {
                silu_gelu_mul(self.kind().name(), gate, up, output)
            }
            Op::Add { x, y } => add(x, y),
            Op::GatedAdd { x, y, gate } => gated_add(x, y, gate),
            Op::Gelu { x } => all_f32("Gelu", &[("x", x)]),
            Op::Scale { x, .. } => all_f32("Scale", &[("x", x)]),
            Op::MoeFfn {
                input,
                router,
                experts,
                first_expert,
                routing,
                activation,
                output,
            } => moe_ffn(
                input,
                (router, experts, *first_expert),
                (routing, *activation),
                output,
            ),
            Op::SoftCap { x, cap } => soft_cap(x, *cap),
            Op::Sample {
                logits,
                state,
                output,
                config,
            } => sample(logits, state, output, config),
            Op::Argmax { input, output } => argmax(input, output),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{LinearPart, RopeStyle};

    fn zeros(shape: &[usize]) -> Data {
        Data::zeros(DataType::F32, shape).unwrap()
    }

    #[test]
    fn each_kind_of_breach_gets_its_error() {
        let table = zeros(&[10, 4]);
        let err = Op::Embedding {
            table: &table,
            tokens: TokenIds::Host(&[3, 10]),
            output: &mut zeros(&[2, 4]),
        }
        .validate()
        .unwrap_err();
        assert!(matches!(
            err,
            Error::TokenOutOfRange {
                id: 10,
                vocab_size: 10
            }
        ));

        let (w, x) = (zeros(&[3, 4]), zeros(&[2, 4]));
        let err = Op::Linears {
            input: &x,
            parts: &mut [
                LinearPart::new(&w, None, &mut zeros(&[2, 3])),
                LinearPart::new(&w, None, &mut zeros(&[2, 4])),
            ],
        }
        .validate()
        .unwrap_err();
        assert!(matches!(err, Error::Shape { op: "Linear", .. }), "{err}");

        let half = Data::zeros(DataType::F16, &[2, 4]).unwrap();
        let err = Op::Add {
            x: &mut zeros(&[2, 4]),
            y: &half,
        }
        .validate()
        .unwrap_err();
        assert!(matches!(err, Error::DType { op: "Add", .. }), "{err}");

        let table = RopeTable::new(RopeStyle::RotateHalf, 4, 4, 10000.0, 8).unwrap();
        let err = Op::Rope {
            x: &mut zeros(&[2, 8]),
            table: &table,
            n_heads: 2,
            start_pos: 7,
        }
        .validate()
        .unwrap_err();
        assert!(matches!(err, Error::ContextOverflow { needed: 9, max: 8 }));

        let err = Op::CopyRows {
            src: (&zeros(&[2, 4]), 1),
            dst: (&mut zeros(&[8, 4]), 0),
            n_rows: 2,
        }
        .validate()
        .unwrap_err();
        assert!(matches!(err, Error::OutOfBounds(_)), "{err}");
    }

    #[test]
    fn sample_operands_and_parameters_are_checked() {
        let ints = |n: usize| Data::zeros(DataType::I32, &[n]).unwrap();
        let logits = zeros(&[1, 8]);
        let check = |logits: &Data, seen: usize, stream: usize, config: &crate::SamplerConfig| {
            Op::Sample {
                logits,
                state: &mut crate::SampleState {
                    seen: ints(seen),
                    counts: ints(8),
                    stream: ints(stream),
                },
                output: &mut ints(1),
                config,
            }
            .validate()
            .map(|_| ())
        };
        let ok = crate::SamplerConfig::default();
        assert!(check(&logits, 8, crate::SAMPLER_STATE_WORDS, &ok).is_ok());
        let words = crate::SAMPLER_STATE_WORDS;
        assert!(matches!(
            check(&logits, 7, words, &ok),
            Err(Error::Shape { .. })
        ));
        assert!(matches!(
            check(&logits, 8, 9, &ok),
            Err(Error::Shape { .. })
        ));
        assert!(matches!(
            check(&zeros(&[2, 4]), 8, words, &ok),
            Err(Error::Shape { .. })
        ));
        let bad = crate::SamplerConfig {
            top_p: 0.0,
            ..ok.clone()
        };
        assert!(matches!(
            check(&logits, 8, words, &bad),
            Err(Error::InvalidArgument(_))
        ));
        let err = Op::Sample {
            logits: &logits,
            state: &mut crate::SampleState {
                seen: zeros(&[8]),
                counts: ints(8),
                stream: ints(words),
            },
            output: &mut ints(1),
            config: &ok,
        }
        .validate()
        .unwrap_err();
        assert!(matches!(err, Error::DType { op: "Sample", .. }), "{err}");
    }

    #[test]
    fn attention_masks_and_block_tables_are_checked() {
        let (q, cache) = (zeros(&[1, 8]), zeros(&[4, 4]));
        let attention = |start_pos, bidirectional, sliding_window| {
            Op::Attention {
                operands: AttentionOperands {
                    q: &q,
                    cache_k: &cache,
                    cache_v: &cache,
                    rope: None,
                    params: AttentionParams {
                        bidirectional,
                        sliding_window,
                        ..AttentionParams::causal(2, 1, 1.0)
                    },
                    sinks: None,
                    output: &mut zeros(&[1, 8]),
                },
                start_pos,
            }
            .validate()
            .map(|_| ())
        };
        assert!(attention(3, 0, None).is_ok());
        assert!(matches!(
            attention(4, 0, None),
            Err(Error::ContextOverflow { needed: 5, max: 4 })
        ));
        assert!(matches!(attention(1, 3, None), Err(Error::Shape { .. })));
        assert!(matches!(attention(1, 0, Some(0)), Err(Error::Shape { .. })));
        assert!(matches!(attention(1, 1, Some(2)), Err(Error::Shape { .. })));

        let pool = zeros(&[8, 4]);
        let paged_with = |blocks: &[u32], n_rows, start_pos, bidirectional| {
            Op::PagedAttention {
                operands: AttentionOperands {
                    q: &q,
                    cache_k: &pool,
                    cache_v: &pool,
                    rope: None,
                    params: AttentionParams {
                        bidirectional,
                        ..AttentionParams::causal(2, 1, 1.0)
                    },
                    sinks: None,
                    output: &mut zeros(&[1, 8]),
                },
                block_size: 4,
                seqs: &[PagedSeq {
                    n_rows,
                    start_pos,
                    blocks,
                }],
            }
            .validate()
            .map(|_| ())
        };
        let paged = |blocks: &[u32], n_rows, start_pos| paged_with(blocks, n_rows, start_pos, 0);
        assert!(paged(&[1], 1, 3).is_ok());
        // Paged attention is causal: no bidirectional prefix.
        assert!(matches!(
            paged_with(&[1], 1, 3, 1),
            Err(Error::Shape { .. })
        ));
        assert!(matches!(
            paged(&[1], 1, 4),
            Err(Error::ContextOverflow { needed: 5, max: 4 })
        ));
        assert!(matches!(paged(&[2], 1, 0), Err(Error::OutOfBounds(_))));
        assert!(matches!(paged(&[0], 2, 0), Err(Error::Shape { .. })));
    }

    #[test]
    fn latent_attention_and_head_linears_are_checked() {
        // One latent KV head of 4, values the latent itself, a RoPE part of 2: 2 query heads.
        let (q, latent, q_rope, rope_cache) = (
            zeros(&[1, 8]),
            zeros(&[4, 4]),
            zeros(&[1, 4]),
            zeros(&[4, 2]),
        );
        let attention = |rope_cache: &Data, out_cols: usize| {
            Op::Attention {
                operands: AttentionOperands {
                    q: &q,
                    cache_k: &latent,
                    cache_v: &latent,
                    rope: Some(crate::DecoupledRope {
                        q: &q_rope,
                        cache: rope_cache,
                    }),
                    params: AttentionParams::causal(2, 1, 1.0),
                    sinks: None,
                    output: &mut zeros(&[1, out_cols]),
                },
                start_pos: 0,
            }
            .validate()
            .map(|_| ())
        };
        assert!(attention(&rope_cache, 8).is_ok());
        // The values are the cache's 4 columns: an output of 2 × 2 does not fit them.
        assert!(matches!(
            attention(&rope_cache, 4),
            Err(Error::Shape { .. })
        ));
        assert!(matches!(
            attention(&zeros(&[4, 3]), 8),
            Err(Error::Shape { .. })
        ));
        let half = Data::zeros(DataType::F16, &[4, 2]).unwrap();
        assert!(matches!(attention(&half, 8), Err(Error::DType { .. })));

        let weights = [zeros(&[3, 2]), zeros(&[3, 2])];
        let head_linear = |input: &Data, weights: &[Data], out_cols: usize| {
            Op::HeadLinear {
                input,
                weights,
                output: &mut zeros(&[2, out_cols]),
            }
            .validate()
            .map(|_| ())
        };
        let x = zeros(&[2, 4]);
        assert!(head_linear(&x, &weights, 6).is_ok());
        assert!(matches!(
            head_linear(&x, &weights, 5),
            Err(Error::Shape { .. })
        ));
        assert!(matches!(head_linear(&x, &[], 0), Err(Error::Shape { .. })));
        let ragged = [zeros(&[3, 2]), zeros(&[2, 2])];
        assert!(matches!(
            head_linear(&x, &ragged, 6),
            Err(Error::Shape { .. })
        ));
    }

    #[test]
    fn kv_caches_are_f32_or_f16_and_activations_f32() {
        let q = zeros(&[1, 8]);
        let half = |shape: &[usize]| Data::zeros(DataType::F16, shape).unwrap();
        let attention = |k: &Data, v: &Data, q: &Data| {
            Op::Attention {
                operands: AttentionOperands {
                    q,
                    cache_k: k,
                    cache_v: v,
                    rope: None,
                    params: AttentionParams::causal(2, 1, 1.0),
                    sinks: None,
                    output: &mut zeros(&[1, 8]),
                },
                start_pos: 0,
            }
            .validate()
            .map(|_| ())
        };
        let (h, f) = (half(&[4, 4]), zeros(&[4, 4]));
        assert!(attention(&h, &h, &q).is_ok());
        let mixed = attention(&h, &f, &q).unwrap_err();
        assert!(
            matches!(
                mixed,
                Error::DType {
                    op: "Attention",
                    ..
                }
            ),
            "{mixed}"
        );
        let bf = Data::zeros(DataType::BF16, &[4, 4]).unwrap();
        assert!(matches!(attention(&bf, &bf, &q), Err(Error::DType { .. })));
        assert!(matches!(
            attention(&h, &h, &half(&[1, 8])),
            Err(Error::DType { .. })
        ));

        let copy = |src: &Data, dst: &mut Data| {
            Op::CopyRows {
                src: (src, 0),
                dst: (dst, 2),
                n_rows: 1,
            }
            .validate()
            .map(|_| ())
        };
        assert!(copy(&zeros(&[1, 4]), &mut half(&[4, 4])).is_ok());
        assert!(matches!(
            copy(&half(&[1, 4]), &mut half(&[4, 4])),
            Err(Error::DType { .. })
        ));
        let scatter = Op::ScatterRows {
            src: &zeros(&[1, 4]),
            rows: &[3],
            dst: &mut half(&[4, 4]),
        };
        assert!(scatter.validate().is_ok());
    }

    /// Device memory for a placement check: only its location matters.
    #[derive(Debug)]
    struct Elsewhere(usize);

    impl crate::DeviceBuffer for Elsewhere {
        fn location(&self) -> Location {
            Location::Device {
                name: "elsewhere",
                ordinal: 0,
            }
        }
        fn len(&self) -> usize {
            self.0
        }
        fn as_any(&self) -> &dyn std::any::Any {
            self
        }
        fn as_any_mut(&mut self) -> &mut dyn std::any::Any {
            self
        }
    }

    /// Validates an `Op::MoeFfn` of `experts` from `first` on, with a router of 8 experts
    /// of dim 4, over one row.
    fn check_part(
        experts: &[crate::Expert],
        first_expert: usize,
        routing: MoeRouting<'_>,
        activation: ExpertActivation,
    ) -> Result<()> {
        let (input, router) = (zeros(&[1, 4]), zeros(&[8, 4]));
        Op::MoeFfn {
            input: &input,
            router: &router,
            experts,
            first_expert,
            routing,
            activation,
            output: &mut zeros(&[1, 4]),
        }
        .validate()
        .map(|_| ())
    }

    #[test]
    fn moe_experts_are_a_run_of_the_routers() {
        use crate::Expert;
        let expert = Expert {
            gate: zeros(&[2, 4]),
            up: zeros(&[2, 4]),
            down: zeros(&[4, 2]),
            biases: None,
        };
        let experts = vec![expert; 8];
        let bias = zeros(&[8]);
        // The routing is the router's: top 5 of 8 and a bias per router row, whatever the run.
        let routing = MoeRouting {
            choice_bias: Some(&bias),
            ..MoeRouting::softmax(5, true)
        };
        let check = |first: usize, len: usize, routing| {
            check_part(&experts[..len], first, routing, ExpertActivation::SwiGlu)
        };
        for (first, len) in [(0, 8), (0, 1), (2, 3), (6, 2), (7, 1)] {
            assert!(check(first, len, routing).is_ok(), "{first}..+{len}");
        }
        for (first, len) in [(7, 2), (8, 1), (3, 0), (usize::MAX, 1)] {
            let r = check(first, len, routing);
            assert!(
                matches!(&r, Err(Error::Shape { op: "MoeFfn", msg })
                    if msg.contains(&format!("experts {first}..{first}+{len} of a router of 8"))),
                "{first}..+{len}: {r:?}"
            );
        }
        let two = zeros(&[2]);
        let local_bias = MoeRouting {
            choice_bias: Some(&two),
            ..MoeRouting::softmax(1, true)
        };
        assert!(
            check(2, 2, local_bias).is_err(),
            "a bias of the run's experts"
        );
        // An expert's error names its router index.
        let mut odd = experts[..3].to_vec();
        odd[1].down = zeros(&[4, 3]);
        let err = check_part(&odd, 3, routing, ExpertActivation::SwiGlu).unwrap_err();
        assert!(err.to_string().contains("expert 4:"), "{err}");
    }

    #[test]
    fn moe_routing_fits_the_experts() {
        use crate::{Expert, ExpertGroups};
        let experts = vec![
            Expert {
                gate: zeros(&[2, 4]),
                up: zeros(&[2, 4]),
                down: zeros(&[4, 2]),
                biases: None,
            };
            8
        ];
        fn check_with(
            experts: &[Expert],
            routing: MoeRouting<'_>,
            activation: ExpertActivation,
        ) -> Result<()> {
            check_part(experts, 0, routing, activation)
        }
        let check =
            |routing: MoeRouting<'_>| check_with(&experts, routing, ExpertActivation::SwiGlu);
        let grouped = |n_groups, top_groups, score, top_k| MoeRouting {
            groups: Some(ExpertGroups {
                n_groups,
                top_groups,
                score,
            }),
            ..MoeRouting::softmax(top_k, true)
        };
        let bias = zeros(&[8]);
        let deepseek_v3 = MoeRouting {
            scoring: crate::RouterScoring::Sigmoid,
            choice_bias: Some(&bias),
            scale: 2.5,
            ..grouped(4, 2, GroupScore::SumOfTop2, 4)
        };
        assert!(check(deepseek_v3).is_ok());
        assert!(check(grouped(8, 3, GroupScore::Max, 3)).is_ok());
        let shape_err = |what: &str, r: Result<()>| {
            assert!(
                matches!(r, Err(Error::Shape { op: "MoeFfn", .. })),
                "{what}: {r:?}"
            );
        };
        shape_err("no groups", check(grouped(0, 0, GroupScore::Max, 1)));
        shape_err("3 groups of 8", check(grouped(3, 1, GroupScore::Max, 1)));
        shape_err("top 2 of 1", check(grouped(8, 1, GroupScore::SumOfTop2, 1)));
        shape_err("top_k 5 of 4", check(grouped(4, 2, GroupScore::Max, 5)));
        shape_err("top_k 0", check(MoeRouting::softmax(0, false)));
        shape_err("top_k 9", check(MoeRouting::softmax(9, false)));
        for (what, r) in [
            ("top_groups 0", check(grouped(4, 0, GroupScore::Max, 1))),
            ("top_groups 5", check(grouped(4, 5, GroupScore::Max, 1))),
            (
                "scale NaN",
                check(MoeRouting {
                    scale: f32::NAN,
                    ..deepseek_v3
                }),
            ),
            (
                "scale inf",
                check(MoeRouting {
                    scale: f32::INFINITY,
                    ..deepseek_v3
                }),
            ),
        ] {
            assert!(matches!(r, Err(Error::InvalidArgument(_))), "{what}: {r:?}");
        }
        for shape in [&[7][..], &[1, 8]] {
            let bias = zeros(shape);
            let with = MoeRouting {
                choice_bias: Some(&bias),
                ..deepseek_v3
            };
            shape_err("a bias per expert", check(with));
        }
        let half = Data::zeros(DataType::F16, &[8]).unwrap();
        let with = MoeRouting {
            choice_bias: Some(&half),
            ..deepseek_v3
        };
        assert!(matches!(check(with), Err(Error::DType { .. })));
        let far = Data::from_device(DataType::F32, &[8], Box::new(Elsewhere(32))).unwrap();
        let with = MoeRouting {
            choice_bias: Some(&far),
            ..deepseek_v3
        };
        let err = check(with).unwrap_err();
        assert!(
            matches!(&err, Error::Placement(m) if m.contains("choice_bias")),
            "{err}"
        );
        // gpt-oss: a logit bias, expert biases and the clamped SwiGLU.
        let clamped = ExpertActivation::ClampedSwiGlu {
            alpha: 1.702,
            limit: 7.0,
        };
        let with_biases = |shapes: [&[usize]; 3]| -> Vec<Expert> {
            let mut e = experts.clone();
            for x in &mut e {
                x.biases = Some(shapes.map(zeros));
            }
            e
        };
        let gpt_oss = MoeRouting {
            logit_bias: Some(&bias),
            ..MoeRouting::softmax(2, true)
        };
        let good = with_biases([&[2], &[2], &[4]]);
        assert!(check_with(&good, gpt_oss, clamped).is_ok());
        let seven = zeros(&[7]);
        shape_err(
            "a logit bias per expert",
            check(MoeRouting {
                logit_bias: Some(&seven),
                ..gpt_oss
            }),
        );
        assert!(matches!(
            check(MoeRouting {
                logit_bias: Some(&half),
                ..gpt_oss
            }),
            Err(Error::DType { .. })
        ));
        shape_err(
            "expert biases of the expert's widths",
            check_with(&with_biases([&[2], &[2], &[2]]), gpt_oss, clamped),
        );
        for (alpha, limit) in [(f32::NAN, 7.0), (1.702, 0.0), (1.702, f32::INFINITY)] {
            let r = check_with(
                &good,
                gpt_oss,
                ExpertActivation::ClampedSwiGlu { alpha, limit },
            );
            assert!(
                matches!(r, Err(Error::InvalidArgument(_))),
                "{alpha} {limit}: {r:?}"
            );
        }
    }
}
