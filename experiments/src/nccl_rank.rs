//! One process per GPU over NCCL (`--nccl-id-file`): the launcher's rank, world size and local GPU,
//! and the rank's transport.

use crate::backend::BackendName;
use anyhow::Result;
use std::path::Path;
use std::time::Duration;
use workbench::transport::Comm;

/// This process's place among the ranks, as its launcher (torchrun-style or Open MPI's mpirun)
/// says in the environment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NcclRank {
    /// This rank.
    pub rank: usize,
    /// The number of ranks.
    pub world: usize,
    /// This rank's GPU on its machine (0 when the launcher does not say).
    pub gpu: usize,
}

impl NcclRank {
    /// The rank, world size and local GPU from `RANK`, `WORLD_SIZE`, `LOCAL_RANK` (or Open MPI's
    /// `OMPI_COMM_WORLD_*`); an error naming what is missing, or naming the `nccl` feature when this
    /// ringbench was built without it.
    pub fn from_env() -> Result<Self> {
        if !cfg!(feature = "nccl") {
            anyhow::bail!(
                "--nccl-id-file needs a ringbench built with the `nccl` feature (cargo build --features nccl)"
            );
        }
        Ok(Self {
            rank: launcher_var(&["RANK", "OMPI_COMM_WORLD_RANK"])?,
            world: launcher_var(&["WORLD_SIZE", "OMPI_COMM_WORLD_SIZE"])?,
            gpu: launcher_var(&["LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK"]).unwrap_or(0),
        })
    }

    /// The device indices this rank runs on: flex has one device; a GPU backend runs on this
    /// rank's GPU.
    pub fn devices(&self, backend: BackendName) -> Vec<usize> {
        match backend {
            BackendName::Flex => Vec::new(),
            _ => vec![self.gpu],
        }
    }

    /// This rank's communicator: the ranks meet through `id_file` (rank 0 writes NCCL's id there)
    /// and wait at most `timeout` for a silent peer.
    #[cfg(feature = "nccl")]
    pub fn join(&self, id_file: &Path, timeout: Duration) -> Result<Comm> {
        let transport = workbench::transport::nccl::NcclTransport::from_id_file(
            self.rank, self.world, self.gpu, id_file, timeout,
        )?;
        Ok(Comm::new(Box::new(transport)))
    }

    /// Without the `nccl` feature there is no NCCL to join ([`NcclRank::from_env`] says so first).
    #[cfg(not(feature = "nccl"))]
    pub fn join(&self, _: &Path, _: Duration) -> Result<Comm> {
        anyhow::bail!("--nccl-id-file needs a ringbench built with the `nccl` feature")
    }
}

/// A variable of the launcher's environment: the first of `names` that is set, as a count; an
/// error naming the variable and its value when it is not one.
fn launcher_var(names: &[&str]) -> Result<usize> {
    let (name, value) = names
        .iter()
        .find_map(|n| std::env::var(n).ok().map(|v| (n, v)))
        .ok_or_else(|| {
            anyhow::anyhow!("--nccl-id-file needs one of {names:?} in the environment")
        })?;
    value
        .parse()
        .map_err(|e| anyhow::anyhow!("{name}={value:?} is not a rank count or index: {e}"))
}
