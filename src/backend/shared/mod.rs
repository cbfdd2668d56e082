//! The infrastructure both backends share, so that each exists once:
//!
//! * [`shm`]: POSIX shared memory segments (one naming scheme, mode 0600,
//!   unlinked once every peer mapped them, stale segments of dead
//!   processes removed at start) and the control block with the abort word;
//! * [`failure`]: "first error wins" failure state and the peer abort words;
//! * [`liveness`]: local peers whose process died (they raise no abort word);
//! * [`process`]: a process's identity (pid, start time, PID namespace)
//!   and the random nonces that name segments and sockets;
//! * [`validate`]: the plan validator;
//! * [`setup`]: the communicator tag and agreement on setup stages;
//! * [`calibrate`]: inter-node costs measured at creation.

pub(crate) mod calibrate;
pub(crate) mod failure;
pub(crate) mod liveness;
pub(crate) mod process;
pub(crate) mod setup;
pub(crate) mod shm;
pub(crate) mod validate;
