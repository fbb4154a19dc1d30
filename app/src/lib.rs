//! Vigil daemon and CLI on top of `vigil-engine`.
//!
//! [`config`] reads the TOML configuration, [`registry`] loads models into per-model
//! [`queue`]s of execution contexts, [`http`] serves the image (`/v1`), KServe v2 (`/v2`) and
//! metrics APIs, [`cli`] implements the `vigil` subcommands and [`service`] the systemd integration.

pub mod camera;
pub mod cli;
pub mod config;
pub mod http;
pub mod queue;
pub mod registry;
pub mod service;
