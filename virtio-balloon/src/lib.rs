//! virtio-balloon (in progress).
