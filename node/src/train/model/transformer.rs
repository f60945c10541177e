//! A small decoder-only transformer language model in the style of GPT-2 (Radford et al.
//! 2019, "Language models are unsupervised multitask learners"), built from the blocks of
//! Vaswani et al. 2017, "Attention is all you need".
//!
//! Layout: token embedding [vocab, d_model] + learned positional embedding [context, d_model];
//! `layers` pre-norm blocks, each x ← x + Attn(LN(x)) with causal multi-head self-attention,
//! then x ← x + MLP(LN(x)) with MLP = Linear(d_model → d_ff) · GELU · Linear(d_ff → d_model);
//! a final LayerNorm; an untied LM head Linear(d_model → vocab) with bias. No dropout. The
//! attention projections (query, key, value, output) are Burn's [`MultiHeadAttention`], each
//! a Linear with bias; GELU is the exact (erf) form. The embeddings are drawn from
//! N(0, 0.02²) as in GPT-2, the linear layers with Burn's default (Kaiming-uniform, gain 1/√3).
//!
//! With the defaults ([`TransformerConfig::default`]: vocab 256, context 64, d_model 128,
//! 4 heads, 2 layers, d_ff 512) d = 470,784. Context 64, not 128: a step takes 0.16 s
//! instead of 0.41 s (`murmur bench`, batch 32, 2-core dev machine), and 8 peers on that
//! machine then train to 2.40 bits per byte on the KJV validation text in 7.5 minutes
//! (`murmur launch --model transformer --optimizer adamw --lr 0.002 --lr-schedule cosine
//! --warmup-rounds 20 --epochs 2`); `transformer:context=128` is the earlier default.

use burn::module::{Initializer, Param};
use burn::nn::attention::{
    generate_autoregressive_mask, MhaInput, MultiHeadAttention, MultiHeadAttentionConfig,
};
use burn::nn::{
    Embedding, EmbeddingConfig, Gelu, LayerNorm, LayerNormConfig, Linear, LinearConfig,
};
use burn::prelude::*;

/// Standard deviation of the embeddings' initial values (GPT-2).
const EMBEDDING_STD: f64 = 0.02;

/// Sizes of a [`TransformerLm`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TransformerConfig {
    /// Tokens in the vocabulary (256: bytes).
    pub vocab: usize,
    /// Context length T: positions the model reads at once (64).
    pub context: usize,
    /// Width of the residual stream (128).
    pub d_model: usize,
    /// Attention heads; must divide `d_model` (4).
    pub heads: usize,
    /// Transformer blocks (2).
    pub layers: usize,
    /// Hidden width of each block's MLP (512).
    pub d_ff: usize,
}

impl Default for TransformerConfig {
    /// vocab 256, context 64, d_model 128, 4 heads, 2 layers, d_ff 512 (d = 470,784).
    fn default() -> Self {
        TransformerConfig {
            vocab: 256,
            context: 64,
            d_model: 128,
            heads: 4,
            layers: 2,
            d_ff: 512,
        }
    }
}

impl TransformerConfig {
    /// A freshly initialised model (weights from the backend RNG, which the caller seeds).
    ///
    /// # Errors
    /// If a size is 0, the vocabulary has fewer than 2 tokens, or `heads` does not divide
    /// `d_model`.
    pub fn init<B: Backend>(&self, device: &B::Device) -> anyhow::Result<TransformerLm<B>> {
        self.check()?;
        Ok(self.build(device))
    }

    /// Whether a model of these sizes can be built.
    ///
    /// # Errors
    /// As [`TransformerConfig::init`].
    pub fn check(&self) -> anyhow::Result<()> {
        let c = self;
        if [c.context, c.d_model, c.heads, c.layers, c.d_ff].contains(&0) {
            anyhow::bail!("transformer: every size must be ≥ 1, got {c:?}");
        }
        if c.vocab < 2 {
            anyhow::bail!(
                "transformer: the vocabulary needs at least 2 tokens, got {}",
                c.vocab
            );
        }
        if !c.d_model.is_multiple_of(c.heads) {
            anyhow::bail!(
                "transformer: {} heads do not divide d_model = {}",
                c.heads,
                c.d_model
            );
        }
        Ok(())
    }

    /// [`TransformerConfig::init`] for a configuration known to be valid.
    pub(super) fn build<B: Backend>(&self, device: &B::Device) -> TransformerLm<B> {
        let embedding = Initializer::Normal {
            mean: 0.0,
            std: EMBEDDING_STD,
        };
        TransformerLm {
            token_embedding: EmbeddingConfig::new(self.vocab, self.d_model)
                .with_initializer(embedding.clone())
                .init(device),
            position_embedding: embedding.init([self.context, self.d_model], device),
            blocks: (0..self.layers)
                .map(|_| Block {
                    ln_1: LayerNormConfig::new(self.d_model).init(device),
                    attn: MultiHeadAttentionConfig::new(self.d_model, self.heads)
                        .with_dropout(0.0)
                        .init(device),
                    ln_2: LayerNormConfig::new(self.d_model).init(device),
                    mlp: FeedForward {
                        fc: LinearConfig::new(self.d_model, self.d_ff).init(device),
                        proj: LinearConfig::new(self.d_ff, self.d_model).init(device),
                        gelu: Gelu::new(),
                    },
                })
                .collect(),
            ln_f: LayerNormConfig::new(self.d_model).init(device),
            head: LinearConfig::new(self.d_model, self.vocab).init(device),
            vocab: self.vocab,
            context: self.context,
        }
    }
}

/// A decoder-only transformer language model (see the [module documentation](self)).
#[derive(Module, Debug)]
pub struct TransformerLm<B: Backend> {
    token_embedding: Embedding<B>,
    /// Learned positional embedding, `[context, d_model]`.
    position_embedding: Param<Tensor<B, 2>>,
    blocks: Vec<Block<B>>,
    ln_f: LayerNorm<B>,
    head: Linear<B>,
    vocab: usize,
    context: usize,
}

impl<B: Backend> TransformerLm<B> {
    /// Next-token logits at every position: output `[.., t, ..]` is the model's prediction of
    /// token t + 1 from tokens 0..=t (causal mask).
    ///
    /// # Shapes
    /// - `tokens`: `[batch, t]`, ids in 0..vocab, t ≤ context
    /// - output: `[batch, t, vocab]`
    ///
    /// # Panics
    /// If t > context (checked by [`Net::forward`](super::Net::forward), which returns an
    /// error instead).
    pub fn forward(&self, tokens: Tensor<B, 2, Int>) -> Tensor<B, 3> {
        let [b, t] = tokens.dims();
        assert!(
            t <= self.context,
            "{t} tokens exceed the context of {}",
            self.context
        );
        let device = tokens.device();
        let positions = self
            .position_embedding
            .val()
            .narrow(0, 0, t)
            .unsqueeze::<3>();
        let mut x = self.token_embedding.forward(tokens) + positions;
        let mask = generate_autoregressive_mask::<B>(b, t, &device);
        for block in &self.blocks {
            x = block.forward(x, mask.clone());
        }
        self.head.forward(self.ln_f.forward(x))
    }

    /// Tokens in the vocabulary.
    pub fn vocab(&self) -> usize {
        self.vocab
    }

    /// Context length T.
    pub fn context(&self) -> usize {
        self.context
    }
}

/// Pre-norm transformer block: x + Attn(LN(x)), then x + MLP(LN(x)).
#[derive(Module, Debug)]
pub struct Block<B: Backend> {
    ln_1: LayerNorm<B>,
    attn: MultiHeadAttention<B>,
    ln_2: LayerNorm<B>,
    mlp: FeedForward<B>,
}

impl<B: Backend> Block<B> {
    /// # Shapes
    /// - `x`: `[batch, t, d_model]`; `mask`: `[batch, t, t]`, true where attention is barred
    /// - output: `[batch, t, d_model]`
    fn forward(&self, x: Tensor<B, 3>, mask: Tensor<B, 3, Bool>) -> Tensor<B, 3> {
        let attn = self
            .attn
            .forward(MhaInput::self_attn(self.ln_1.forward(x.clone())).mask_attn(mask))
            .context;
        let x = x + attn;
        let mlp = self.mlp.forward(self.ln_2.forward(x.clone()));
        x + mlp
    }
}

/// The block's MLP: Linear(d_model → d_ff), GELU, Linear(d_ff → d_model).
#[derive(Module, Debug)]
pub struct FeedForward<B: Backend> {
    fc: Linear<B>,
    proj: Linear<B>,
    gelu: Gelu,
}

impl<B: Backend> FeedForward<B> {
    fn forward(&self, x: Tensor<B, 3>) -> Tensor<B, 3> {
        self.proj.forward(self.gelu.forward(self.fc.forward(x)))
    }
}
