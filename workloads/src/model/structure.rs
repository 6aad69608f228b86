//! A model's structure, derived from its layers alone: the numbered blocks its layer names
//! form (`layers.3.*`, `layer1.0.*`) and the units a pipeline partition cuts between. Memory
//! accounting (per-block activations, recomputation) and the pipeline partition both read it,
//! so it lives with the model and is computed once per model.

use std::ops::Range;
use std::sync::{Arc, OnceLock};

use super::Model;

/// Where each layer sits in the model's numbered blocks, and the units a pipeline cuts
/// between: derived from the layers alone (their names and parameters).
#[derive(Debug, PartialEq)]
pub(crate) struct Structure {
    /// The numbered block of every layer (`Some(block index)` inside one), see
    /// `memory::block_ids`.
    pub(crate) blocks: Vec<Option<u32>>,
    /// [`Model::pipeline_units`].
    pub(crate) units: Vec<Range<usize>>,
}

/// A model's [`Structure`], computed once. The layers must not change after the first query
/// (models are built by [`ModelBuilder`] and not edited afterwards); debug builds check it.
#[derive(Debug, Clone, Default)]
pub(crate) struct StructureCache(OnceLock<Arc<Structure>>);

impl PartialEq for StructureCache {
    /// A cache: equal models are equal whatever it holds.
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Structure {
    fn of(model: &Model) -> Structure {
        let blocks = block_ids(model);
        let units = units_of(model, &blocks);
        Structure { blocks, units }
    }
}

impl Model {
    /// The model's block structure, parsed from the layer names once.
    fn structure(&self) -> &Structure {
        let structure = self.structure.0.get_or_init(|| Arc::new(Structure::of(self)));
        debug_assert_eq!(**structure, Structure::of(self), "model {}: layers changed after use", self.name);
        structure
    }

    /// The numbered block of every layer: `Some(block index)` inside one.
    pub fn blocks(&self) -> &[Option<u32>] {
        &self.structure().blocks
    }

    /// The units a pipeline partition cuts between, as layer ranges covering the model: each
    /// numbered block (transformer layer, residual block) with the stem joined to the first and
    /// the head to the last; in a model without blocks (VGG, AlexNet: a plain sequence of
    /// layers, as GPipe and HyPar-Flow partition them) each layer with parameters and the
    /// parameter-free layers after it (activation, pooling, dropout). Computed once per model.
    pub fn pipeline_units(&self) -> &[Range<usize>] {
        &self.structure().units
    }
}

/// The numbered block a layer belongs to: its name up to the first numeric component
/// (`layers.3.attention.qkv` -> `layers.3`), or `None` (stem and head layers).
pub(crate) fn block_of(name: &str) -> Option<&str> {
    let mut end = 0;
    for part in name.split('.') {
        end += part.len();
        if !part.is_empty() && part.bytes().all(|byte| byte.is_ascii_digit()) {
            return Some(&name[..end]);
        }
        end += 1; // the dot
    }
    None
}

/// The block of every layer, numbered in order: [`block_of`] its name, if at least two
/// consecutive layers share it (a "block" of one layer, such as VGG's `features.3`, is an
/// ordinary layer). Consecutive layers are in the same block when their numbers are equal.
/// Parsed once per model ([`Model::blocks`] keeps it).
fn block_ids(model: &Model) -> Vec<Option<u32>> {
    let names: Vec<Option<&str>> = model.layers.iter().map(|layer| block_of(&layer.name)).collect();
    let mut ids: Vec<Option<u32>> = Vec::with_capacity(names.len());
    let mut count = 0u32;
    for index in 0..names.len() {
        let shared = (index > 0 && names[index - 1] == names[index])
            || names.get(index + 1).is_some_and(|next| *next == names[index]);
        ids.push(names[index].filter(|_| shared).map(|_| {
            // A new block unless the previous layer is in this one.
            if !(index > 0 && ids[index - 1].is_some() && names[index - 1] == names[index]) {
                count += 1;
            }
            count - 1
        }));
    }
    ids
}

/// [`Model::pipeline_units`] of `model`, whose layers are in the numbered `blocks`.
fn units_of(model: &Model, blocks: &[Option<u32>]) -> Vec<Range<usize>> {
    let layers = model.layers.len();
    let count = blocks.iter().flatten().max().map_or(0, |&b| b as usize + 1);
    let mut starts: Vec<usize> = if count > 0 {
        let mut starts = vec![usize::MAX; count];
        for (index, block) in blocks.iter().enumerate() {
            if let Some(b) = block
                && starts[*b as usize] == usize::MAX
            {
                starts[*b as usize] = index;
            }
        }
        starts
    } else {
        (0..layers).filter(|&index| model.layers[index].cost.params > 0).collect()
    };
    if starts.is_empty() {
        starts.push(0);
    }
    starts[0] = 0;
    (0..starts.len()).map(|u| starts[u]..if u + 1 < starts.len() { starts[u + 1] } else { layers }).collect()
}
