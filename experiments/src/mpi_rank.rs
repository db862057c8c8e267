//! Where a command's ranks run: in-process threads, or one process per rank under `mpirun`.

use anyhow::Result;
#[cfg(not(feature = "mpi"))]
use anyhow::bail;
use std::time::Duration;
use workbench::transport::Comm;

/// Under `mpirun` (with the `mpi` feature), runs `body` as this process's rank and returns
/// `Some((rank, output))`; otherwise `None`, and the caller runs its threads. A rank whose `body`
/// fails prints its error and aborts the whole MPI job at once, so its peers do not wait for a
/// timeout.
pub fn as_mpi_rank<T, E: std::fmt::Display>(
    timeout: Duration,
    body: impl FnOnce(Comm) -> Result<T, E>,
) -> Result<Option<(usize, T)>> {
    #[cfg(feature = "mpi")]
    if workbench::transport::launched_by_mpirun() {
        use mpi::Threading;
        use mpi::traits::Communicator;
        use workbench::transport::mpi::MpiTransport;
        // The rank's `Comm` sits behind a mutex: MPI is called by one thread at a time, not always
        // the main one (an autodiff backward runs wherever `backward()` is called). That is
        // MPI_THREAD_SERIALIZED; ask for it and refuse a library that offers less.
        let (universe, provided) = mpi::initialize_with_threading(Threading::Serialized)
            .ok_or_else(|| anyhow::anyhow!("MPI was already initialized in this process"))?;
        if matches!(provided, Threading::Single | Threading::Funneled) {
            anyhow::bail!(
                "this MPI library provides threading level {provided:?}; ringbench needs Serialized"
            );
        }
        let comm = Comm::new(Box::new(MpiTransport::new(universe.world(), timeout)));
        let rank = comm.rank();
        return match body(comm) {
            Ok(output) => Ok(Some((rank, output))),
            Err(e) => {
                // One write: `eprintln!` writes each formatted piece separately, and mpirun may
                // print the abort's banner between two of them, splitting the line.
                use std::io::Write;
                let line = format!("error: MPI rank {rank}: {e}\n");
                let mut stderr = std::io::stderr().lock();
                let _ = stderr
                    .write_all(line.as_bytes())
                    .and_then(|()| stderr.flush());
                drop(stderr);
                universe.world().abort(1)
            }
        };
    }
    #[cfg(not(feature = "mpi"))]
    if workbench::transport::launched_by_mpirun() {
        let _ = (timeout, body);
        bail!(
            "started by mpirun, but this ringbench was built without the `mpi` feature \
             (cargo build --features mpi)"
        );
    }
    Ok(None)
}

/// This process's rank as an MPI launcher says in the environment (Open MPI, MPICH, PMIx), read
/// before MPI starts: `None` outside a launcher of more than one rank. Used to let one process of a
/// job (rank 0) own the files the job writes.
pub fn launcher_rank() -> Option<usize> {
    if !workbench::transport::launched_by_mpirun() {
        return None;
    }
    ["OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK"]
        .iter()
        .find_map(|v| std::env::var(v).ok()?.parse().ok())
}
