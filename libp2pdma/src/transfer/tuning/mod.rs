//! How transfers are sized: the configuration, the chunk geometry AUTO
//! picks and learns per device (and caches), and the strided cost model's
//! constants.

pub mod cache;
pub mod config;
pub mod constants;
pub mod geometry;
