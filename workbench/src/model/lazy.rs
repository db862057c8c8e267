//! Burn initializes parameters lazily, on first use; this forces it, so that clones share weights.

use burn::module::{Module, ModuleVisitor, Param};
use burn::tensor::{Tensor, backend::Backend};

/// Runs every parameter's lazy initializer now. Burn initializes parameters on first use, and a
/// clone made before that gets its own initializer: replicas forked for the ranks would then hold
/// different random weights.
pub fn materialize<B: Backend, M: Module<B>>(module: &M) {
    struct Touch;
    impl<B: Backend> ModuleVisitor<B> for Touch {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            let _ = param.val();
        }
    }
    module.visit(&mut Touch);
}
