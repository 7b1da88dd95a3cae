//! The nemesis run: many clients doing real fenced work on a shared resource while
//! faults hit the lock store and the clients, and a checker that reads the whole history and
//! proves that nothing unsafe was accepted, or shows what was.
//!
//! - [`worker`]: a client's loop (acquire, keep alive, claim-read-hold-write on the resource,
//!   release), as a process of its own (so a pause is a real `SIGSTOP`) or, for `memory://`,
//!   a task.
//! - [`resource`]: the counter rows on a PostgreSQL server no fault touches, and the log of
//!   accepted writes in the order the resource accepted them.
//! - [`fault`]: every fault; [`faults`]: the fault table, which faults hit which store and its delays,
//!   keyed by the facade's store names (the one file of nemesis that names stores).
//! - [`mod@run`]: the controller, which starts the store's servers, a pool of workers and the
//!   nemesis (the seeded fault injector), each in a module of its own that the controller
//!   alone uses.
//! - [`checker`]: the rules a run must keep, with [`delays`], each store's documented delays
//!   (rule 4's bound); [`report`] prints what it found.
#![warn(missing_docs)]

pub mod checker;
pub mod clock;
pub mod delays;
pub mod fault;
pub mod faults;
pub mod history;
mod injector;
mod pool;
pub mod report;
pub mod resource;
pub mod run;
mod servers;
pub mod store;
pub mod worker;

pub use checker::{check, Stats, Verdict, Violation};
pub use fault::Fault;
pub use faults::FaultProfile;
pub use run::{run, Options, StoreReport};
