//! `--shard I/N`: the I-th of N disjoint, deterministic slices of a sweep's points (a job array's
//! task), each into a directory of its own that `--merge` joins.

use crate::kinds::{Plan, Point};
use std::str::FromStr;

/// One slice of N (I counted from 1, as SLURM's array task ids usually are).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shard {
    /// Which slice, 1..=count.
    pub index: usize,
    /// How many slices.
    pub count: usize,
}

impl FromStr for Shard {
    type Err = String;

    fn from_str(text: &str) -> Result<Shard, String> {
        let bad = || format!("--shard '{text}': expected I/N with 1 <= I <= N, e.g. 2/3");
        let (i, n) = text.split_once('/').ok_or_else(bad)?;
        let (index, count) = (
            i.trim().parse().map_err(|_| bad())?,
            n.trim().parse().map_err(|_| bad())?,
        );
        if count == 0 || index == 0 || index > count {
            return Err(bad());
        }
        Ok(Shard { index, count })
    }
}

impl Shard {
    /// The directory name of this slice of the spec `stem`: `STEM.shard-I-of-N`.
    pub fn dir_name(&self, stem: &str) -> String {
        format!("{stem}.shard-{}-of-{}", self.index, self.count)
    }

    /// For each of `points`, whether it is in this slice. Points are grouped by the plan's
    /// [`Plan::shard_group`], groups numbered in order of first appearance, and group g belongs to
    /// slice g mod N + 1: round-robin, so that each slice gets a share of every part of the sweep.
    pub fn members(&self, plan: &dyn Plan, points: &[Point]) -> Vec<bool> {
        let mut groups: Vec<crate::results::Record> = Vec::new();
        points
            .iter()
            .map(|point| {
                let group = plan.shard_group(point);
                let ordinal = groups.iter().position(|g| *g == group).unwrap_or_else(|| {
                    groups.push(group);
                    groups.len() - 1
                });
                ordinal % self.count == self.index - 1
            })
            .collect()
    }
}
