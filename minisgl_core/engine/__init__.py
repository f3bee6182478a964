"""Model loading, the KV pool and its allocator, the forward pass and sampling."""
