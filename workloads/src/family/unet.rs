//! 3D U-Net (Çiçek et al. 2016, "3D U-Net: Learning Dense Volumetric Segmentation from Sparse
//! Annotation"): an analysis path of levels of two 3x3x3 convolutions (each followed by batch
//! norm and ReLU) and 2x2x2 max pooling, a synthesis path of 2x2x2 transposed convolutions
//! (stride 2), concatenation with the analysis level's output (center-cropped, since the
//! convolutions are unpadded) and two 3x3x3 convolutions, and a final 1x1x1 convolution to the
//! classes. With the paper's 3x132x132x116 input (channels, then x, y, z as depth, height,
//! width: here `[3, 116, 132, 132]`) the output is 44x44x28 voxels per class.
//!
//! Parameter count: the paper's 19,069,955 counts the convolutions' weights and biases and the
//! transposed convolutions' weights (no biases), not batch norm; this module builds exactly
//! that, plus batch norm's scale and shift.

use serde::Deserialize;

use crate::family::invalid;
use crate::layer::{LayerKind, Padding, Shape};
use crate::model::{Model, ModelBuilder, ModelError};

/// A 3D U-Net, the `[unet3d]` section of a model file.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct UNet3d {
    /// Per-sample input `[channels, depth, height, width]`.
    #[serde(default = "default_input")]
    pub input: [u64; 4],
    /// Output classes (channels of the last convolution).
    #[serde(default = "default_classes")]
    pub classes: u64,
    /// Channels of the first convolution; each level doubles them.
    #[serde(default = "default_base_width")]
    pub base_width: u64,
    /// Resolution levels, the bottom one included.
    #[serde(default = "default_levels")]
    pub levels: u64,
    /// `"valid"` (the paper's unpadded convolutions, with crops) or `"same"`.
    #[serde(default = "default_padding")]
    pub padding: String,
}

fn default_input() -> [u64; 4] {
    [3, 116, 132, 132]
}

fn default_classes() -> u64 {
    3
}

fn default_base_width() -> u64 {
    32
}

fn default_levels() -> u64 {
    4
}

fn default_padding() -> String {
    "valid".to_string()
}

impl Default for UNet3d {
    /// The paper's network.
    fn default() -> Self {
        UNet3d {
            input: default_input(),
            classes: default_classes(),
            base_width: default_base_width(),
            levels: default_levels(),
            padding: default_padding(),
        }
    }
}

fn conv3(out_channels: u64, same: bool, kernel: u64) -> LayerKind {
    let padding = if same { kernel / 2 } else { 0 };
    LayerKind::Conv {
        out_channels,
        kernel: vec![kernel; 3],
        stride: vec![1; 3],
        padding: Padding::Symmetric(vec![padding; 3]),
        dilation: vec![1; 3],
        groups: 1,
        bias: true,
    }
}

impl UNet3d {
    /// Builds the network, named `name`.
    pub fn build(&self, name: &str) -> Result<Model, ModelError> {
        let same = match self.padding.as_str() {
            "same" => true,
            "valid" => false,
            other => {
                return Err(invalid(name, "unet3d.padding", format!("{other:?}; use \"valid\" or \"same\"")));
            }
        };
        if !(2..=6).contains(&self.levels) {
            return Err(invalid(name, "unet3d.levels", format!("{} levels; use 2 to 6", self.levels)));
        }
        for (key, value) in [("unet3d.classes", self.classes), ("unet3d.base-width", self.base_width)] {
            if value == 0 {
                return Err(invalid(name, key, "must be at least 1".to_string()));
            }
        }
        let mut builder = ModelBuilder::new(name, Shape::from(self.input));
        builder.describe(
            "unet3d",
            format!(
                "3D U-Net (Çiçek et al. 2016), {} levels, {} input, {} classes",
                self.levels,
                Shape::from(self.input),
                self.classes
            ),
        );
        let mut skips = Vec::new();
        let bottom = self.levels - 1;
        for level in 0..self.levels {
            let prefix = format!("down{level}");
            let width = self.base_width << level;
            builder.layer(format!("{prefix}.conv1"), conv3(width, same, 3))?;
            builder.layer(format!("{prefix}.bn1"), LayerKind::BatchNorm)?;
            builder.layer(format!("{prefix}.relu1"), LayerKind::relu())?;
            builder.layer(format!("{prefix}.conv2"), conv3(2 * width, same, 3))?;
            builder.layer(format!("{prefix}.bn2"), LayerKind::BatchNorm)?;
            let output = builder.layer(format!("{prefix}.relu2"), LayerKind::relu())?.clone();
            if level < bottom {
                skips.push(output);
                let pool = LayerKind::MaxPool {
                    kernel: vec![2; 3],
                    stride: vec![2; 3],
                    padding: vec![0; 3],
                    ceil_mode: false,
                };
                builder.layer(format!("{prefix}.pool"), pool)?;
            }
        }
        for level in (0..bottom).rev() {
            let prefix = format!("up{level}");
            let channels = builder.shape().0.first().copied().unwrap_or(0);
            let up = LayerKind::ConvTranspose {
                out_channels: channels,
                kernel: vec![2; 3],
                stride: vec![2; 3],
                padding: vec![0; 3],
                output_padding: vec![0; 3],
                dilation: vec![1; 3],
                groups: 1,
                bias: false,
            };
            let upsampled = builder.layer(format!("{prefix}.upconv"), up)?.clone();
            let skip = skips
                .pop()
                .ok_or_else(|| invalid(name, "unet3d.levels", "no skip connection left".to_string()))?;
            builder.branch_from(skip.clone());
            let size = upsampled.0[1..].to_vec();
            if skip.0[1..] != size[..] {
                builder.layer(format!("{prefix}.crop"), LayerKind::Crop { size })?;
            }
            builder.concat(format!("{prefix}.concat"), 0, &[upsampled])?;
            let width = self.base_width << (level + 1);
            builder.layer(format!("{prefix}.conv1"), conv3(width, same, 3))?;
            builder.layer(format!("{prefix}.bn1"), LayerKind::BatchNorm)?;
            builder.layer(format!("{prefix}.relu1"), LayerKind::relu())?;
            builder.layer(format!("{prefix}.conv2"), conv3(width, same, 3))?;
            builder.layer(format!("{prefix}.bn2"), LayerKind::BatchNorm)?;
            builder.layer(format!("{prefix}.relu2"), LayerKind::relu())?;
        }
        builder.layer("head", conv3(self.classes, same, 1))?;
        Ok(builder.finish())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unet3d_matches_the_paper() {
        let model = UNet3d::default().build("unet3d").unwrap();
        let batch_norm: u64 = model
            .layers
            .iter()
            .filter(|layer| layer.kind == LayerKind::BatchNorm)
            .map(|layer| layer.cost.params)
            .sum();
        // Çiçek et al. 2016, section 2: "The architecture has 19069955 parameters in total."
        assert_eq!(model.parameters() - batch_norm, 19_069_955);
        // Input 132x132x116 gives 44x44x28 outputs.
        assert_eq!(model.output(), &Shape::from([3, 28, 44, 44]));
        assert_eq!(
            model.layer("down3.relu2").map(|layer| layer.output.clone()),
            Some(Shape::from([512, 7, 9, 9]))
        );
        assert_eq!(
            model.layer("up2.concat").map(|layer| layer.output.clone()),
            Some(Shape::from([768, 14, 18, 18]))
        );
        let same = UNet3d { input: [1, 128, 128, 128], padding: "same".to_string(), ..UNet3d::default() };
        let model = same.build("unet3d-same").unwrap();
        assert_eq!(model.output(), &Shape::from([3, 128, 128, 128]));
        assert!(model.layers.iter().all(|layer| layer.kind.name() != "crop"));
        let error =
            UNet3d { input: [3, 20, 20, 20], ..UNet3d::default() }.build("tiny").unwrap_err().to_string();
        assert!(error.contains("tiny") && error.contains("down"), "{error}");
    }
}
