//! duet's model runtime: CPU and GPU backends, KV cache, tokenizer, sampler, chat
