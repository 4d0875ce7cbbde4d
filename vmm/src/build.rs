//! Building a VM before it runs: [`resources`] gathers the pre-boot configuration that API
//! requests give a VMM started without a VM (`vmm --api-sock`), as Firecracker's `VmResources`
//! does.

pub(crate) mod devices;
pub(crate) mod early_vm;
pub(crate) mod memory;
pub mod resources;
