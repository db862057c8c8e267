//! The ring's own axes, swept together by the `attn` and `train` kinds: strategy, forward direction,
//! backward scheme, each a list of names with a default.

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
