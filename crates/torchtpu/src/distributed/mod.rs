//! torch.distributed on tpu tensors, below its Python backend: collectives
//! as programs replicated over a group's devices ([`collective`]), and the
//! group's store serving a PJRT client that spans its processes ([`store`]).
//! This layer uses execution (a collective is a flush boundary), the runtime
//! and the IR.
pub mod collective;
pub mod store;
