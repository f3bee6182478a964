"""The model runner: loads a model, owns the KV pool and page table, runs the forward pass (eager
or as CUDA graphs) and samples. It executes the batches the scheduler plans."""
