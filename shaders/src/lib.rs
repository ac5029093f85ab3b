//! WGSL compute shaders for duet's GPU backend, with naga validation
