//! The ring's own axes, swept together by the `attn` and `train` kinds: strategy, forward direction,
//! backward scheme, each a list of names with a default; and [`grid`], every combination of a
//! sweep's axes.

use crate::spec::SpecText;
use anyhow::Result;
use strategies::Partition;
use workbench::{BackwardScheme, Direction};

/// `[sweep] strategies, forward, backward`, parsed.
pub struct RingAxes {
    /// Default: every registered strategy.
    pub strategies: Vec<&'static dyn Partition>,
    /// Default: `cw`.
    pub forward: Vec<Direction>,
    /// Default: `kv`.
    pub backward: Vec<BackwardScheme>,
}

impl RingAxes {
    /// The three lists of `[sweep]`; a name that does not parse is an error naming key and line.
    pub fn parse(
        spec: &SpecText,
        strategies: &Option<Vec<String>>,
        forward: &Option<Vec<String>>,
        backward: &Option<Vec<String>>,
    ) -> Result<RingAxes> {
        let all: Vec<String> = strategies::names().into_iter().map(String::from).collect();
        let names = spec.list_or("sweep", "strategies", strategies, all)?;
        let forward = spec.list_or("sweep", "forward", forward, vec!["cw".into()])?;
        let backward = spec.list_or("sweep", "backward", backward, vec!["kv".into()])?;
        Ok(RingAxes {
            strategies: spec.strategies("sweep", "strategies", &names)?,
            forward: spec.parsed("sweep", "forward", &forward)?,
            backward: spec.parsed("sweep", "backward", &backward)?,
        })
    }
}

/// Every combination of one index per axis of `lens` (axis i has `lens[i]` values), the last axis
/// varying fastest: a sweep's points in the order its lists are written.
pub fn grid(lens: &[usize]) -> Vec<Vec<usize>> {
    lens.iter().fold(vec![Vec::new()], |combos, &len| {
        combos
            .into_iter()
            .flat_map(|c| {
                (0..len).map(move |i| {
                    let mut next = c.clone();
                    next.push(i);
                    next
                })
            })
            .collect()
    })
}

#[cfg(test)]
mod tests {
    use super::grid;

    #[test]
    fn a_grid_has_every_combination_last_axis_fastest() {
        assert_eq!(
            grid(&[2, 3]),
            [[0, 0], [0, 1], [0, 2], [1, 0], [1, 1], [1, 2]].map(|c| c.to_vec())
        );
        assert!(grid(&[2, 0, 3]).is_empty());
        assert_eq!(grid(&[]), vec![Vec::<usize>::new()]);
    }
}
