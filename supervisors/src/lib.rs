//! OTP supervision behaviours on ractor.
//!
//! TODO crate docs
#![warn(missing_docs)]

mod child_spec;
mod dynamic;
mod error;
mod intensity;
mod lookup;
mod server;
mod shutdown;
mod supervisor;

pub use child_spec::{ChildContext, ChildSpec, Restart, StartFuture};
pub use dynamic::{
    ChildExit, DynStartFuture, DynamicSupervisor, DynamicSupervisorMsg, DynamicSupervisorRef,
};
pub use error::{BoxError, SupervisorError};
pub use intensity::Intensity;
pub use lookup::{ChildHandle, Children};
pub use server::{ExitReason, Server, start, start_linked};
pub use shutdown::Shutdown;
pub use supervisor::{Strategy, Supervisor, SupervisorMsg, SupervisorRef};
