//! Inception-v3 (Szegedy et al. 2016) as torchvision defines it
//! (`torchvision.models.inception.Inception3`): every convolution is a `BasicConv2d` (convolution
//! without bias, batch norm, ReLU), the auxiliary classifier is included (it runs in training),
//! and the modules keep torchvision's names (`Mixed_5b.branch5x5_2.conv`).
//!
//! The branches of an inception module run one after another in the layer order, each from the
//! module's input, and a `concat` layer joins them in torchvision's order.

use serde::Deserialize;

use crate::family::invalid;
use crate::layer::{LayerKind, Padding, Shape};
use crate::model::{Model, ModelBuilder, ModelError};

/// Inception-v3, the `[inception-v3]` section of a model file.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct InceptionV3 {
    /// Height and width of the input images (the network needs at least 75).
    #[serde(default = "default_image_size")]
    pub image_size: u64,
    /// Classes of the classifiers.
    #[serde(default = "default_classes")]
    pub classes: u64,
    /// Include the auxiliary classifier on `Mixed_6e` (used in training).
    #[serde(default = "default_true")]
    pub aux_logits: bool,
}

fn default_image_size() -> u64 {
    299
}

fn default_classes() -> u64 {
    1000
}

fn default_true() -> bool {
    true
}

impl Default for InceptionV3 {
    /// torchvision's: 299x299 images, 1000 classes, with the auxiliary classifier.
    fn default() -> Self {
        InceptionV3 { image_size: default_image_size(), classes: default_classes(), aux_logits: true }
    }
}

/// Kernel `(height, width)`, stride and padding `(height, width)` of a `BasicConv2d`.
type ConvShape = ((u64, u64), u64, (u64, u64));

const K1: ConvShape = ((1, 1), 1, (0, 0));
const K3: ConvShape = ((3, 3), 1, (1, 1));
const K3_VALID: ConvShape = ((3, 3), 1, (0, 0));
const K3_STRIDE2: ConvShape = ((3, 3), 2, (0, 0));
const K5: ConvShape = ((5, 5), 1, (2, 2));
const K1X7: ConvShape = ((1, 7), 1, (0, 3));
const K7X1: ConvShape = ((7, 1), 1, (3, 0));
const K1X3: ConvShape = ((1, 3), 1, (0, 1));
const K3X1: ConvShape = ((3, 1), 1, (1, 0));

struct Net {
    builder: ModelBuilder,
}

impl Net {
    /// A `BasicConv2d`: convolution without bias, batch norm (eps 0.001), ReLU.
    fn conv(&mut self, prefix: &str, out_channels: u64, shape: ConvShape) -> Result<Shape, ModelError> {
        let ((kh, kw), stride, (ph, pw)) = shape;
        let conv = LayerKind::Conv {
            out_channels,
            kernel: vec![kh, kw],
            stride: vec![stride, stride],
            padding: Padding::Symmetric(vec![ph, pw]),
            dilation: vec![1, 1],
            groups: 1,
            bias: false,
        };
        self.builder.layer(format!("{prefix}.conv"), conv)?;
        self.builder.layer(format!("{prefix}.bn"), LayerKind::BatchNorm)?;
        Ok(self.builder.layer(format!("{prefix}.relu"), LayerKind::relu())?.clone())
    }

    /// A chain of `BasicConv2d`s from `input`, returning the last output.
    fn chain(&mut self, input: &Shape, convs: &[(&str, u64, ConvShape)]) -> Result<Shape, ModelError> {
        self.builder.branch_from(input.clone());
        let mut output = input.clone();
        for &(name, channels, shape) in convs {
            output = self.conv(name, channels, shape)?;
        }
        Ok(output)
    }

    fn pool(
        &mut self,
        name: String,
        input: &Shape,
        max: bool,
        kernel: u64,
        stride: u64,
        padding: u64,
    ) -> Result<Shape, ModelError> {
        self.builder.branch_from(input.clone());
        let (kernel, stride, padding) = (vec![kernel; 2], vec![stride; 2], vec![padding; 2]);
        let kind = if max {
            LayerKind::MaxPool { kernel, stride, padding, ceil_mode: false }
        } else {
            LayerKind::AvgPool { kernel, stride, padding, ceil_mode: false }
        };
        Ok(self.builder.layer(name, kind)?.clone())
    }

    /// Concatenates branch outputs (the first becomes the current tensor).
    fn join(&mut self, name: String, branches: &[Shape]) -> Result<Shape, ModelError> {
        let (first, others) = branches
            .split_first()
            .ok_or_else(|| invalid(self.builder.name(), &name, "no branches".to_string()))?;
        self.builder.branch_from(first.clone());
        Ok(self.builder.concat(name, 0, others)?.clone())
    }

    fn inception_a(&mut self, m: &str, input: &Shape, pool_features: u64) -> Result<Shape, ModelError> {
        let b1 = self.chain(input, &[(&format!("{m}.branch1x1"), 64, K1)])?;
        let b5 = self
            .chain(input, &[(&format!("{m}.branch5x5_1"), 48, K1), (&format!("{m}.branch5x5_2"), 64, K5)])?;
        let b3 = self.chain(
            input,
            &[
                (&format!("{m}.branch3x3dbl_1"), 64, K1),
                (&format!("{m}.branch3x3dbl_2"), 96, K3),
                (&format!("{m}.branch3x3dbl_3"), 96, K3),
            ],
        )?;
        let pooled = self.pool(format!("{m}.avg_pool"), input, false, 3, 1, 1)?;
        let bp = self.chain(&pooled, &[(&format!("{m}.branch_pool"), pool_features, K1)])?;
        self.join(format!("{m}.concat"), &[b1, b5, b3, bp])
    }

    fn inception_b(&mut self, m: &str, input: &Shape) -> Result<Shape, ModelError> {
        let b3 = self.chain(input, &[(&format!("{m}.branch3x3"), 384, K3_STRIDE2)])?;
        let bd = self.chain(
            input,
            &[
                (&format!("{m}.branch3x3dbl_1"), 64, K1),
                (&format!("{m}.branch3x3dbl_2"), 96, K3),
                (&format!("{m}.branch3x3dbl_3"), 96, K3_STRIDE2),
            ],
        )?;
        let bp = self.pool(format!("{m}.max_pool"), input, true, 3, 2, 0)?;
        self.join(format!("{m}.concat"), &[b3, bd, bp])
    }

    fn inception_c(&mut self, m: &str, input: &Shape, c7: u64) -> Result<Shape, ModelError> {
        let b1 = self.chain(input, &[(&format!("{m}.branch1x1"), 192, K1)])?;
        let b7 = self.chain(
            input,
            &[
                (&format!("{m}.branch7x7_1"), c7, K1),
                (&format!("{m}.branch7x7_2"), c7, K1X7),
                (&format!("{m}.branch7x7_3"), 192, K7X1),
            ],
        )?;
        let bd = self.chain(
            input,
            &[
                (&format!("{m}.branch7x7dbl_1"), c7, K1),
                (&format!("{m}.branch7x7dbl_2"), c7, K7X1),
                (&format!("{m}.branch7x7dbl_3"), c7, K1X7),
                (&format!("{m}.branch7x7dbl_4"), c7, K7X1),
                (&format!("{m}.branch7x7dbl_5"), 192, K1X7),
            ],
        )?;
        let pooled = self.pool(format!("{m}.avg_pool"), input, false, 3, 1, 1)?;
        let bp = self.chain(&pooled, &[(&format!("{m}.branch_pool"), 192, K1)])?;
        self.join(format!("{m}.concat"), &[b1, b7, bd, bp])
    }

    fn inception_d(&mut self, m: &str, input: &Shape) -> Result<Shape, ModelError> {
        let b3 = self.chain(
            input,
            &[(&format!("{m}.branch3x3_1"), 192, K1), (&format!("{m}.branch3x3_2"), 320, K3_STRIDE2)],
        )?;
        let b7 = self.chain(
            input,
            &[
                (&format!("{m}.branch7x7x3_1"), 192, K1),
                (&format!("{m}.branch7x7x3_2"), 192, K1X7),
                (&format!("{m}.branch7x7x3_3"), 192, K7X1),
                (&format!("{m}.branch7x7x3_4"), 192, K3_STRIDE2),
            ],
        )?;
        let bp = self.pool(format!("{m}.max_pool"), input, true, 3, 2, 0)?;
        self.join(format!("{m}.concat"), &[b3, b7, bp])
    }

    fn inception_e(&mut self, m: &str, input: &Shape) -> Result<Shape, ModelError> {
        let b1 = self.chain(input, &[(&format!("{m}.branch1x1"), 320, K1)])?;
        let b3 = self.chain(input, &[(&format!("{m}.branch3x3_1"), 384, K1)])?;
        let b3a = self.chain(&b3, &[(&format!("{m}.branch3x3_2a"), 384, K1X3)])?;
        let b3b = self.chain(&b3, &[(&format!("{m}.branch3x3_2b"), 384, K3X1)])?;
        let b3 = self.join(format!("{m}.branch3x3_concat"), &[b3a, b3b])?;
        let bd = self.chain(
            input,
            &[(&format!("{m}.branch3x3dbl_1"), 448, K1), (&format!("{m}.branch3x3dbl_2"), 384, K3)],
        )?;
        let bda = self.chain(&bd, &[(&format!("{m}.branch3x3dbl_3a"), 384, K1X3)])?;
        let bdb = self.chain(&bd, &[(&format!("{m}.branch3x3dbl_3b"), 384, K3X1)])?;
        let bd = self.join(format!("{m}.branch3x3dbl_concat"), &[bda, bdb])?;
        let pooled = self.pool(format!("{m}.avg_pool"), input, false, 3, 1, 1)?;
        let bp = self.chain(&pooled, &[(&format!("{m}.branch_pool"), 192, K1)])?;
        self.join(format!("{m}.concat"), &[b1, b3, bd, bp])
    }

    /// The auxiliary classifier (`InceptionAux`), from `Mixed_6e`'s output.
    fn aux(&mut self, input: &Shape, classes: u64) -> Result<(), ModelError> {
        let pooled = self.pool("AuxLogits.avg_pool".to_string(), input, false, 5, 3, 0)?;
        self.chain(&pooled, &[("AuxLogits.conv0", 128, K1), ("AuxLogits.conv1", 768, ((5, 5), 1, (0, 0)))])?;
        self.builder.layer("AuxLogits.avgpool", LayerKind::GlobalAvgPool)?;
        self.builder.layer("AuxLogits.fc", LayerKind::Linear { out_features: classes, bias: true })?;
        Ok(())
    }
}

impl InceptionV3 {
    /// Builds the network, named `name`.
    pub fn build(&self, name: &str) -> Result<Model, ModelError> {
        if self.image_size < 75 {
            return Err(invalid(
                name,
                "inception-v3.image-size",
                format!("{} is too small; Inception-v3 needs at least 75", self.image_size),
            ));
        }
        if self.classes == 0 {
            return Err(invalid(name, "inception-v3.classes", "must be at least 1".to_string()));
        }
        let mut builder = ModelBuilder::new(name, Shape::from([3, self.image_size, self.image_size]));
        builder.describe(
            "inception-v3",
            format!(
                "Inception-v3 (torchvision layout), {0}x{0} images, {1} classes",
                self.image_size, self.classes
            ),
        );
        let mut net = Net { builder };
        let input = net.builder.shape().clone();
        net.chain(
            &input,
            &[("Conv2d_1a_3x3", 32, K3_STRIDE2), ("Conv2d_2a_3x3", 32, K3_VALID), ("Conv2d_2b_3x3", 64, K3)],
        )?;
        let x = net
            .builder
            .layer(
                "maxpool1",
                LayerKind::MaxPool {
                    kernel: vec![3, 3],
                    stride: vec![2, 2],
                    padding: vec![0, 0],
                    ceil_mode: false,
                },
            )?
            .clone();
        net.chain(&x, &[("Conv2d_3b_1x1", 80, K1), ("Conv2d_4a_3x3", 192, K3_VALID)])?;
        let x = net
            .builder
            .layer(
                "maxpool2",
                LayerKind::MaxPool {
                    kernel: vec![3, 3],
                    stride: vec![2, 2],
                    padding: vec![0, 0],
                    ceil_mode: false,
                },
            )?
            .clone();
        let x = net.inception_a("Mixed_5b", &x, 32)?;
        let x = net.inception_a("Mixed_5c", &x, 64)?;
        let x = net.inception_a("Mixed_5d", &x, 64)?;
        let x = net.inception_b("Mixed_6a", &x)?;
        let x = net.inception_c("Mixed_6b", &x, 128)?;
        let x = net.inception_c("Mixed_6c", &x, 160)?;
        let x = net.inception_c("Mixed_6d", &x, 160)?;
        let x = net.inception_c("Mixed_6e", &x, 192)?;
        if self.aux_logits {
            net.aux(&x, self.classes)?;
        }
        let x = net.inception_d("Mixed_7a", &x)?;
        let x = net.inception_e("Mixed_7b", &x)?;
        let x = net.inception_e("Mixed_7c", &x)?;
        net.builder.branch_from(x);
        net.builder.layer("avgpool", LayerKind::GlobalAvgPool)?;
        net.builder.layer("dropout", LayerKind::Dropout)?;
        net.builder.layer("fc", LayerKind::Linear { out_features: self.classes, bias: true })?;
        Ok(net.builder.finish())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inception_v3_matches_torchvision() {
        let model = InceptionV3::default().build("inception-v3").unwrap();
        // torchvision: 27,161,264 parameters (with the auxiliary classifier), 5.71 GMACs.
        assert_eq!(model.parameters(), 27_161_264);
        let macs = model.macs_per_sample();
        assert!((macs / 5.71e9 - 1.0).abs() < 0.01, "{macs}");
        let shape = |name: &str| model.layer(name).map(|layer| layer.output.clone());
        assert_eq!(shape("maxpool2"), Some(Shape::from([192, 35, 35])));
        assert_eq!(shape("Mixed_5b.concat"), Some(Shape::from([256, 35, 35])));
        assert_eq!(shape("Mixed_6a.concat"), Some(Shape::from([768, 17, 17])));
        assert_eq!(shape("Mixed_7a.concat"), Some(Shape::from([1280, 8, 8])));
        assert_eq!(shape("Mixed_7c.concat"), Some(Shape::from([2048, 8, 8])));
        assert_eq!(shape("AuxLogits.fc"), Some(Shape::from([1000])));
        assert_eq!(model.output(), &Shape::from([1000]));
        let without =
            InceptionV3 { aux_logits: false, ..InceptionV3::default() }.build("inception-v3").unwrap();
        // torchvision without AuxLogits: 23,834,568.
        assert_eq!(without.parameters(), 23_834_568);
    }
}
