"""Checkpoints on disk: what ``--model`` names (resolve), a first look at the path (path_check),
the weight formats that read it (formats: safetensors built in, plugins for others) and the
model's own sampling defaults (generation_defaults). Below the runner, which loads the weights,
and the tokenizer, which reads the tokenizer through the same formats; no torch at import."""
