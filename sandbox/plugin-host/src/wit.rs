//! The WIT worlds this host serves, one module per frozen ABI folder in `sdk/wit/`
//! (Zed's layout). Today there is one, `since_v0_1_0` (`kiln:proposer@0.1.0`); a 0.2
//! adds `since_v0_2_0` beside it and [`crate::component`] picks by the plugin's
//! `kiln:abi-version`.

pub mod since_v0_1_0;
