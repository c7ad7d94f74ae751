//! Shape buckets: one model re-targeted to the same graph at other input
//! shapes, keeping its device weights.

use super::{unsupported, CudaModel};
use rlx_ir::Graph;
use rlx_runtime::RuntimeError;

impl CudaModel {
    /// Re-target this model to `graph`: the same model at another shape
    /// bucket (other batch or sequence length; the same params with the
    /// same shapes). The arena is planned again for the new shapes and the
    /// CUDA graphs of hybrid segments are captured again at the next run
    /// (a captured graph bakes in its shapes and addresses, so it is never
    /// replayed for other shapes). Weights already on the device stay
    /// there and are not uploaded again, param-only results (such as a
    /// fused QKV weight) included when the new graph derives them the same
    /// way. Params the new graph has and this model lacks must be set
    /// before the next run. On error the model is unchanged.
    pub fn set_graph(&mut self, graph: Graph) -> Result<(), RuntimeError> {
        let mut next = CudaModel::compile(graph, &self.opts)?;
        for (name, shape) in &next.param_shapes {
            if let Some(mine) = self.param_shapes.get(name) {
                if mine != shape {
                    return Err(unsupported(format!(
                        "set_graph: param '{name}' is {shape} in the new graph and {mine} here"
                    )));
                }
            }
        }
        // Param-only results carry over when both graphs derive the same
        // names from the same params with the same shapes.
        let same_prep = match (&self.prep, &next.prep) {
            (None, None) => true,
            (Some(a), Some(b)) => {
                a.names == b.names
                    && a.params == b.params
                    && a.names.iter().all(|n| {
                        let shape = |m: &CudaModel| {
                            m.core
                                .param_ids
                                .get(n)
                                .map(|&id| m.core.graph.node(id).shape.clone())
                        };
                        shape(self) == shape(&next)
                    })
            }
            _ => false,
        };
        let statics: Vec<String> = match (&next.prep, same_prep) {
            (Some(p), true) => p.names.clone(),
            _ => Vec::new(),
        };
        for (name, t) in std::mem::take(&mut self.params) {
            if next.param_shapes.contains_key(&name) || statics.contains(&name) {
                next.params.insert(name, t);
            }
        }
        next.prep_dirty = if same_prep {
            self.prep_dirty
        } else {
            next.prep.is_some()
        };
        let stale: Vec<String> = self.stale.drain().collect();
        for (name, buf) in self.dev_params.drain() {
            let kept = next.params.contains_key(&name)
                && next.core.param_ids.contains_key(&name)
                && !stale.contains(&name)
                && self.core.param_store(&name) == next.core.param_store(&name);
            if kept {
                next.dev_params.insert(name, buf);
            }
        }
        next.stale = next
            .params
            .keys()
            .filter(|n| !next.dev_params.contains_key(*n))
            .cloned()
            .collect();
        next.profile = self.profile.take();
        *self = next;
        Ok(())
    }
}
