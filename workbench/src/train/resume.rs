//! Where a training run starts and what rank 0 is shown after each step: the pieces a run that
//! outlives its sitting saves and resumes from, so that a resumed run's steps equal an uninterrupted
//! run's bit for bit (the batches and the learning rate are functions of the step; the weights and
//! AdamW's moments and step counts are saved exactly).

use burn::module::AutodiffModule;
use burn::optim::adaptor::OptimizerAdaptor;
use burn::optim::{AdamW, Optimizer};
use burn::tensor::backend::AutodiffBackend;

use super::error::TrainError;

/// The optimizer every training run steps: AdamW behind Burn's adaptor (one state per parameter).
pub type TrainOptimizer<M, B> = OptimizerAdaptor<AdamW, M, B>;

/// The optimizer's state: every parameter's AdamW moments and step count, keyed by parameter id (a
/// model loaded from a record keeps the ids it was saved with).
pub type OptimizerRecord<M, B> = <TrainOptimizer<M, B> as Optimizer<M, B>>::Record;

/// What rank 0 is shown after a step.
pub struct Snapshot<'a, B: AutodiffBackend, M: AutodiffModule<B>> {
    /// Steps done, this one included: a run resumed from here starts at this step.
    pub steps_done: usize,
    /// Whether the run stops after this step before its last (rank 0's stop request).
    pub stopping: bool,
    /// The model after the step.
    pub model: &'a M,
    /// The optimizer after the step ([`Optimizer::to_record`] gives its state).
    pub optimizer: &'a TrainOptimizer<M, B>,
}

/// Called by rank 0 after every step (to save the run); an error ends the run on every rank.
pub type AfterStep<'a, B, M> = dyn Fn(&Snapshot<'_, B, M>) -> Result<(), TrainError> + Sync + 'a;

/// Where a run starts, and who is shown each step.
pub struct Progress<'a, B: AutodiffBackend, M: AutodiffModule<B>> {
    /// Steps already done: the run's first step is this one (0: a fresh run). The model it is given
    /// is the model after these steps.
    pub start: usize,
    /// The optimizer's state after `start` steps (`None`: a fresh optimizer).
    pub optimizer: Option<OptimizerRecord<M, B>>,
    /// Shown every step on rank 0.
    pub after_step: Option<&'a AfterStep<'a, B, M>>,
}

impl<B: AutodiffBackend, M: AutodiffModule<B>> Default for Progress<'_, B, M> {
    /// A fresh run that nobody watches.
    fn default() -> Self {
        Progress {
            start: 0,
            optimizer: None,
            after_step: None,
        }
    }
}

impl<B: AutodiffBackend, M: AutodiffModule<B>> Progress<'_, B, M> {
    /// An error unless the run starts inside its `steps`.
    pub(crate) fn check(&self, steps: usize) -> Result<(), TrainError> {
        if self.start > steps {
            return Err(TrainError::StartPastEnd {
                start: self.start,
                steps,
            });
        }
        Ok(())
    }
}
