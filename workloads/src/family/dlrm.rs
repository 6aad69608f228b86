//! DLRM (Naumov et al. 2019, "Deep Learning Recommendation Model for Personalization and
//! Recommendation Systems"), as `facebookresearch/dlrm` builds it: a bottom MLP over the dense
//! features, one embedding table per sparse feature, the pairwise dot-product interaction
//! (without self-interaction) concatenated with the bottom MLP's output, and a top MLP ending in
//! a sigmoid.
//!
//! The per-sample input is one row of the dataset, `[dense + sparse]` features (13 + 26 for
//! Criteo); two slices split it. The zoo's `dlrm` is the MLPerf Training configuration on
//! Criteo 1TB (`--max-ind-range=40000000`, 128-wide embeddings, bottom MLP 13-512-256-128, top
//! MLP 479-1024-1024-512-256-1): 24.0 billion parameters, nearly all in the tables.

use serde::Deserialize;

use crate::family::invalid;
use crate::layer::{Activation, LayerKind, Shape};
use crate::model::{Model, ModelBuilder, ModelError};

/// A DLRM, the `[dlrm]` section of a model file.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct Dlrm {
    /// Dense (continuous) features per sample.
    pub dense_features: u64,
    /// Rows of each sparse feature's embedding table.
    pub tables: Vec<u64>,
    /// Width of every embedding (and of the bottom MLP's output).
    pub embedding_dim: u64,
    /// Output sizes of the bottom MLP's layers; the last must equal `embedding-dim`.
    pub bottom_mlp: Vec<u64>,
    /// Output sizes of the top MLP's layers; the last is usually 1 (click probability).
    pub top_mlp: Vec<u64>,
    /// Ids looked up and summed per table and sample. Default 1 (one-hot, as Criteo).
    #[serde(default)]
    pub lookups: Option<u64>,
}

impl Dlrm {
    /// Builds the network, named `name`.
    pub fn build(&self, name: &str) -> Result<Model, ModelError> {
        if self.tables.is_empty() {
            return Err(invalid(
                name,
                "dlrm.tables",
                "no embedding tables; give the rows of each".to_string(),
            ));
        }
        if self.dense_features == 0 {
            return Err(invalid(name, "dlrm.dense-features", "must be at least 1".to_string()));
        }
        if self.bottom_mlp.last() != Some(&self.embedding_dim) {
            return Err(invalid(
                name,
                "dlrm.bottom-mlp",
                format!(
                    "the last layer has {} outputs; it must equal embedding-dim {} so the dense vector joins the embeddings",
                    self.bottom_mlp.last().map_or("no".to_string(), u64::to_string),
                    self.embedding_dim
                ),
            ));
        }
        if self.top_mlp.is_empty() {
            return Err(invalid(name, "dlrm.top-mlp", "give at least one layer".to_string()));
        }
        let sparse = self.tables.len() as u64;
        let mut b = ModelBuilder::new(name, Shape::from([self.dense_features + sparse]));
        b.describe(
            "dlrm",
            format!(
                "DLRM: {} dense features, {} embedding tables of width {}, bottom MLP {:?}, top MLP {:?}",
                self.dense_features, sparse, self.embedding_dim, self.bottom_mlp, self.top_mlp
            ),
        );
        let row = b.shape().clone();
        b.layer("dense", LayerKind::Slice { axis: 0, start: 0, length: self.dense_features })?;
        for (index, &width) in self.bottom_mlp.iter().enumerate() {
            b.layer(format!("bottom.{index}"), LayerKind::Linear { out_features: width, bias: true })?;
            b.layer(format!("bottom.{index}.relu"), LayerKind::relu())?;
        }
        let bottom = b
            .layer("bottom.reshape", LayerKind::Reshape { shape: Shape::from([1, self.embedding_dim]) })?
            .clone();
        b.branch_from(row);
        b.layer("sparse", LayerKind::Slice { axis: 0, start: self.dense_features, length: sparse })?;
        let embeddings = LayerKind::EmbeddingBag {
            tables: self.tables.clone(),
            dim: self.embedding_dim,
            lookups: self.lookups.unwrap_or(1),
        };
        let embedded = b.layer("embeddings", embeddings)?.clone();
        b.branch_from(bottom);
        b.concat("features", 0, &[embedded])?;
        b.layer("interaction", LayerKind::Interaction)?;
        let last = self.top_mlp.len() - 1;
        for (index, &width) in self.top_mlp.iter().enumerate() {
            b.layer(format!("top.{index}"), LayerKind::Linear { out_features: width, bias: true })?;
            let activation = if index == last { Activation::Sigmoid } else { Activation::Relu };
            b.layer(
                format!("top.{index}.{}", activation.name()),
                LayerKind::Activation { function: activation },
            )?;
        }
        Ok(b.finish())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_small_dlrm_has_the_expected_shapes() {
        let spec = Dlrm {
            dense_features: 13,
            tables: vec![10, 20, 30],
            embedding_dim: 16,
            bottom_mlp: vec![64, 16],
            top_mlp: vec![32, 1],
            lookups: None,
        };
        let model = spec.build("tiny").unwrap();
        // 1 dense vector + 3 embeddings: 6 pairs.
        assert_eq!(model.layer("interaction").map(|layer| layer.output.clone()), Some(Shape::from([16 + 6])));
        assert_eq!(model.output(), &Shape::from([1]));
        let tables = 60 * 16;
        let mlps = (13 * 64 + 64) + (64 * 16 + 16) + (22 * 32 + 32) + (32 + 1);
        assert_eq!(model.parameters(), tables + mlps);
        let error = Dlrm { bottom_mlp: vec![64, 8], ..spec }.build("tiny").unwrap_err().to_string();
        assert!(error.contains("dlrm.bottom-mlp") && error.contains("embedding-dim 16"), "{error}");
    }
}
