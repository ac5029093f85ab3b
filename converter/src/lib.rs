//! HF DiffLlama/Llama/DEX checkpoints to GGUF
