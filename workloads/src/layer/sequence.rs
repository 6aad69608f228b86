//! Sequence and recommendation layers: embeddings, attention, rotary embeddings, mixture of
//! experts, DLRM's interaction.

use super::{
    Activation, AttentionKernel, Checker, KernelPart, KernelRole, LayerCost, LayerError, OpClass,
    RopeKernels, Shape, Traffic,
};

/// An attention core's cost, and its kernels per pass when it runs as several.
pub(super) struct AttentionCost {
    pub(super) cost: LayerCost,
    pub(super) parts: Option<[Vec<KernelPart>; 3]>,
}

impl AttentionCost {
    /// The cost summed over the kernels of the forward and backward-data passes (an attention
    /// core has no weights).
    fn of_parts(macs: f64, forward: Vec<KernelPart>, backward: Vec<KernelPart>, saved: u64) -> AttentionCost {
        let (flops, traffic) = (parts_flops, parts_traffic);
        let masks = |parts: &[KernelPart]| parts.iter().map(|p| p.mask_bytes).sum::<u64>();
        let cost = LayerCost {
            macs,
            forward_flops: flops(&forward),
            backward_data_flops: flops(&backward),
            forward_traffic: traffic(&forward),
            backward_data_traffic: traffic(&backward),
            activation_elements: saved,
            mask_bytes: [masks(&forward), masks(&backward), 0],
            ..LayerCost::free(OpClass::Gemm)
        };
        AttentionCost { cost, parts: Some([forward, backward, Vec::new()]) }
    }
}

/// The FLOPs of a pass run as `parts`.
fn parts_flops(parts: &[KernelPart]) -> f64 {
    parts.iter().map(|p| p.flops).sum()
}

/// The compute-dtype traffic of a pass run as `parts`.
fn parts_traffic(parts: &[KernelPart]) -> Traffic {
    Traffic {
        per_sample: parts.iter().map(|p| p.traffic.per_sample).sum(),
        per_batch: parts.iter().map(|p| p.traffic.per_batch).sum(),
    }
}

impl Checker<'_> {
    pub(super) fn embedding(
        &self,
        input: &Shape,
        ids: u64,
        vocabulary: u64,
        dim: u64,
    ) -> Result<(Shape, LayerCost), LayerError> {
        self.nonzero("vocabulary", &[vocabulary])?;
        self.nonzero("dim", &[dim])?;
        let mut dims = input.0.clone();
        dims.push(dim);
        let output = Shape(dims);
        let params = self.product("the table size", &[vocabulary, dim])?;
        let gathered = self.product("the output size", &[ids, dim])?;
        let cost = LayerCost {
            params,
            // Read the ids and the rows, write the output.
            forward_traffic: Traffic {
                per_sample: self.sum("the traffic", &[(1, ids), (2, gathered)])?,
                per_batch: 0,
            },
            // Scatter-add the output gradient into the rows of a dense gradient table (one add
            // per element), which is zeroed and written in full once per batch.
            backward_weight_flops: gathered as f64,
            backward_weight_traffic: Traffic {
                per_sample: self.sum("the traffic", &[(1, ids), (3, gathered)])?,
                per_batch: params,
            },
            // The ids.
            activation_elements: ids,
            ..LayerCost::free(OpClass::Elementwise)
        };
        Ok((output, cost))
    }

    pub(super) fn add_embedding(
        &self,
        input: &Shape,
        rows: u64,
        positional: bool,
    ) -> Result<(Shape, LayerCost), LayerError> {
        let (tokens, dim) = self.sequence(input)?;
        self.nonzero("rows", &[rows])?;
        if positional && tokens > rows {
            return Err(self.invalid(format!(
                "the sequence has {tokens} tokens but the table only {rows} positions; use at most {rows} tokens"
            )));
        }
        let params = self.product("the table size", &[rows, dim])?;
        let elements = self.product("the input size", &[tokens, dim])?;
        let cost = LayerCost {
            params,
            forward_flops: elements as f64,
            // Read the input and one table row per token, write the output.
            forward_traffic: Traffic { per_sample: 3 * elements, per_batch: 0 },
            // The input gradient is the output gradient itself (no kernel); the table's gradient
            // sums it per row.
            backward_weight_flops: elements as f64,
            backward_weight_traffic: Traffic { per_sample: 3 * elements, per_batch: params },
            activation_elements: if positional { 0 } else { tokens },
            ..LayerCost::free(OpClass::Elementwise)
        };
        Ok((input.clone(), cost))
    }

    pub(super) fn embedding_bag(
        &self,
        input: &Shape,
        tables: &[u64],
        dim: u64,
        lookups: u64,
    ) -> Result<(Shape, LayerCost), LayerError> {
        let [count] = input.0[..] else {
            return Err(self.rank(input, "1 ([tables]: one bag of ids per table)"));
        };
        if count != tables.len() as u64 {
            return Err(self.invalid(format!(
                "the input has {count} features but there are {} tables; give one table per sparse feature",
                tables.len()
            )));
        }
        self.nonzero("a table's row count", tables)?;
        self.nonzero("dim", &[dim])?;
        self.nonzero("lookups", &[lookups])?;
        let rows = self.sum("the table rows", &tables.iter().map(|&rows| (1, rows)).collect::<Vec<_>>())?;
        let params = self.product("the table size", &[rows, dim])?;
        let ids = self.product("the ids", &[count, lookups])?;
        let gathered = self.product("the rows looked up", &[ids, dim])?;
        let pooled = self.product("the output size", &[count, dim])?;
        let cost = LayerCost {
            params,
            // Sum-pool the rows of each bag.
            forward_flops: (gathered - pooled) as f64,
            forward_traffic: Traffic {
                per_sample: self.sum("the traffic", &[(1, ids), (1, gathered), (1, pooled)])?,
                per_batch: 0,
            },
            // Sparse update: add each bag's gradient to the rows it read.
            backward_weight_flops: gathered as f64,
            backward_weight_traffic: Traffic {
                per_sample: self.sum("the traffic", &[(1, ids), (1, pooled), (2, gathered)])?,
                per_batch: 0,
            },
            activation_elements: ids,
            ..LayerCost::free(OpClass::Elementwise)
        };
        Ok((Shape(vec![count, dim]), cost))
    }

    pub(super) fn interaction(&self, input: &Shape) -> Result<(Shape, LayerCost), LayerError> {
        let [features, dim] = input.0[..] else {
            return Err(self.rank(input, "2 ([features, dim])"));
        };
        let pairs = self.product("the pair count", &[features, features - 1])? / 2;
        let output = Shape(vec![self.sum("the output size", &[(1, dim), (1, pairs)])?]);
        let elements_in = self.product("the input size", &[features, dim])?;
        // One batched product T T^T; the strictly lower triangle is kept.
        let macs = self.product("the MAC count", &[features, features, dim])?;
        let products = features * features;
        let cost = LayerCost {
            macs: macs as f64,
            forward_flops: 2.0 * macs as f64,
            // dT = (dZ + dZ^T) T.
            backward_data_flops: 2.0 * macs as f64 + products as f64,
            forward_traffic: Traffic {
                per_sample: self.sum("the traffic", &[(1, elements_in), (2, products), (1, output.0[0])])?,
                per_batch: 0,
            },
            backward_data_traffic: Traffic {
                per_sample: self.sum("the traffic", &[(3, elements_in), (2, products), (1, output.0[0])])?,
                per_batch: 0,
            },
            activation_elements: elements_in,
            ..LayerCost::free(OpClass::Gemm)
        };
        Ok((output, cost))
    }

    /// Checks heads against a packed `[tokens, (heads + 2 kv_heads) * head_dim]` input and
    /// returns `(tokens, head_dim)`.
    fn packed_heads(&self, input: &Shape, heads: u64, kv_heads: u64) -> Result<(u64, u64), LayerError> {
        let (tokens, head_dim, _) = self.packed_heads_with_values(input, heads, kv_heads, None)?;
        Ok((tokens, head_dim))
    }

    /// [`Checker::packed_heads`] with values of their own width when `value_head_dim` is given
    /// (`[tokens, (heads + kv_heads) * head_dim + kv_heads * value_head_dim]`): returns
    /// `(tokens, head_dim, value_head_dim)`.
    fn packed_heads_with_values(
        &self,
        input: &Shape,
        heads: u64,
        kv_heads: u64,
        value_head_dim: Option<u64>,
    ) -> Result<(u64, u64, u64), LayerError> {
        let (tokens, width) = self.sequence(input)?;
        if let Some(value_dim) = value_head_dim {
            self.nonzero("heads", &[heads])?;
            self.nonzero("kv_heads", &[kv_heads])?;
            self.nonzero("value_head_dim", &[value_dim])?;
            if heads % kv_heads != 0 {
                return Err(self.invalid(format!(
                    "kv_heads {kv_heads} does not divide heads {heads}; each key/value head serves a whole group of query heads"
                )));
            }
            return match super::attention_head_dims(width, heads, kv_heads, value_head_dim) {
                Some((head_dim, value_dim)) if head_dim > 0 => Ok((tokens, head_dim, value_dim)),
                _ => Err(self.invalid(format!(
                    "the input width {width} is not (heads + kv_heads) x head_dim + kv_heads x {value_dim} \
                     for any head_dim; the input must be the packed queries, keys and values of \
                     value_head_dim {value_dim}"
                ))),
            };
        }
        self.nonzero("heads", &[heads])?;
        self.nonzero("kv_heads", &[kv_heads])?;
        if heads % kv_heads != 0 {
            return Err(self.invalid(format!(
                "kv_heads {kv_heads} does not divide heads {heads}; each key/value head serves a whole group of query heads"
            )));
        }
        let packed = self.sum("the head count", &[(1, heads), (2, kv_heads)])?;
        if width % packed != 0 {
            return Err(self.invalid(format!(
                "the input width {width} is not a multiple of heads + 2 x kv_heads = {packed}; the input must \
                 be the packed query, key and value projections, [tokens, (heads + 2 x kv_heads) x head_dim]"
            )));
        }
        Ok((tokens, width / packed, width / packed))
    }

    /// The cost of an attention core and, for standard kernels, its kernels per pass
    /// (forward, backward-data, backward-weight): the products, the fused scale-mask-softmax
    /// and, with `dropout`, the dropout on the probabilities, each a kernel of its own as
    /// PyTorch runs them (Megatron-LM 2021: `baddbmm`, `ScaledUpperTriangMaskedSoftmax`,
    /// `torch.nn.Dropout`, `bmm`). The cost is the sum of the kernels. A flash core is one
    /// kernel each way.
    #[allow(clippy::too_many_arguments)] // the fields of LayerKind::Attention
    pub(super) fn attention(
        &self,
        input: &Shape,
        heads: u64,
        kv_heads: u64,
        causal: bool,
        kernel: AttentionKernel,
        dropout: bool,
        value_head_dim: Option<u64>,
    ) -> Result<(Shape, AttentionCost), LayerError> {
        let (tokens, head_dim, value_dim) =
            self.packed_heads_with_values(input, heads, kv_heads, value_head_dim)?;
        let output = Shape(vec![tokens, self.product("the output width", &[heads, value_dim])?]);
        let qkv = self.product("the input size", &input.0)?;
        let out = self.product("the output size", &output.0)?;
        let full = self.product("the score matrix", &[heads, tokens, tokens])?;
        // Scores computed per head: a flash kernel skips the blocks a causal mask removes.
        let computed = if causal && kernel == AttentionKernel::Flash {
            self.product("the score matrix", &[heads, tokens * (tokens + 1) / 2])?
        } else {
            full
        };
        // Q K^T (over the query/key head width) and P V (over the value head width).
        let macs = self.product("the MAC count", &[computed, head_dim + value_dim])?;
        let product_flops = 2.0 * macs as f64;
        let lse = self.product("the row statistics", &[heads, tokens])?;
        let n = full as f64;
        let traffic = |terms: &[(u64, u64)]| -> Result<Traffic, LayerError> {
            Ok(Traffic { per_sample: self.sum("the traffic", terms)?, per_batch: 0 })
        };
        let part = |role, class, flops, traffic, mask_bytes| KernelPart {
            role,
            class,
            flops,
            traffic,
            fp32_traffic: Traffic::default(),
            mask_bytes,
        };
        let cost = match kernel {
            AttentionKernel::Standard => {
                // The products read Q, K, V and write the scores S, read the (dropped)
                // probabilities and write O.
                let mut forward = vec![
                    part(
                        KernelRole::AttentionProducts,
                        OpClass::Gemm,
                        product_flops,
                        traffic(&[(1, qkv), (2, full), (1, out)])?,
                        0,
                    ),
                    // Scale, mask, softmax (5 per score): read S, write P.
                    part(
                        KernelRole::AttentionSoftmax,
                        OpClass::Normalization,
                        5.0 * n,
                        traffic(&[(2, full)])?,
                        0,
                    ),
                ];
                // Four products (dV = P^T dO, dP = dO V^T, dQ = dS K, dK = dS^T Q): read dO
                // twice, P, dS twice, Q, K, V; write dP, dQ, dK, dV.
                let mut backward = vec![
                    part(
                        KernelRole::AttentionProducts,
                        OpClass::Gemm,
                        2.0 * product_flops,
                        traffic(&[(2, qkv), (4, full), (2, out)])?,
                        0,
                    ),
                    // dS = P (dP - sum(P dP)), 4 per score: read dP and P, write dS.
                    part(
                        KernelRole::AttentionSoftmax,
                        OpClass::Normalization,
                        4.0 * n,
                        traffic(&[(3, full)])?,
                        0,
                    ),
                ];
                if dropout {
                    // Draw, compare and scale (2 per score): read P, write the dropped P and
                    // the one-byte mask.
                    forward.push(part(
                        KernelRole::AttentionDropout,
                        OpClass::Elementwise,
                        2.0 * n,
                        traffic(&[(2, full)])?,
                        full,
                    ));
                    // Masked scale of the gradient: read it and the mask, write the gradient.
                    backward.insert(
                        1,
                        part(
                            KernelRole::AttentionDropout,
                            OpClass::Elementwise,
                            n,
                            traffic(&[(2, full)])?,
                            full,
                        ),
                    );
                }
                // Q, K, V and the probabilities; with dropout also the dropped probabilities
                // (read by dV = P^T dO) and the mask (counted as elements here; the memory
                // model gives it one byte).
                let saved = if dropout { [(1, qkv), (3, full)] } else { [(1, qkv), (1, full)] };
                AttentionCost::of_parts(
                    macs as f64,
                    forward,
                    backward,
                    self.sum("the saved activations", &saved)?,
                )
            }
            AttentionKernel::Math => {
                // nanoGPT's CausalSelfAttention (karpathy/nanoGPT @ 5a725d90 : model.py) under
                // eager PyTorch: every operator is a kernel, and under torch.autocast in half
                // precision `F.softmax` runs in fp32 (softmax is on autocast's fp32 list, as is
                // its backward), so the scores are cast up before it and the probabilities back
                // down for `att @ v` (autocast casts `bmm`'s inputs to the half dtype). Dropout,
                // when the model has it, acts on the fp32 probabilities. In fp32 the casts do
                // not run (KernelRole::AttentionCast) and every fp32 term is the compute dtype.
                let part32 = |role, class, flops, traffic: &[(u64, u64)], fp32: &[(u64, u64)], mask_bytes| {
                    Ok::<_, LayerError>(KernelPart {
                        role,
                        class,
                        flops,
                        traffic: Traffic { per_sample: self.sum("the traffic", traffic)?, per_batch: 0 },
                        fp32_traffic: Traffic { per_sample: self.sum("the traffic", fp32)?, per_batch: 0 },
                        mask_bytes,
                    })
                };
                let (cast, elementwise) = (KernelRole::AttentionCast, KernelRole::AttentionElementwise);
                let mut forward = vec![
                    // Q K^T and P V: read Q, K, V, write S, read P (half), write O.
                    part(
                        KernelRole::AttentionProducts,
                        OpClass::Gemm,
                        product_flops,
                        traffic(&[(1, qkv), (2, full), (1, out)])?,
                        0,
                    ),
                    // `* (1 / sqrt(d))`: read S, write it scaled.
                    part(elementwise, OpClass::Elementwise, n, traffic(&[(2, full)])?, 0),
                    // `masked_fill(bias == 0, -inf)`: read S, write it masked (the broadcast
                    // T x T mask is read once per kernel, not per score: not counted).
                    part(elementwise, OpClass::Elementwise, n, traffic(&[(2, full)])?, 0),
                    // Autocast's cast of S to fp32.
                    part32(cast, OpClass::Elementwise, 0.0, &[(1, full)], &[(1, full)], 0)?,
                    // The softmax in fp32: max, exponentials, sum and division (3 per score).
                    part32(
                        KernelRole::AttentionSoftmax,
                        OpClass::Normalization,
                        3.0 * n,
                        &[],
                        &[(2, full)],
                        0,
                    )?,
                ];
                // Q K^T's and P V's four gradient products: read dO twice, P, dS twice, Q, K,
                // V; write dP, dQ, dK, dV.
                let mut backward = vec![
                    part(
                        KernelRole::AttentionProducts,
                        OpClass::Gemm,
                        2.0 * product_flops,
                        traffic(&[(2, qkv), (4, full), (2, out)])?,
                        0,
                    ),
                    // dP back to fp32 (the backward of the cast down).
                    part32(cast, OpClass::Elementwise, 0.0, &[(1, full)], &[(1, full)], 0)?,
                ];
                if dropout {
                    // On the fp32 probabilities: read them, write the dropped ones and the mask;
                    // backward: read the gradient and the mask, write the gradient.
                    forward.push(part32(
                        KernelRole::AttentionDropout,
                        OpClass::Elementwise,
                        2.0 * n,
                        &[],
                        &[(2, full)],
                        full,
                    )?);
                    backward.push(part32(
                        KernelRole::AttentionDropout,
                        OpClass::Elementwise,
                        n,
                        &[],
                        &[(2, full)],
                        full,
                    )?);
                }
                // The probabilities cast down for P V.
                forward.push(part32(cast, OpClass::Elementwise, 0.0, &[(1, full)], &[(1, full)], 0)?);
                backward.extend([
                    // The softmax's backward in fp32: read dP and P, write dS (3 per score).
                    part32(
                        KernelRole::AttentionSoftmax,
                        OpClass::Normalization,
                        3.0 * n,
                        &[],
                        &[(3, full)],
                        0,
                    )?,
                    // dS back to the compute dtype (the backward of the cast up).
                    part32(cast, OpClass::Elementwise, 0.0, &[(1, full)], &[(1, full)], 0)?,
                    // masked_fill's backward (the gradient masked with zeros) and the scale's.
                    part(elementwise, OpClass::Elementwise, n, traffic(&[(2, full)])?, 0),
                    part(elementwise, OpClass::Elementwise, n, traffic(&[(2, full)])?, 0),
                ]);
                // Q, K, V and the probabilities as `att @ v` saw them; the fp32 softmax output
                // autocast keeps beside them is the memory model's (memory.rs).
                let saved = if dropout { [(1, qkv), (3, full)] } else { [(1, qkv), (1, full)] };
                AttentionCost::of_parts(
                    macs as f64,
                    forward,
                    backward,
                    self.sum("the saved activations", &saved)?,
                )
            }
            AttentionKernel::Flash => {
                // Dropout runs on chip: the mask is drawn from the random state and never
                // stored (the backward draws it again).
                let (dropout_forward, dropout_backward) = if dropout { (2.0, 3.0) } else { (0.0, 0.0) };
                let whole = |flops, traffic| part(KernelRole::Whole, OpClass::Gemm, flops, traffic, 0);
                // The products and the online softmax (5 per computed score); read Q, K, V once
                // (blocks re-read from cache are not counted), write O and the per-row
                // log-sum-exp.
                let forward = vec![whole(
                    product_flops + (5.0 + dropout_forward) * computed as f64,
                    traffic(&[(1, qkv), (1, out), (1, lse)])?,
                )];
                // The backward is three kernels (FlashAttention 2's flash_bwd_dot_do_o_kernel,
                // the main kernel and flash_bwd_convert_dq_kernel; cuDNN's compute_dot_do_o,
                // its bprop kernel and convert_dq_to_16bits in the H200 traces). First the row
                // sums of dO * O: read dO and O, write one fp32 per row (2 elements).
                let query = self.product("the query size", &[tokens, heads, head_dim])?;
                let dot = part(
                    KernelRole::AttentionHelper,
                    OpClass::Elementwise,
                    2.0 * out as f64,
                    traffic(&[(2, out), (2, lse)])?,
                    0,
                );
                // The main kernel recomputes Q K^T, runs the four gradient products and the
                // softmax backward: reads Q, K, V, O, dO and the log-sum-exp, writes dQ, dK, dV.
                let main = whole(
                    2.5 * product_flops + (4.0 + dropout_backward) * computed as f64,
                    traffic(&[(2, qkv), (2, out), (1, lse)])?,
                );
                // dQ's fp32 accumulator converted to the compute dtype: read 4 bytes, write 2
                // (3 elements of 2 bytes per query element).
                let convert =
                    part(KernelRole::AttentionHelper, OpClass::Elementwise, 0.0, traffic(&[(3, query)])?, 0);
                // Q, K, V, O and the log-sum-exp.
                let saved = self.sum("the saved activations", &[(1, qkv), (1, out), (1, lse)])?;
                AttentionCost::of_parts(macs as f64, forward, vec![dot, main, convert], saved)
            }
        };
        Ok((output, cost))
    }

    pub(super) fn rope(
        &self,
        input: &Shape,
        heads: u64,
        kv_heads: u64,
        kernels: RopeKernels,
    ) -> Result<(Shape, LayerCost), LayerError> {
        if kernels == RopeKernels::Eager {
            let [forward, backward] = self.rope_eager_parts(input, heads, kv_heads)?;
            let cost = LayerCost {
                forward_flops: parts_flops(&forward),
                backward_data_flops: parts_flops(&backward),
                forward_traffic: parts_traffic(&forward),
                backward_data_traffic: parts_traffic(&backward),
                ..LayerCost::free(OpClass::Elementwise)
            };
            return Ok((input.clone(), cost));
        }
        let (tokens, head_dim) = self.packed_heads(input, heads, kv_heads)?;
        // Queries and keys are rotated, values are not.
        let rotated = self.product("the rotated elements", &[tokens, heads + kv_heads, head_dim])?;
        // The cosine and sine tables: head_dim / 2 of each per position.
        let tables = self.product("the tables", &[tokens, head_dim])?;
        let traffic =
            Traffic { per_sample: self.sum("the traffic", &[(2, rotated), (1, tables)])?, per_batch: 0 };
        let cost = LayerCost {
            // x cos + rotate(x) sin: 2 multiplies and an add per element.
            forward_flops: 3.0 * rotated as f64,
            // The same rotation by the opposite angle.
            backward_data_flops: 3.0 * rotated as f64,
            forward_traffic: traffic,
            backward_data_traffic: traffic,
            ..LayerCost::free(OpClass::Elementwise)
        };
        Ok((input.clone(), cost))
    }

    /// QK-norm ([`LayerKind::QkNorm`]): a weightless RMS norm of each query and key head over its
    /// `head_dim` elements, priced as a row norm of those elements (read once and written
    /// forward with one statistic per row; the backward reads the gradient, the input and the
    /// statistic and writes the gradient); the values pass through untouched.
    pub(super) fn qk_norm(
        &self,
        input: &Shape,
        heads: u64,
        kv_heads: u64,
    ) -> Result<(Shape, LayerCost), LayerError> {
        let (tokens, head_dim) = self.packed_heads(input, heads, kv_heads)?;
        let rows = self.product("the normalised rows", &[tokens, heads + kv_heads])?;
        let elements = self.product("the normalised elements", &[rows, head_dim])?;
        let n = elements as f64;
        let cost = LayerCost {
            forward_flops: 4.0 * n,
            backward_data_flops: 8.0 * n,
            forward_traffic: Traffic {
                per_sample: self.sum("the traffic", &[(2, elements), (1, rows)])?,
                per_batch: 0,
            },
            backward_data_traffic: Traffic {
                per_sample: self.sum("the traffic", &[(3, elements), (1, rows)])?,
                per_batch: 0,
            },
            activation_elements: self.sum("the saved activations", &[(1, elements), (1, rows)])?,
            ..LayerCost::free(OpClass::Normalization)
        };
        Ok((input.clone(), cost))
    }

    /// The kernels of an eager rotary embedding ([`RopeKernels::Eager`]), forward and backward:
    /// on the queries and on the keys apart, each of `n` elements, forward `neg` of one half (`n`
    /// elements moved), `cat` (2n), `* cos` and `* sin` (2n and a table each) and the `add`
    /// (3n); backward `* cos` and `* sin`, the `neg` (n), and per slice a zero-filled gradient
    /// (n), the slice copied in (n) and its addition into the tensor's gradient (3n).
    pub(super) fn rope_eager_parts(
        &self,
        input: &Shape,
        heads: u64,
        kv_heads: u64,
    ) -> Result<[Vec<KernelPart>; 2], LayerError> {
        let (tokens, head_dim) = self.packed_heads(input, heads, kv_heads)?;
        let table = self.product("the tables", &[tokens, head_dim])?;
        let part = |flops: f64, elements: u64| KernelPart {
            role: KernelRole::Rope,
            class: OpClass::Elementwise,
            flops,
            traffic: Traffic { per_sample: elements, per_batch: 0 },
            fp32_traffic: Traffic::default(),
            mask_bytes: 0,
        };
        let (mut forward, mut backward) = (Vec::new(), Vec::new());
        for tensor_heads in [heads, kv_heads] {
            let n = self.product("the rotated elements", &[tokens, tensor_heads, head_dim])?;
            let moved = |times: u64, tables: u64| self.sum("the traffic", &[(times, n), (tables, table)]);
            let x = n as f64;
            forward.extend([
                part(x / 2.0, moved(1, 0)?),
                part(0.0, moved(2, 0)?),
                part(x, moved(2, 1)?),
                part(x, moved(2, 1)?),
                part(x, moved(3, 0)?),
            ]);
            backward.extend([
                part(x, moved(2, 1)?),
                part(x, moved(2, 1)?),
                part(x / 2.0, moved(1, 0)?),
                part(0.0, moved(1, 0)?),
                part(0.0, moved(1, 0)?),
                part(0.0, moved(1, 0)?),
                part(0.0, moved(1, 0)?),
                part(x, moved(3, 0)?),
                part(x, moved(3, 0)?),
            ]);
        }
        Ok([forward, backward])
    }

    pub(super) fn moe_router(
        &self,
        input: &Shape,
        experts: u64,
        top_k: u64,
    ) -> Result<(Shape, LayerCost), LayerError> {
        self.features(input)?;
        self.experts(experts, top_k)?;
        let (output, mut cost) = self.linear(input, experts, false, false)?;
        let logits = self.product("the output size", &output.0)?;
        // Softmax over the experts (5 per logit) and a top-k selection (k comparisons per logit).
        cost.forward_flops += (5 + top_k) as f64 * logits as f64;
        cost.backward_data_flops += 4.0 * logits as f64;
        cost.activation_elements += logits;
        Ok((output, cost))
    }

    fn experts(&self, experts: u64, top_k: u64) -> Result<(), LayerError> {
        self.nonzero("experts", &[experts])?;
        self.nonzero("top_k", &[top_k])?;
        if top_k > experts {
            return Err(self.invalid(format!("top_k {top_k} is more than the {experts} experts")));
        }
        Ok(())
    }

    #[allow(clippy::too_many_arguments)] // the fields of LayerKind::MoeExperts
    pub(super) fn moe_experts(
        &self,
        input: &Shape,
        experts: u64,
        top_k: u64,
        ffn_hidden: u64,
        activation: Activation,
        gated: bool,
        bias: bool,
    ) -> Result<(Shape, LayerCost), LayerError> {
        let hidden = self.features(input)?;
        self.experts(experts, top_k)?;
        self.nonzero("ffn_hidden", &[ffn_hidden])?;
        let tokens = self.product("the input size", &input.0)? / hidden;
        // Per expert: an input projection to ffn_hidden (two if gated) and an output projection.
        let projections_in = if gated { 2 } else { 1 };
        let expert_weights =
            self.product("the expert's weights", &[projections_in + 1, hidden, ffn_hidden])?;
        let expert_biases = if bias {
            self.sum("the expert's biases", &[(projections_in, ffn_hidden), (1, hidden)])?
        } else {
            0
        };
        let expert_params =
            self.sum("the expert's parameters", &[(1, expert_weights), (1, expert_biases)])?;
        let params = self.product("the parameter count", &[experts, expert_params])?;
        // Each token visits top_k experts.
        let routed = self.product("the routed tokens", &[tokens, top_k])?;
        let macs = self.product("the MAC count", &[routed, expert_weights])?;
        let intermediate = self.product("the intermediate size", &[routed, ffn_hidden])?;
        let routed_hidden = self.product("the routed hidden states", &[routed, hidden])?;
        let elements = self.product("the input size", &input.0)?;
        let (act_forward, act_backward) = activation.flops_per_element();
        let gate_flops = if gated { 1.0 } else { 0.0 };
        let bias_flops = if bias { (routed_hidden + projections_in * intermediate) as f64 } else { 0.0 };
        // Combine: a weighted sum of top_k outputs per token.
        let combine_flops = 2.0 * routed_hidden as f64;
        let cost = LayerCost {
            params,
            macs: macs as f64,
            forward_flops: 2.0 * macs as f64
                + (act_forward + gate_flops) * intermediate as f64
                + bias_flops
                + combine_flops,
            backward_data_flops: 2.0 * macs as f64
                + (act_backward + 2.0 * gate_flops) * intermediate as f64
                + combine_flops,
            backward_weight_flops: 2.0 * macs as f64 + bias_flops,
            // Read the tokens, write and read them permuted to their experts, write and read
            // the intermediate activations (and gate), write the experts' outputs, read them to
            // combine, write the result. Every expert's weights are read.
            forward_traffic: Traffic {
                per_sample: self.sum(
                    "the traffic",
                    &[(2, elements), (4, routed_hidden), (2 * projections_in + 2, intermediate)],
                )?,
                per_batch: params,
            },
            backward_data_traffic: Traffic {
                per_sample: self.sum(
                    "the traffic",
                    &[(2, elements), (4, routed_hidden), (3 * projections_in + 2, intermediate)],
                )?,
                per_batch: experts * expert_weights,
            },
            backward_weight_traffic: Traffic {
                per_sample: self
                    .sum("the traffic", &[(2, routed_hidden), (projections_in + 1, intermediate)])?,
                per_batch: params,
            },
            // The permuted tokens, the intermediate activations (pre- and post-activation) and
            // the routing choice per token.
            activation_elements: self.sum(
                "the saved activations",
                &[(1, routed_hidden), (projections_in + 1, intermediate), (1, routed)],
            )?,
            mask_bytes: [0; 3],
            class: OpClass::Gemm,
            training: super::Training::Trained,
        };
        Ok((input.clone(), cost))
    }
}
