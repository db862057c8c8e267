//! Where ranks run: in-process threads, or one process per rank under a launcher (`mpirun`,
//! `srun`), for one command or for every job of a launched sweep point ([`ProcessWorld`]).

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
                say_rank_error(rank, &e);
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

/// Prints `error: MPI rank R: ...` in one write: `eprintln!` writes each formatted piece
/// separately, and mpirun may print an abort's banner between two of them, splitting the line (the
/// runner reads a failed job's reason from it).
fn say_rank_error(rank: usize, error: &dyn std::fmt::Display) {
    use std::io::Write;
    let line = format!("error: MPI rank {rank}: {error}\n");
    let mut stderr = std::io::stderr().lock();
    let _ = stderr
        .write_all(line.as_bytes())
        .and_then(|()| stderr.flush());
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

/// MPI held for a whole process that runs many jobs as one rank (a sweep point launched as a job of
/// processes): started once, each job's ranks get a communicator of their own from
/// [`world_comm`], and MPI is finalized when this is dropped.
pub struct ProcessWorld {
    #[cfg(feature = "mpi")]
    _universe: mpi::environment::Universe,
    /// This process's rank.
    pub rank: usize,
    /// The processes of the job.
    pub size: usize,
}

#[cfg(feature = "mpi")]
static PROCESS_WORLD: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

impl ProcessWorld {
    /// Starts MPI for this process (MPI_THREAD_SERIALIZED, as [`as_mpi_rank`]). An error without
    /// the `mpi` feature, or when MPI cannot start.
    pub fn start() -> Result<ProcessWorld> {
        #[cfg(feature = "mpi")]
        {
            use mpi::Threading;
            use mpi::traits::Communicator;
            let (universe, provided) = mpi::initialize_with_threading(Threading::Serialized)
                .ok_or_else(|| anyhow::anyhow!("MPI was already initialized in this process"))?;
            if matches!(provided, Threading::Single | Threading::Funneled) {
                bail_serialized(provided)?;
            }
            let world = universe.world();
            let (rank, size) = (world.rank() as usize, world.size() as usize);
            PROCESS_WORLD.store(true, std::sync::atomic::Ordering::SeqCst);
            Ok(ProcessWorld {
                _universe: universe,
                rank,
                size,
            })
        }
        #[cfg(not(feature = "mpi"))]
        bail!(
            "a launched point runs over MPI, but this ringbench was built without the `mpi` feature \
             (cargo build --release --features mpi)"
        )
    }

    /// Ends the whole job at once after printing `error` as this rank's (one line, so that the
    /// launcher's banner cannot split it), so that its peers do not wait for a timeout.
    pub fn abort(&self, error: &dyn std::fmt::Display) -> ! {
        say_rank_error(self.rank, error);
        #[cfg(feature = "mpi")]
        {
            use mpi::traits::Communicator;
            mpi::topology::SimpleCommunicator::world().abort(1)
        }
        #[cfg(not(feature = "mpi"))]
        std::process::exit(1)
    }
}

#[cfg(feature = "mpi")]
impl Drop for ProcessWorld {
    fn drop(&mut self) {
        PROCESS_WORLD.store(false, std::sync::atomic::Ordering::SeqCst);
    }
}

#[cfg(feature = "mpi")]
fn bail_serialized(provided: mpi::Threading) -> Result<()> {
    anyhow::bail!(
        "this MPI library provides threading level {provided:?}; ringbench needs Serialized"
    )
}

/// Whether this process holds a [`ProcessWorld`] (it is one rank of a launched job).
pub fn in_process_world() -> bool {
    #[cfg(feature = "mpi")]
    return PROCESS_WORLD.load(std::sync::atomic::Ordering::SeqCst);
    #[cfg(not(feature = "mpi"))]
    false
}

/// This process's rank among those of its job on the same machine, as the launcher says
/// (`LOCAL_RANK`, Open MPI's `OMPI_COMM_WORLD_LOCAL_RANK`, SLURM's `SLURM_LOCALID`): the GPU a
/// launched rank takes. `None` outside a launcher.
pub fn local_rank() -> Option<usize> {
    ["LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID"]
        .iter()
        .find_map(|v| std::env::var(v).ok()?.parse().ok())
}

/// The longest a launched rank waits for a peer, whatever a job asks ([`set_rank_timeout`]).
static RANK_TIMEOUT: std::sync::OnceLock<Duration> = std::sync::OnceLock::new();

/// Caps every wait of this process's ranks for a peer at `timeout`: a launched point's processes
/// wait less than the launcher's deadline, so that a silent rank is named by its peers' timeout
/// before the whole job is stopped.
pub fn set_rank_timeout(timeout: Duration) {
    let _ = RANK_TIMEOUT.set(timeout);
}

/// While a [`ProcessWorld`] is held: a communicator of every process of the job, its own (a
/// duplicate of the world, so that no message of one job can match a receive of another), made
/// after a barrier with a timeout, so that the job's ranks start together and a rank that never
/// arrives is named. `None` otherwise: the caller runs its ranks on threads.
pub fn world_comm(timeout: Duration) -> Result<Option<Comm>> {
    let timeout = RANK_TIMEOUT.get().map_or(timeout, |cap| timeout.min(*cap));
    #[cfg(feature = "mpi")]
    if PROCESS_WORLD.load(std::sync::atomic::Ordering::SeqCst) {
        use mpi::topology::SimpleCommunicator;
        use mpi::traits::Communicator;
        use workbench::transport::mpi::MpiTransport;
        // MPI's own collectives wait forever: the barrier goes through the transport's deadline
        // first, and the duplicate (collective) is made once every rank is known to be there.
        let mut arrival = Comm::new(Box::new(MpiTransport::new(
            SimpleCommunicator::world(),
            timeout,
        )));
        arrival.barrier()?;
        let own = SimpleCommunicator::world().duplicate();
        return Ok(Some(Comm::new(Box::new(MpiTransport::new(own, timeout)))));
    }
    let _ = timeout;
    Ok(None)
}

/// This process's rank while it holds a [`ProcessWorld`] (a launched point's process); `None` in a
/// process whose ranks are threads. A launched kind computes its row's local parts (baselines on
/// threads, float64 checks) on rank 0 only: the other ranks' rows are not written.
pub fn launched_rank() -> Option<usize> {
    #[cfg(feature = "mpi")]
    if in_process_world() {
        use mpi::traits::Communicator;
        return Some(mpi::topology::SimpleCommunicator::world().rank() as usize);
    }
    None
}

/// Every next-token NLL of `prompt` as `decoding` says: its ranks on threads, or, in a launched
/// point's process, this process's rank over MPI, every rank's NLLs then gathered to every process.
pub fn score_here<B: workbench::LayerBackend>(
    model: &workbench::model::Llama<B>,
    prompt: &workbench::train::Prompt,
    decoding: &workbench::train::Decoding,
) -> Result<workbench::train::Scored> {
    if let Some(comm) = world_comm(decoding.timeout)? {
        return Ok(workbench::train::score_on(comm, model, prompt, decoding)?);
    }
    Ok(workbench::train::score(model, prompt, decoding)?)
}

/// `prompts` decoded as `decoding` says: its ranks on threads, or, in a launched point's process and
/// with a KV cache, this process's rank over MPI, every rank's merge and cache bytes then gathered
/// to every process so that the result reads as the threads' does.
pub fn decode_here<B: workbench::LayerBackend>(
    model: &workbench::model::Llama<B>,
    prompts: &[workbench::train::Prompt],
    decoding: &workbench::train::Decoding,
) -> Result<workbench::train::Decoded> {
    if decoding.cache.is_some()
        && let Some(comm) = world_comm(decoding.timeout)?
    {
        let rank = comm.rank();
        let mut decoded = workbench::train::decode_on(comm, model, prompts, decoding)?;
        let mut gather = world_comm(decoding.timeout)?
            .ok_or_else(|| anyhow::anyhow!("the process world ended during a decoding"))?;
        let words = gather.all_gather_words(&[
            decoded.decode_bytes.get(rank).copied().unwrap_or(0),
            decoded.cache_bytes.get(rank).copied().unwrap_or(0),
        ])?;
        decoded.decode_bytes = words.iter().map(|w| w[0]).collect();
        decoded.cache_bytes = words.iter().map(|w| w[1]).collect();
        return Ok(decoded);
    }
    Ok(workbench::train::decode(model, prompts, decoding)?)
}
