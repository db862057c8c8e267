//! Datasets.
