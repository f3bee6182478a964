"""The per-rank engine loop: admits requests, asks the scheduler for a batch, runs it on the model runner and turns the sampled tokens into outputs."""
