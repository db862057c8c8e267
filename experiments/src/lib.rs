//! The `ringbench` command line: NumPy interop, benchmarks, the experiment runner and its kinds,
//! training and evaluation.

#![warn(missing_docs)]

pub mod alloc;
pub mod attn;
pub mod backend;
pub mod bench;
pub mod comparison;
pub mod dir_lock;
pub mod exorl;
pub mod extremes;
pub mod grid_model;
pub mod hardware;
pub mod hf;
pub mod kinds;
pub mod line_retrieval;
pub mod markdown;
pub mod measure;
pub mod memory_model;
pub mod mpi_rank;
pub mod nccl_rank;
pub mod npy;
pub mod perplexity;
pub mod plot;
pub mod pretrained;
pub mod reproduce;
pub mod results;
pub mod runner;
pub mod simulator;
pub mod spec;
pub mod tile_model;
pub mod timeline;
pub mod timeline_chart;
pub mod units;
