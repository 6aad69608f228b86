//! VGG (Simonyan and Zisserman 2014) as torchvision defines it (`torchvision.models.vgg`):
//! 3x3 convolutions with bias in five blocks separated by 2x2 max pooling, an adaptive average
//! pooling to 7x7, and three fully connected layers with dropout.
//!
//! Layers are named after torchvision's modules: `features.<i>` (convolutions, ReLUs and
//! pools numbered as in `nn.Sequential`), `avgpool`, `flatten`, `classifier.<i>`.

use serde::Deserialize;

use crate::family::invalid;
use crate::layer::{LayerKind, Padding, Shape};
use crate::model::{Model, ModelBuilder, ModelError};

/// A VGG network, the `[vgg]` section of a model file.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct Vgg {
    /// 11, 13, 16 or 19 weighted layers.
    pub depth: u64,
    /// Batch normalization after every convolution (torchvision's `vgg16_bn`).
    #[serde(default)]
    pub batch_norm: bool,
    /// Height and width of the input images.
    #[serde(default = "default_image_size")]
    pub image_size: u64,
    /// Classes of the classifier.
    #[serde(default = "default_classes")]
    pub classes: u64,
    /// Round pooled sizes up (Caffe's and Chainer's pooling) instead of down (PyTorch's).
    #[serde(default)]
    pub ceil_mode: bool,
    /// Pool the last feature map to 7x7 before the classifier, as torchvision does so that any
    /// image size works. Without it the first classifier layer takes the feature map as it is.
    #[serde(default = "default_true")]
    pub adaptive_pool: bool,
}

fn default_image_size() -> u64 {
    224
}

fn default_classes() -> u64 {
    1000
}

fn default_true() -> bool {
    true
}

impl Vgg {
    /// The torchvision VGG of `depth` layers for 224x224 images and 1000 classes.
    pub fn with_depth(depth: u64) -> Vgg {
        Vgg {
            depth,
            batch_norm: false,
            image_size: default_image_size(),
            classes: default_classes(),
            ceil_mode: false,
            adaptive_pool: true,
        }
    }

    /// Builds the network, named `name`.
    pub fn build(&self, name: &str) -> Result<Model, ModelError> {
        // Convolutions per block (torchvision's configurations "A", "B", "D", "E").
        let blocks: [u64; 5] = match self.depth {
            11 => [1, 1, 2, 2, 2],
            13 => [2, 2, 2, 2, 2],
            16 => [2, 2, 3, 3, 3],
            19 => [2, 2, 4, 4, 4],
            depth => {
                return Err(invalid(
                    name,
                    "vgg.depth",
                    format!("{depth} is not a VGG; use 11, 13, 16 or 19"),
                ));
            }
        };
        for (key, value) in [("vgg.image-size", self.image_size), ("vgg.classes", self.classes)] {
            if value == 0 {
                return Err(invalid(name, key, "must be at least 1".to_string()));
            }
        }
        let mut builder = ModelBuilder::new(name, Shape::from([3, self.image_size, self.image_size]));
        builder.describe(
            "vgg",
            format!(
                "VGG-{}{} (torchvision layout), {}x{} images, {} classes",
                self.depth,
                if self.batch_norm { " with batch norm" } else { "" },
                self.image_size,
                self.image_size,
                self.classes
            ),
        );
        let mut index = 0;
        let mut next = || {
            index += 1;
            format!("features.{}", index - 1)
        };
        for (&convolutions, width) in blocks.iter().zip([64u64, 128, 256, 512, 512]) {
            for _ in 0..convolutions {
                let conv = LayerKind::Conv {
                    out_channels: width,
                    kernel: vec![3, 3],
                    stride: vec![1, 1],
                    padding: Padding::Symmetric(vec![1, 1]),
                    dilation: vec![1, 1],
                    groups: 1,
                    bias: true,
                };
                builder.layer(next(), conv)?;
                if self.batch_norm {
                    builder.layer(next(), LayerKind::BatchNorm)?;
                }
                builder.layer(next(), LayerKind::relu())?;
            }
            let pool = LayerKind::MaxPool {
                kernel: vec![2, 2],
                stride: vec![2, 2],
                padding: vec![0, 0],
                ceil_mode: self.ceil_mode,
            };
            builder.layer(next(), pool)?;
        }
        if self.adaptive_pool {
            builder.layer("avgpool", LayerKind::AdaptiveAvgPool { output: vec![7, 7] })?;
        }
        builder.layer("flatten", LayerKind::Flatten)?;
        builder.layer("classifier.0", LayerKind::Linear { out_features: 4096, bias: true })?;
        builder.layer("classifier.1", LayerKind::relu())?;
        builder.layer("classifier.2", LayerKind::Dropout)?;
        builder.layer("classifier.3", LayerKind::Linear { out_features: 4096, bias: true })?;
        builder.layer("classifier.4", LayerKind::relu())?;
        builder.layer("classifier.5", LayerKind::Dropout)?;
        builder.layer("classifier.6", LayerKind::Linear { out_features: self.classes, bias: true })?;
        Ok(builder.finish())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vgg16_matches_torchvision() {
        let model = Vgg::with_depth(16).build("vgg16").unwrap();
        // torchvision: 138,357,544 parameters, 15.47 GMACs.
        assert_eq!(model.parameters(), 138_357_544);
        let macs = model.macs_per_sample();
        assert!((macs / 15.47e9 - 1.0).abs() < 0.005, "{macs}");
        assert_eq!(
            model.layer("features.30").map(|layer| layer.output.clone()),
            Some(Shape::from([512, 7, 7]))
        );
        assert_eq!(model.output(), &Shape::from([1000]));
        // torchvision vgg19: 143,667,240.
        assert_eq!(Vgg::with_depth(19).build("vgg19").unwrap().parameters(), 143_667_240);
        let error = Vgg::with_depth(17).build("vgg17").unwrap_err().to_string();
        assert!(error.contains("vgg.depth") && error.contains("11, 13, 16 or 19"), "{error}");
    }
}
