//! `ringbench point` (hidden; the runner starts it through a launcher): one point of a spec computed
//! as this process's rank of a job of processes; rank 0 writes the point's rows.

use super::launch::{HANG_POINT, KILL_POINT, fault_here};
use crate::kinds::{self, PointContext};
use crate::mpi_rank::ProcessWorld;
use crate::results::{Record, Table};
use crate::spec::SpecText;
use anyhow::{Result, bail};
use indicatif::ProgressBar;
use std::path::PathBuf;

/// `ringbench point`'s arguments (written by [`super::launch::Launcher::launch`]).
#[derive(Debug, clap::Args)]
pub struct PointArgs {
    /// The spec file.
    pub spec: PathBuf,
    /// The point's index in the spec's plan.
    #[arg(long)]
    pub index: usize,
    /// The results directory (its results.csv holds the baselines a point reads).
    #[arg(long)]
    pub dir: PathBuf,
    /// Where rank 0 writes the point's rows (CSV).
    #[arg(long)]
    pub out: PathBuf,
    /// The settings hash the runner planned with; another spec's is refused.
    #[arg(long)]
    pub spec_hash: String,
    /// Seconds a rank waits for a peer at most (below the launcher's deadline, so that the peers
    /// of a silent rank name it).
    #[arg(long)]
    pub rank_timeout: Option<f64>,
}

/// Computes the point as this process's rank. A rank that fails prints its error and ends the job
/// at once ([`ProcessWorld::abort`]).
pub fn run_point(args: &PointArgs) -> Result<()> {
    if let Some(seconds) = args.rank_timeout.filter(|s| s.is_finite() && *s > 0.0) {
        crate::mpi_rank::set_rank_timeout(std::time::Duration::from_secs_f64(seconds));
    }
    let world = ProcessWorld::start()?;
    // A traced spec: this job's timeline, written by rank 0 beside its rows (an attention job
    // gathers every process's events there; another kind's holds rank 0's).
    let traced = SpecText::load(&args.spec)
        .and_then(|s| s.traced())
        .unwrap_or(false);
    let recorder = traced.then(workbench::trace::Recorder::new);
    if let Some(recorder) = &recorder {
        workbench::trace::install(recorder.clone());
    }
    let rows = match compute(args, &world) {
        Ok(rows) => rows,
        Err(e) => world.abort(&format!("{e:#}")),
    };
    if let (Some(recorder), 0) = (workbench::trace::uninstall().or(recorder), world.rank)
        && let Err(e) = recorder.write(&super::launch::point_trace(&args.out))
    {
        world.abort(&format!("writing the point's trace: {e}"));
    }
    if world.rank == 0
        && let Err(e) = Table::of(rows).write_csv(&args.out)
    {
        world.abort(&format!("{e:#}"));
    }
    Ok(())
}

fn compute(args: &PointArgs, world: &ProcessWorld) -> Result<Vec<Record>> {
    let spec = SpecText::load(&args.spec)?;
    let hash = spec.settings_hash();
    if hash != args.spec_hash {
        bail!(
            "{} has settings hash {hash}, not the {} the run was planned with (was it edited?)",
            args.spec.display(),
            args.spec_hash
        );
    }
    let kind = kinds::by_name(&spec.kind).map_err(|e| spec.error("", "kind", &e))?;
    let mut plan = kind.plan(&spec)?;
    let count = plan.points().len();
    if args.index >= count {
        bail!("point {} asked for; the spec has {count}", args.index);
    }
    match plan.processes(args.index) {
        Some(ranks) if ranks == world.size => {}
        Some(ranks) => bail!(
            "point {} has {ranks} ranks but the launcher started {} processes",
            args.index,
            world.size
        ),
        None => bail!(
            "point {} of kind {} does not run as processes",
            args.index,
            spec.kind
        ),
    }
    if fault_here(KILL_POINT, args.index) == Some(world.rank) {
        workbench::transport::kill_this_process();
    }
    if fault_here(HANG_POINT, args.index) == Some(world.rank) {
        loop {
            std::thread::sleep(std::time::Duration::from_secs(3600));
        }
    }
    let table = Table::read(&args.dir.join("results.csv"))?;
    let bar = ProgressBar::hidden();
    plan.compute(
        args.index,
        &PointContext {
            table: &table,
            dir: &args.dir,
            bar: &bar,
        },
    )
}
