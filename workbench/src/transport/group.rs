//! Sub-groups of ranks: a rank's ring, or its Ulysses group, seen as a communicator of its own.
//!
//! A group shares the world communicator's tags and traffic (every rank makes the same calls in the
//! same order, so tags stay identical everywhere); only rank numbers are the group's.

use super::{Comm, Payload, Pending, Phase};
use crate::error::TransportError;
use std::sync::Arc;

/// The members of a group (world ranks, in group order) and this rank's place among them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Group {
    members: Arc<[usize]>,
    index: usize,
}

impl Group {
    /// Every rank of a world of `world`, as seen by `rank`.
    pub fn world(rank: usize, world: usize) -> Self {
        Group {
            members: (0..world).collect(),
            index: rank,
        }
    }

    /// The group of world ranks `members` (in group order) as seen by world rank `rank`, one of them.
    pub fn of(members: Vec<usize>, rank: usize) -> Option<Self> {
        let index = members.iter().position(|&m| m == rank)?;
        Some(Group {
            members: members.into(),
            index,
        })
    }

    /// This rank's index in the group.
    pub fn rank(&self) -> usize {
        self.index
    }

    /// The number of members.
    pub fn size(&self) -> usize {
        self.members.len()
    }

    /// The world rank of member `index`.
    pub fn world_rank(&self, index: usize) -> usize {
        self.members[index]
    }

    /// The members' world ranks, in group order.
    pub fn members(&self) -> &[usize] {
        &self.members
    }
}

/// A communicator seen through a [`Group`]: ranks are indices into the group.
#[derive(Debug)]
pub struct GroupComm<'a> {
    comm: &'a mut Comm,
    group: &'a Group,
}

impl Comm {
    /// This communicator seen through `group`.
    pub fn in_group<'a>(&'a mut self, group: &'a Group) -> GroupComm<'a> {
        GroupComm { comm: self, group }
    }
}

impl GroupComm<'_> {
    /// This rank's index in the group.
    pub fn rank(&self) -> usize {
        self.group.rank()
    }

    /// The group's size.
    pub fn world(&self) -> usize {
        self.group.size()
    }

    /// [`Comm::exchange`] with group members `to` and `from`.
    pub fn exchange(
        &mut self,
        phase: Phase,
        step: usize,
        to: usize,
        from: usize,
        payload: Payload,
    ) -> Result<Pending, TransportError> {
        let (to, from) = (self.group.world_rank(to), self.group.world_rank(from));
        self.comm.exchange(phase, step, to, from, payload)
    }

    /// [`Comm::wait`].
    pub fn wait(&mut self, pending: Pending) -> Result<Payload, TransportError> {
        self.comm.wait(pending)
    }

    /// [`Comm::record_host_device`].
    pub fn record_host_device(&mut self, phase: Phase, step: usize, bytes: u64) {
        self.comm.record_host_device(phase, step, bytes);
    }

    /// Every member sends `payloads[i]` to member `i` and gets member `i`'s payload for it at `[i]`;
    /// its own payload stays (it is not sent or counted). Exchanges go by distance round the group
    /// (to `rank + d`, from `rank − d`, d = 1 … n−1), each its own tag, all posted before any wait:
    /// with n members each rank sends n − 1 messages (the traffic's [`Phase::AllToAll`] records).
    pub fn all_to_all(&mut self, payloads: Vec<Payload>) -> Result<Vec<Payload>, TransportError> {
        self.all_to_all_in(Phase::AllToAll, payloads)
    }

    /// Every member's `payload` to every member, in member order (its own at its index, not sent):
    /// an all-to-all of the same payload to each, its messages counted in `phase`.
    pub fn all_gather(
        &mut self,
        phase: Phase,
        payload: Payload,
    ) -> Result<Vec<Payload>, TransportError> {
        let n = self.world();
        self.all_to_all_in(phase, vec![payload; n])
    }

    /// [`GroupComm::all_to_all`] with its messages counted in `phase`.
    fn all_to_all_in(
        &mut self,
        phase: Phase,
        mut payloads: Vec<Payload>,
    ) -> Result<Vec<Payload>, TransportError> {
        let (me, n) = (self.rank(), self.world());
        if payloads.len() != n {
            return Err(TransportError::LengthMismatch {
                rank: self.group.world_rank(me),
                peer: self.group.world_rank(me),
                expected: n,
                got: payloads.len(),
            });
        }
        let mut received: Vec<Payload> = vec![Vec::new(); n];
        received[me] = std::mem::take(&mut payloads[me]);
        let mut pending = Vec::with_capacity(n - 1);
        for distance in 1..n {
            let (to, from) = ((me + distance) % n, (me + n - distance) % n);
            let payload = std::mem::take(&mut payloads[to]);
            pending.push((from, self.exchange(phase, distance, to, from, payload)?));
        }
        for (from, posted) in pending {
            received[from] = self.wait(posted)?;
        }
        Ok(received)
    }
}
