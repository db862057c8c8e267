//! Times the `balanced` solver: `cargo run --release -p strategies --example solve_time [LEN RANKS]`.
use strategies::{Balanced, Partition, Workload};
fn main() {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .map(|a| a.parse().unwrap())
        .collect();
    let (len, ranks) = (
        args.first().copied().unwrap_or(1 << 20),
        args.get(1).copied().unwrap_or(64),
    );
    for window in [None, Some(len / 16)] {
        let w = Workload::causal(&[], window, len / ranks);
        let t = std::time::Instant::now();
        let l = Balanced::default().layout_for(len, ranks, &w).unwrap();
        println!(
            "S={len} N={ranks} window={window:?}: {:.3} s, {} positions on rank 0",
            t.elapsed().as_secs_f64(),
            l.positions[0].len()
        );
    }
}
