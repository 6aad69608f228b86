//! The halo exchange of spatial parallelism (CNNs, [`crate::cnn`]): before a spatially split
//! layer's forward kernel each rank sends the rows its grid neighbours need, and after its
//! backward-data kernel the gradient of the rows it received goes back to their owner.
//!
//! Invariants: dimensions are exchanged one after another (corners travel with the later
//! dimension); sends to the upper neighbour run on [`SPATIAL_STREAM`], to the lower on
//! [`HALO_STREAM`] (both directions at once); a send is keyed ([`Key::Halo`]) so that the
//! neighbour's next kernel waits for it.

use sim_core::graph::{GroupKind, Op, OpKind, Pass, RankId};
use sim_core::units::Bytes;

use super::rank::{RankEmitter, layer_meta};
use super::{Dep, Key};
use crate::{HALO_STREAM, SPATIAL_STREAM, cnn};

impl RankEmitter<'_, '_> {
    /// The halo exchange of layer `layer` with this rank's grid neighbours, dimension after
    /// dimension (a dimension's sends wait for the previous dimension's halos, so corners travel
    /// with the later dimension): `pass` 0 or 1 sends the rows before the forward kernel, 2
    /// sends the halo's gradient back after the backward-data kernel (dimensions in reverse).
    /// Returns the receptions the next kernel waits for.
    pub(super) fn halo(&mut self, layer: usize, micro: u32, halo: &cnn::Halo, pass: u8) -> Vec<Dep> {
        let plan = self.plan;
        let rank = RankId(self.rank);
        let grid = &plan.spatial_grid;
        let mut coordinates = plan.layout.coordinates(rank);
        let position = cnn::grid_coordinates(coordinates.tensor, grid);
        let neighbour = |axis: usize, up: bool| -> Option<u32> {
            let c = position[axis];
            let moved = if up { (c + 1 < grid[axis]).then_some(c + 1) } else { c.checked_sub(1) }?;
            let mut at = position.clone();
            at[axis] = moved;
            Some(cnn::grid_index(&at, grid))
        };
        let mut producer: Vec<Dep> = self.waiting.clone();
        producer.extend(self.last_compute.map(Dep::Local));
        let backward = pass == 2;
        let label =
            self.comm_label(if backward { "spatial halo gradient send" } else { "spatial halo send" });
        let meta = layer_meta(layer, [Pass::Forward, Pass::Recompute, Pass::BackwardData][usize::from(pass)])
            .with_group(GroupKind::Spatial)
            .with_origin(self.origin(HALO_ORIGIN));
        let order: Vec<usize> =
            if backward { (0..halo.dims.len()).rev().collect() } else { (0..halo.dims.len()).collect() };
        let mut received = Vec::new();
        for d in order {
            let dim = halo.dims[d];
            let mut this_dim = Vec::new();
            // Bytes every rank sends up (to its upper neighbour) or down. Forward: the upper
            // neighbour's lower halo is `from_lower` of my rows. Backward: the gradient of the
            // rows I received goes back to their owner.
            let sent = |up: bool| if up != backward { dim.from_lower } else { dim.from_upper };
            for up in [true, false] {
                let bytes = sent(up);
                if bytes.0 == 0 {
                    continue;
                }
                if let Some(index) = neighbour(dim.grid_axis, up) {
                    coordinates.tensor = index;
                    let to = plan.layout.rank(coordinates).0;
                    let mut deps = producer.clone();
                    deps.extend(self.launch(meta));
                    let send = self.buffer.push(
                        Op {
                            kind: OpKind::Transfer { dst: RankId(to), bytes },
                            rank,
                            stream: if up { SPATIAL_STREAM } else { HALO_STREAM },
                            label,
                            meta,
                        },
                        &deps,
                    );
                    let key =
                        Key::Halo { sender: self.rank, layer: layer as u32, micro, dim: d as u8, up, pass };
                    self.shared.keys.insert(key, (self.rank, send));
                }
                // The neighbour on the other side sends the same way to me.
                if let Some(index) = neighbour(dim.grid_axis, !up) {
                    coordinates.tensor = index;
                    let sender = plan.layout.rank(coordinates).0;
                    this_dim.push(Dep::Key(Key::Halo {
                        sender,
                        layer: layer as u32,
                        micro,
                        dim: d as u8,
                        up,
                        pass,
                    }));
                }
            }
            if let Some(staging) = plan.strategy.parallelism.cnn_staging {
                // The rows received this dimension: the neighbour on the other side of each
                // direction sends what this rank would send that way.
                let bytes: u64 = [true, false]
                    .into_iter()
                    .filter(|&up| neighbour(dim.grid_axis, !up).is_some())
                    .map(|up| sent(up).0)
                    .sum();
                let stream = if backward { HALO_STREAM } else { SPATIAL_STREAM };
                if let Some(op) =
                    self.stage(staging, staging.halo_bytes(Bytes(bytes)), stream, &this_dim, meta)
                {
                    this_dim = vec![Dep::Local(op)];
                }
            }
            received.extend(this_dim.iter().copied());
            if !this_dim.is_empty() {
                producer = this_dim;
            }
        }
        received
    }
}

/// The origin of halo exchanges.
const HALO_ORIGIN: &str = "halo";
