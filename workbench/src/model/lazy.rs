//! Burn initializes parameters lazily, on first use, from one generator per backend shared by every
//! thread: this forces initialization, so that clones share weights, and draws seeded weights alone.

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

/// What `draw` returns, drawn from `seed` alone. Burn's generator is global to the backend: two
/// threads that seed and draw at once would interleave their draws, so every seeded draw made through
/// here holds one process-wide lock. `draw` must draw every weight it needs before it returns
/// ([`materialize`]; the models' `init` functions do). The lock only helps if nothing draws beside
/// it: every draw from Burn's generator in this workspace goes through here, and inputs that need no
/// seed are drawn on the host.
pub fn seeded<B: Backend, T>(seed: u64, device: &B::Device, draw: impl FnOnce() -> T) -> T {
    static DRAW: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _turn = DRAW.lock().unwrap_or_else(|e| e.into_inner());
    B::seed(device, seed);
    draw()
}
