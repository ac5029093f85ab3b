//! GGUF v3 reading and writing.
