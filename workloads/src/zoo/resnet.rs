//! ResNets as torchvision defines them (`torchvision.models.resnet`, "v1.5": a bottleneck block
//! strides in its 3x3 convolution, not its first 1x1), for 3x224x224 images and 1000 classes.
//!
//! Layers are listed in forward execution order and named after torchvision's modules
//! (`conv1`, `bn1`, `layer1.0.conv1`, `layer1.0.downsample.0`, `avgpool`, `fc`). torchvision
//! calls one `relu` module several times per block; here each call is its own layer, numbered
//! `layer1.0.relu1`, `relu2`, ... so every name is unique, and each residual sum is a layer
//! `layer1.0.add`. The flatten before `fc` is part of `avgpool` (see
//! [`LayerKind::GlobalAvgPool`]).

use crate::layer::{LayerKind, Shape};
use crate::model::{Model, ModelBuilder, ModelError};

/// The residual block a ResNet is built from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Block {
    /// Two 3x3 convolutions (ResNet-18, -34).
    Basic,
    /// 1x1 reduce, 3x3, 1x1 expand by 4 (ResNet-50, -101, -152).
    Bottleneck,
}

impl Block {
    /// Output channels per block relative to the stage width.
    const fn expansion(self) -> u64 {
        match self {
            Block::Basic => 1,
            Block::Bottleneck => 4,
        }
    }

    /// Weighted layers (convolutions) per block, excluding the shortcut's.
    const fn convolutions(self) -> usize {
        match self {
            Block::Basic => 2,
            Block::Bottleneck => 3,
        }
    }
}

/// Stage widths (channels of the blocks' inner convolutions) of every ResNet.
const WIDTHS: [u64; 4] = [64, 128, 256, 512];
/// Classes of the ImageNet classifier.
const CLASSES: u64 = 1000;

/// A torchvision-style ResNet with `depths[i]` blocks in stage `i`, named `resnet<N>` after its
/// number of weighted layers (ResNet-50 is `[3, 4, 6, 3]` bottlenecks).
pub fn resnet(depths: [usize; 4], block: Block) -> Result<Model, ModelError> {
    let weighted = depths.iter().sum::<usize>() * block.convolutions() + 2;
    let mut builder = ModelBuilder::new(format!("resnet{weighted}"), Shape::from([3, 224, 224]));
    builder.layer("conv1", conv(64, 7, 2, 3))?;
    builder.layer("bn1", LayerKind::BatchNorm2d)?;
    builder.layer("relu", LayerKind::Relu)?;
    builder.layer("maxpool", LayerKind::MaxPool2d { kernel: (3, 3), stride: (2, 2), padding: (1, 1) })?;
    for (stage, (&blocks, &width)) in depths.iter().zip(&WIDTHS).enumerate() {
        for index in 0..blocks {
            // Stages after the first halve the resolution in their first block.
            let stride = if stage > 0 && index == 0 { 2 } else { 1 };
            residual_block(&mut builder, &format!("layer{}.{index}", stage + 1), block, width, stride)?;
        }
    }
    builder.layer("avgpool", LayerKind::GlobalAvgPool)?;
    builder.layer("fc", LayerKind::Linear { out_features: CLASSES, bias: true })?;
    Ok(builder.finish())
}

/// Appends one block: the main branch, the shortcut's projection if the shape changes, the
/// residual add and the final ReLU.
fn residual_block(
    builder: &mut ModelBuilder,
    prefix: &str,
    block: Block,
    width: u64,
    stride: u64,
) -> Result<(), ModelError> {
    let input = builder.shape().clone();
    let out_channels = width * block.expansion();
    match block {
        Block::Basic => {
            builder.layer(format!("{prefix}.conv1"), conv(width, 3, stride, 1))?;
            builder.layer(format!("{prefix}.bn1"), LayerKind::BatchNorm2d)?;
            builder.layer(format!("{prefix}.relu1"), LayerKind::Relu)?;
            builder.layer(format!("{prefix}.conv2"), conv(width, 3, 1, 1))?;
            builder.layer(format!("{prefix}.bn2"), LayerKind::BatchNorm2d)?;
        }
        Block::Bottleneck => {
            builder.layer(format!("{prefix}.conv1"), conv(width, 1, 1, 0))?;
            builder.layer(format!("{prefix}.bn1"), LayerKind::BatchNorm2d)?;
            builder.layer(format!("{prefix}.relu1"), LayerKind::Relu)?;
            builder.layer(format!("{prefix}.conv2"), conv(width, 3, stride, 1))?;
            builder.layer(format!("{prefix}.bn2"), LayerKind::BatchNorm2d)?;
            builder.layer(format!("{prefix}.relu2"), LayerKind::Relu)?;
            builder.layer(format!("{prefix}.conv3"), conv(out_channels, 1, 1, 0))?;
            builder.layer(format!("{prefix}.bn3"), LayerKind::BatchNorm2d)?;
        }
    }
    let main = builder.shape().clone();
    let in_channels = input.0.first().copied().unwrap_or(0);
    builder.branch_from(input);
    // The shortcut needs a projection where the block changes resolution or width.
    if stride != 1 || in_channels != out_channels {
        builder.layer(format!("{prefix}.downsample.0"), conv(out_channels, 1, stride, 0))?;
        builder.layer(format!("{prefix}.downsample.1"), LayerKind::BatchNorm2d)?;
    }
    builder.add(format!("{prefix}.add"), &main)?;
    let last_relu = match block {
        Block::Basic => "relu2",
        Block::Bottleneck => "relu3",
    };
    builder.layer(format!("{prefix}.{last_relu}"), LayerKind::Relu)?;
    Ok(())
}

/// A square convolution without bias, as every ResNet convolution is.
fn conv(out_channels: u64, kernel: u64, stride: u64, padding: u64) -> LayerKind {
    LayerKind::Conv2d {
        out_channels,
        kernel: (kernel, kernel),
        stride: (stride, stride),
        padding: (padding, padding),
        groups: 1,
        bias: false,
    }
}

/// Builds one of the fixed zoo configurations, whose shapes the tests below check.
fn fixed(depths: [usize; 4], block: Block) -> Model {
    resnet(depths, block).expect("the zoo's ResNet configurations have valid shapes (checked by unit tests)")
}

/// ResNet-18: basic blocks `[2, 2, 2, 2]`, 11.7 M parameters.
pub fn resnet18() -> Model {
    fixed([2, 2, 2, 2], Block::Basic)
}

/// ResNet-34: basic blocks `[3, 4, 6, 3]`, 21.8 M parameters.
pub fn resnet34() -> Model {
    fixed([3, 4, 6, 3], Block::Basic)
}

/// ResNet-50 (v1.5): bottlenecks `[3, 4, 6, 3]`, 25.6 M parameters, 4.1 G MACs per image.
pub fn resnet50() -> Model {
    fixed([3, 4, 6, 3], Block::Bottleneck)
}

/// ResNet-101: bottlenecks `[3, 4, 23, 3]`, 44.5 M parameters.
pub fn resnet101() -> Model {
    fixed([3, 4, 23, 3], Block::Bottleneck)
}

/// ResNet-152: bottlenecks `[3, 8, 36, 3]`, 60.2 M parameters.
pub fn resnet152() -> Model {
    fixed([3, 8, 36, 3], Block::Bottleneck)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resnet50_matches_torchvision() {
        let model = resnet50();
        assert_eq!(model.name, "resnet50");
        // torchvision: 25,557,032 parameters, 4.09 GMACs ("GFLOPS") per 224x224 image.
        assert_eq!(model.parameters(), 25_557_032);
        let macs = model.macs_per_sample();
        assert!((macs / 4.1e9 - 1.0).abs() < 0.01, "{macs}");
        assert_eq!(model.output(), &Shape::from([1000]));
        let convs =
            model.layers.iter().filter(|layer| matches!(layer.kind, LayerKind::Conv2d { .. })).count();
        assert_eq!(convs, 49 + 4, "49 main-path convolutions and 4 shortcut projections");
    }

    #[test]
    fn resnet50_layers_are_in_execution_order_with_torchvision_names() {
        let model = resnet50();
        let names: Vec<&str> = model.layers.iter().map(|layer| layer.name.as_str()).collect();
        assert_eq!(
            names[..17],
            [
                "conv1",
                "bn1",
                "relu",
                "maxpool",
                "layer1.0.conv1",
                "layer1.0.bn1",
                "layer1.0.relu1",
                "layer1.0.conv2",
                "layer1.0.bn2",
                "layer1.0.relu2",
                "layer1.0.conv3",
                "layer1.0.bn3",
                "layer1.0.downsample.0",
                "layer1.0.downsample.1",
                "layer1.0.add",
                "layer1.0.relu3",
                "layer1.1.conv1",
            ]
        );
        assert_eq!(names[names.len() - 2..], ["avgpool", "fc"]);
        let shape = |name: &str| model.layer(name).map(|layer| layer.output.clone());
        assert_eq!(shape("maxpool"), Some(Shape::from([64, 56, 56])));
        assert_eq!(shape("layer1.0.downsample.0"), Some(Shape::from([256, 56, 56])));
        // v1.5: the stride is in the 3x3 convolution.
        assert_eq!(shape("layer2.0.conv1"), Some(Shape::from([128, 56, 56])));
        assert_eq!(shape("layer2.0.conv2"), Some(Shape::from([128, 28, 28])));
        assert_eq!(shape("layer4.2.relu3"), Some(Shape::from([2048, 7, 7])));
        assert!(model.layer("layer1.1.downsample.0").is_none());
        assert_eq!(model.layers.iter().filter(|layer| layer.kind == LayerKind::Add).count(), 16);
    }

    #[test]
    fn other_depths_match_torchvision_parameter_counts() {
        assert_eq!(resnet18().parameters(), 11_689_512);
        assert_eq!(resnet34().parameters(), 21_797_672);
        assert_eq!(resnet101().parameters(), 44_549_160);
        assert_eq!(resnet152().parameters(), 60_192_808);
        assert_eq!(resnet18().output(), &Shape::from([1000]));
        // torchvision: 1.81 and 11.51 GMACs.
        assert!((resnet18().macs_per_sample() / 1.81e9 - 1.0).abs() < 0.01);
        assert!((resnet152().macs_per_sample() / 11.51e9 - 1.0).abs() < 0.01);
    }

    #[test]
    fn training_costs_about_three_forwards() {
        let model = resnet50();
        let forward = model.forward_flops_per_sample();
        assert!(forward > 2.0 * model.macs_per_sample());
        let ratio = model.training_flops_per_sample() / forward;
        assert!(ratio > 2.9 && ratio < 3.1, "{ratio}");
    }
}
