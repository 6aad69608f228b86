//! ResNets as torchvision defines them (`torchvision.models.resnet`, "v1.5": a bottleneck block
//! strides in its 3x3 convolution, not its first 1x1), for 3x224x224 images and 1000 classes,
//! and the pre-activation ResNets of He et al. 2016 ("Identity Mappings in Deep Residual
//! Networks"), including the 1001-layer CIFAR network HyPar-Flow trains.
//!
//! Layers are listed in forward execution order and named after torchvision's modules
//! (`conv1`, `bn1`, `layer1.0.conv1`, `layer1.0.downsample.0`, `avgpool`, `fc`). torchvision
//! calls one `relu` module several times per block; here each call is its own layer, numbered
//! `layer1.0.relu1`, `relu2`, ... so every name is unique, and each residual sum is a layer
//! `layer1.0.add`. The flatten before `fc` is part of `avgpool` (see
//! [`LayerKind::GlobalAvgPool`]).

use serde::Deserialize;

use crate::family::invalid;
use crate::layer::{LayerKind, Shape};
use crate::model::{Model, ModelBuilder, ModelError};

/// The residual block a ResNet is built from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
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

/// Where a bottleneck block that halves the resolution puts its stride.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
pub enum Variant {
    /// In the 3x3 convolution (torchvision, NVIDIA's "ResNet-50 v1.5"): 4.1 GMACs.
    #[default]
    #[serde(rename = "v1.5")]
    V1_5,
    /// In the first 1x1 convolution (He et al. 2015, Caffe, Chainer): 3.9 GMACs.
    #[serde(rename = "v1")]
    V1,
}

/// A torchvision-style ResNet, the `[resnet]` section of a model file.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct ResNet {
    /// 18, 34, 50, 101 or 152 (or give `blocks` and `block`).
    #[serde(default)]
    pub depth: Option<usize>,
    /// Blocks per stage, for depths not in the list.
    #[serde(default)]
    pub blocks: Option<[usize; 4]>,
    /// Block type, with `blocks`.
    #[serde(default)]
    pub block: Option<Block>,
    /// Stride placement in bottlenecks.
    #[serde(default)]
    pub variant: Variant,
    /// Height and width of the input images.
    #[serde(default = "default_image_size")]
    pub image_size: u64,
    /// Classes of the classifier.
    #[serde(default = "default_classes")]
    pub classes: u64,
}

fn default_image_size() -> u64 {
    224
}

fn default_classes() -> u64 {
    1000
}

impl ResNet {
    /// The torchvision ResNet of `depth` layers (18, 34, 50, 101, 152).
    pub fn with_depth(depth: usize) -> ResNet {
        ResNet {
            depth: Some(depth),
            blocks: None,
            block: None,
            variant: Variant::V1_5,
            image_size: default_image_size(),
            classes: default_classes(),
        }
    }

    /// Blocks per stage and block type.
    pub fn layout(&self) -> Result<([usize; 4], Block), String> {
        match (self.depth, self.blocks, self.block) {
            (Some(18), None, None) => Ok(([2, 2, 2, 2], Block::Basic)),
            (Some(34), None, None) => Ok(([3, 4, 6, 3], Block::Basic)),
            (Some(50), None, None) => Ok(([3, 4, 6, 3], Block::Bottleneck)),
            (Some(101), None, None) => Ok(([3, 4, 23, 3], Block::Bottleneck)),
            (Some(152), None, None) => Ok(([3, 8, 36, 3], Block::Bottleneck)),
            (Some(depth), None, None) => Err(format!(
                "depth {depth} is not a torchvision ResNet; use 18, 34, 50, 101 or 152, or give `blocks` and `block`"
            )),
            (None, Some(blocks), Some(block)) => Ok((blocks, block)),
            _ => {
                Err("give either `depth` (18, 34, 50, 101, 152) or both `blocks` (four numbers) and `block` \
                      (\"basic\" or \"bottleneck\")"
                    .to_string())
            }
        }
    }

    /// Builds the network, named `name`.
    pub fn build(&self, name: &str) -> Result<Model, ModelError> {
        let (depths, block) = self.layout().map_err(|message| invalid(name, "resnet.depth", message))?;
        for (key, value) in [("resnet.image-size", self.image_size), ("resnet.classes", self.classes)] {
            if value == 0 {
                return Err(invalid(name, key, "must be at least 1".to_string()));
            }
        }
        let mut builder = ModelBuilder::new(name, Shape::from([3, self.image_size, self.image_size]));
        let weighted = depths.iter().sum::<usize>() * block.convolutions() + 2;
        let variant = match self.variant {
            Variant::V1_5 => "v1.5",
            Variant::V1 => "v1",
        };
        builder.describe(
            "resnet",
            format!(
                "ResNet-{weighted} ({variant}, torchvision layout), {}x{} images, {} classes",
                self.image_size, self.image_size, self.classes
            ),
        );
        builder.layer("conv1", LayerKind::conv2d(64, 7, 2, 3))?;
        builder.layer("bn1", LayerKind::BatchNorm)?;
        builder.layer("relu", LayerKind::relu())?;
        builder.layer("maxpool", max_pool(3, 2, 1))?;
        for (stage, (&blocks, &width)) in depths.iter().zip(&WIDTHS).enumerate() {
            for index in 0..blocks {
                // Stages after the first halve the resolution in their first block.
                let stride = if stage > 0 && index == 0 { 2 } else { 1 };
                let prefix = format!("layer{}.{index}", stage + 1);
                residual_block(&mut builder, &prefix, block, self.variant, width, stride)?;
            }
        }
        builder.layer("avgpool", LayerKind::GlobalAvgPool)?;
        builder.layer("fc", LayerKind::Linear { out_features: self.classes, bias: true })?;
        Ok(builder.finish())
    }
}

/// Stage widths (channels of the blocks' inner convolutions) of every ResNet.
const WIDTHS: [u64; 4] = [64, 128, 256, 512];

/// A torchvision-style ResNet with `depths[i]` blocks in stage `i`, named `resnet<N>` after its
/// number of weighted layers (ResNet-50 is `[3, 4, 6, 3]` bottlenecks).
pub fn resnet(depths: [usize; 4], block: Block) -> Result<Model, ModelError> {
    let weighted = depths.iter().sum::<usize>() * block.convolutions() + 2;
    let spec = ResNet { depth: None, blocks: Some(depths), block: Some(block), ..ResNet::with_depth(0) };
    spec.build(&format!("resnet{weighted}"))
}

/// Appends one block: the main branch, the shortcut's projection if the shape changes, the
/// residual add and the final ReLU.
fn residual_block(
    builder: &mut ModelBuilder,
    prefix: &str,
    block: Block,
    variant: Variant,
    width: u64,
    stride: u64,
) -> Result<(), ModelError> {
    let input = builder.shape().clone();
    let out_channels = width * block.expansion();
    match block {
        Block::Basic => {
            builder.layer(format!("{prefix}.conv1"), LayerKind::conv2d(width, 3, stride, 1))?;
            builder.layer(format!("{prefix}.bn1"), LayerKind::BatchNorm)?;
            builder.layer(format!("{prefix}.relu1"), LayerKind::relu())?;
            builder.layer(format!("{prefix}.conv2"), LayerKind::conv2d(width, 3, 1, 1))?;
            builder.layer(format!("{prefix}.bn2"), LayerKind::BatchNorm)?;
        }
        Block::Bottleneck => {
            let (stride1, stride3) = match variant {
                Variant::V1_5 => (1, stride),
                Variant::V1 => (stride, 1),
            };
            builder.layer(format!("{prefix}.conv1"), LayerKind::conv2d(width, 1, stride1, 0))?;
            builder.layer(format!("{prefix}.bn1"), LayerKind::BatchNorm)?;
            builder.layer(format!("{prefix}.relu1"), LayerKind::relu())?;
            builder.layer(format!("{prefix}.conv2"), LayerKind::conv2d(width, 3, stride3, 1))?;
            builder.layer(format!("{prefix}.bn2"), LayerKind::BatchNorm)?;
            builder.layer(format!("{prefix}.relu2"), LayerKind::relu())?;
            builder.layer(format!("{prefix}.conv3"), LayerKind::conv2d(out_channels, 1, 1, 0))?;
            builder.layer(format!("{prefix}.bn3"), LayerKind::BatchNorm)?;
        }
    }
    let main = builder.shape().clone();
    let in_channels = input.0.first().copied().unwrap_or(0);
    builder.branch_from(input);
    // The shortcut needs a projection where the block changes resolution or width.
    if stride != 1 || in_channels != out_channels {
        builder.layer(format!("{prefix}.downsample.0"), LayerKind::conv2d(out_channels, 1, stride, 0))?;
        builder.layer(format!("{prefix}.downsample.1"), LayerKind::BatchNorm)?;
    }
    builder.add(format!("{prefix}.add"), &main)?;
    let last_relu = match block {
        Block::Basic => "relu2",
        Block::Bottleneck => "relu3",
    };
    builder.layer(format!("{prefix}.{last_relu}"), LayerKind::relu())?;
    Ok(())
}

/// A square max pooling window.
pub(crate) fn max_pool(kernel: u64, stride: u64, padding: u64) -> LayerKind {
    LayerKind::MaxPool {
        kernel: vec![kernel; 2],
        stride: vec![stride; 2],
        padding: vec![padding; 2],
        ceil_mode: false,
    }
}

/// Builds one of the fixed zoo configurations, whose shapes the tests below check.
fn fixed(depth: usize) -> Model {
    ResNet::with_depth(depth)
        .build(&format!("resnet{depth}"))
        .expect("the zoo's ResNet configurations have valid shapes (checked by unit tests)")
}

/// ResNet-18: basic blocks `[2, 2, 2, 2]`, 11.7 M parameters.
pub fn resnet18() -> Model {
    fixed(18)
}

/// ResNet-34: basic blocks `[3, 4, 6, 3]`, 21.8 M parameters.
pub fn resnet34() -> Model {
    fixed(34)
}

/// ResNet-50 (v1.5): bottlenecks `[3, 4, 6, 3]`, 25.6 M parameters, 4.1 G MACs per image.
pub fn resnet50() -> Model {
    fixed(50)
}

/// ResNet-101: bottlenecks `[3, 4, 23, 3]`, 44.5 M parameters.
pub fn resnet101() -> Model {
    fixed(101)
}

/// ResNet-152: bottlenecks `[3, 8, 36, 3]`, 60.2 M parameters.
pub fn resnet152() -> Model {
    fixed(152)
}

/// A pre-activation bottleneck ResNet for CIFAR (He et al. 2016, "Identity Mappings in Deep
/// Residual Networks", and the authors' `resnet-pre-act.lua`), the `[preact-resnet]` section of
/// a model file. Depth `9n + 2`: a 3x3 convolution, three stages of `n` bottleneck units of
/// widths 16, 32 and 64 (outputs 64, 128, 256 channels; the first unit of each stage strides in
/// its first 1x1 convolution and projects its shortcut), a final BN-ReLU, global average
/// pooling and the classifier. ResNet-1001 has 111 units per stage and 10.2 M parameters;
/// ResNet-164 has 18 and 1.7 M.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct PreActResNet {
    /// Weighted layers, `9n + 2` (164, 1001).
    pub depth: u64,
    /// Height and width of the input images.
    #[serde(default = "default_cifar_size")]
    pub image_size: u64,
    /// Classes of the classifier.
    #[serde(default = "default_cifar_classes")]
    pub classes: u64,
}

fn default_cifar_size() -> u64 {
    32
}

fn default_cifar_classes() -> u64 {
    10
}

impl PreActResNet {
    /// Builds the network, named `name`.
    pub fn build(&self, name: &str) -> Result<Model, ModelError> {
        let most = (crate::model::MAX_LAYERS / 3) as u64;
        if self.depth > most {
            return Err(invalid(
                name,
                "preact-resnet.depth",
                format!(
                    "{} is more than {most}, the deepest network parasim builds (a model of at most {} layers)",
                    self.depth,
                    crate::model::MAX_LAYERS
                ),
            ));
        }
        if self.depth < 11 || (self.depth - 2) % 9 != 0 {
            return Err(invalid(
                name,
                "preact-resnet.depth",
                format!("{} is not 9n + 2 with n >= 1 (164 and 1001 are the paper's)", self.depth),
            ));
        }
        for (key, value) in
            [("preact-resnet.image-size", self.image_size), ("preact-resnet.classes", self.classes)]
        {
            if value == 0 {
                return Err(invalid(name, key, "must be at least 1".to_string()));
            }
        }
        let units = (self.depth - 2) / 9;
        let mut builder = ModelBuilder::new(name, Shape::from([3, self.image_size, self.image_size]));
        builder.describe(
            "preact-resnet",
            format!(
                "pre-activation ResNet-{} (He et al. 2016), {units} bottleneck units per stage, {}x{} images, {} classes",
                self.depth, self.image_size, self.image_size, self.classes
            ),
        );
        builder.layer("conv1", LayerKind::conv2d(16, 3, 1, 1))?;
        for (stage, width) in [16u64, 32, 64].into_iter().enumerate() {
            for unit in 0..units {
                let stride = if stage > 0 && unit == 0 { 2 } else { 1 };
                preact_unit(&mut builder, &format!("stage{}.{unit}", stage + 1), width, stride)?;
            }
        }
        builder.layer("bn", LayerKind::BatchNorm)?;
        builder.layer("relu", LayerKind::relu())?;
        builder.layer("avgpool", LayerKind::GlobalAvgPool)?;
        builder.layer("fc", LayerKind::Linear { out_features: self.classes, bias: true })?;
        Ok(builder.finish())
    }
}

/// One pre-activation bottleneck unit, as `resnet-pre-act.lua` builds it: where the width
/// changes, the BN-ReLU is shared by both branches and the shortcut is a strided 1x1
/// projection of it; elsewhere the shortcut is the unit's input.
fn preact_unit(builder: &mut ModelBuilder, prefix: &str, width: u64, stride: u64) -> Result<(), ModelError> {
    let input = builder.shape().clone();
    let out_channels = 4 * width;
    let projects = input.0.first() != Some(&out_channels) || stride != 1;
    builder.layer(format!("{prefix}.bn1"), LayerKind::BatchNorm)?;
    let activated = builder.layer(format!("{prefix}.relu1"), LayerKind::relu())?.clone();
    builder.layer(format!("{prefix}.conv1"), LayerKind::conv2d(width, 1, stride, 0))?;
    builder.layer(format!("{prefix}.bn2"), LayerKind::BatchNorm)?;
    builder.layer(format!("{prefix}.relu2"), LayerKind::relu())?;
    builder.layer(format!("{prefix}.conv2"), LayerKind::conv2d(width, 3, 1, 1))?;
    builder.layer(format!("{prefix}.bn3"), LayerKind::BatchNorm)?;
    builder.layer(format!("{prefix}.relu3"), LayerKind::relu())?;
    let main = builder.layer(format!("{prefix}.conv3"), LayerKind::conv2d(out_channels, 1, 1, 0))?.clone();
    if projects {
        builder.branch_from(activated);
        builder.layer(format!("{prefix}.shortcut"), LayerKind::conv2d(out_channels, 1, stride, 0))?;
    } else {
        builder.branch_from(input);
    }
    builder.add(format!("{prefix}.add"), &main)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resnet50_matches_torchvision() {
        let model = resnet50();
        assert_eq!(model.name, "resnet50");
        assert_eq!(model.family, "resnet");
        // torchvision: 25,557,032 parameters, 4.09 GMACs ("GFLOPS") per 224x224 image.
        assert_eq!(model.parameters(), 25_557_032);
        let macs = model.macs_per_sample();
        assert!((macs / 4.1e9 - 1.0).abs() < 0.01, "{macs}");
        assert_eq!(model.output(), &Shape::from([1000]));
        let convs = model.layers.iter().filter(|layer| layer.kind.name() == "conv2d").count();
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
        assert_eq!(resnet([3, 4, 6, 3], Block::Bottleneck).unwrap(), resnet50());
    }

    #[test]
    fn v1_strides_in_the_first_convolution_and_costs_less() {
        let spec = ResNet { variant: Variant::V1, ..ResNet::with_depth(50) };
        let model = spec.build("resnet50-v1").unwrap();
        assert_eq!(model.parameters(), 25_557_032);
        assert_eq!(
            model.layer("layer2.0.conv1").map(|layer| layer.output.clone()),
            Some(Shape::from([128, 28, 28]))
        );
        // He et al. 2015: 3.8 x 10^9 FLOPs (multiply-adds); torchvision's v1.5 adds 231 M.
        let macs = model.macs_per_sample();
        assert!((macs / 3.86e9 - 1.0).abs() < 0.005, "{macs}");
        assert!((resnet50().macs_per_sample() - macs - 231.2e6).abs() < 0.1e6);
    }

    #[test]
    fn training_costs_about_three_forwards() {
        let model = resnet50();
        let forward = model.forward_flops_per_sample();
        assert!(forward > 2.0 * model.macs_per_sample());
        let ratio = model.training_flops_per_sample() / forward;
        assert!(ratio > 2.9 && ratio < 3.1, "{ratio}");
    }

    #[test]
    fn resnet1001_has_the_papers_parameters() {
        let without_batch_norm = |model: &Model| -> u64 {
            model
                .layers
                .iter()
                .filter(|layer| layer.kind != LayerKind::BatchNorm)
                .map(|layer| layer.cost.params)
                .sum()
        };
        let model = PreActResNet { depth: 1001, image_size: 32, classes: 10 }.build("resnet1001").unwrap();
        // He et al. 2016, Table 2: ResNet-1001 on CIFAR-10, 10.2 M parameters: the
        // convolutions and the classifier (10,178,490); batch norm adds 149,216 more.
        assert_eq!(model.parameters(), 10_327_706);
        assert_eq!(without_batch_norm(&model), 10_178_490);
        // Convolutions: 1 + 3 stages x 111 units x 3, plus 3 projections = 1002, plus the fc.
        let convs = model.layers.iter().filter(|layer| layer.kind.name() == "conv2d").count();
        assert_eq!(convs, 1 + 3 * 111 * 3 + 3);
        assert_eq!(
            model.layer("stage3.110.add").map(|layer| layer.output.clone()),
            Some(Shape::from([256, 8, 8]))
        );
        assert_eq!(model.output(), &Shape::from([10]));
        let small = PreActResNet { depth: 164, image_size: 32, classes: 10 }.build("resnet164").unwrap();
        // Paper: 1.7 M, counted the same way (1,679,034 rounds to it).
        let params = without_batch_norm(&small) as f64;
        assert_eq!((params / 1e5).round(), 17.0, "{params}");
        let error =
            PreActResNet { depth: 1000, image_size: 32, classes: 10 }.build("bad").unwrap_err().to_string();
        assert!(error.contains("preact-resnet.depth") && error.contains("9n + 2"), "{error}");
    }
}
